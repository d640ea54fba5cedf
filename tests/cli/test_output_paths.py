"""Output paths every writing command checks before its work: a missing folder, a file
where a folder belongs, a name longer than the file system takes; one line each,
naming the option, exit code 2, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipette_cp.cli import app
from pipette_cp.io.instance_file import load_instance
from pipette_cp.io.output_paths import check_output_dir, check_output_file
from pipette_cp.specs.layouts import make_plan

LONG = "x" * 300  # beyond every common file system's 255 bytes


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    """A plan of the bundled gpt3-1.3b-nominal-8 (no solve needed)."""
    inst = load_instance("gpt3-1.3b-nominal-8")
    plan = make_plan(num_layers=inst.model.num_layers, dp=8, pp=1, tp=1, micro_batch_size=1)
    path = tmp_path / "plan.json"
    path.write_text(plan.model_copy(update={"instance": "gpt3-1.3b-nominal-8"}).model_dump_json())
    return path


CASES = {
    # command (PLAN, OUT: the paths), option, what the message says
    "solve -o, missing folder": ("solve gpt3-1.3b-nominal-8 -o OUT/missing/p.json", "--out", "does not exist"),
    "solve -o, a file as folder": ("solve gpt3-1.3b-nominal-8 -o OUT/file/p.json", "--out", "is a file, not a folder"),
    "solve -o, too long": (f"solve gpt3-1.3b-nominal-8 -o OUT/{LONG}.json", "--out", "the file system takes at most"),
    "schema -o, a file": ("schema -o OUT/file", "--out", "is a file, not a folder"),
    "schema -o, too long": (f"schema -o OUT/{LONG}", "--out", "the file system takes at most"),
    "export --hostfile, a file": ("export PLAN --hostfile OUT/file", "--hostfile", "is a file, not a folder"),
    "export --hostfile, too long": (f"export PLAN --hostfile OUT/{LONG}", "--hostfile", "takes at most"),
    "plot --timeline, missing folder": ("plot PLAN --timeline OUT/missing/t.png", "--timeline", "does not exist"),
    "plot --placement, a file as folder": ("plot PLAN --placement OUT/file/p.png", "--placement", "is a file"),
    "plot --placement, too long": (f"plot PLAN --placement OUT/{LONG}.png", "--placement", "takes at most"),
    "explain --plot, a file as folder": ("explain PLAN --plot OUT/file/x.png", "--plot", "is a file"),
    "cluster generate -o, a file as folder": ("cluster generate g1 -o OUT/file/c.yaml --nodes 4", "--out", "is a file"),
    "bench report --plots, a file": ("bench report --db OUT/none.db --plots OUT/file", "--plots", "is a file"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_output_path_is_one_line(case: str, tmp_path: Path, plan_file: Path) -> None:
    command, option, says = CASES[case]
    (tmp_path / "file").write_text("not a folder")
    args = command.replace("PLAN", str(plan_file)).replace("OUT", str(tmp_path)).split()
    result = CliRunner().invoke(app, args)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith(f"error: {option}="), result.output
    assert says in lines[0]


def test_a_folder_is_made_with_its_missing_parents(tmp_path: Path) -> None:
    check_output_dir(tmp_path / "new" / "deeper", "--out")  # may be made
    result = CliRunner().invoke(app, ["schema", "-o", str(tmp_path / "new" / "deeper")])
    assert result.exit_code == 0 and (tmp_path / "new" / "deeper" / "plan.schema.json").is_file()
    check_output_file(tmp_path / "plan.json", "--out")  # a plain file in a real folder


def test_a_plan_opens_no_instance_file_outside_its_folder(tmp_path: Path, plan_file: Path) -> None:
    """A plan is no key to other files: an instance recorded elsewhere is refused unread
    (its keys and values never reach the output)."""
    import json

    secret = tmp_path.parent / f"{tmp_path.name}-secret.yaml"
    secret.write_text("api_token: hunter2\n")
    try:
        data = json.loads(plan_file.read_text())
        for record in (str(secret), f"../{secret.name}"):
            plan_file.write_text(json.dumps(data | {"instance": record}))
            result = CliRunner().invoke(app, ["export", str(plan_file)])
            assert result.exit_code == 2, result.output
            assert "error: plan.instance=" in result.output and "hunter2" not in result.output
            assert "api_token" not in result.output
    finally:
        secret.unlink()


@pytest.mark.slow
def test_solve_writes_an_instance_from_elsewhere_next_to_the_plan(tmp_path: Path) -> None:
    from pipette_cp.io.paths import INSTANCES_DIR

    source = INSTANCES_DIR / "gpt3-1.3b-nominal-8.yaml"
    out = tmp_path / "plan.json"
    solved = CliRunner().invoke(app, ["solve", str(source), "--time-limit", "5", "-o", str(out)])
    assert solved.exit_code == 0, solved.output
    assert (tmp_path / "plan.instance.yaml").is_file()
    exported = CliRunner().invoke(app, ["export", str(out), "--megatron"])
    assert exported.exit_code == 0, exported.output
