"""`--model`, `--cluster`, `--profile`, `--global-batch`, `--seq-length` on predict and solve."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipette_cp.cli import app
from pipette_cp.cli.outputs import instance_text
from pipette_cp.clusters.generators.fat_tree import fat_tree_cluster
from pipette_cp.io.instance_file import load_instance
from pipette_cp.report.plan_file import read_plan_document

runner = CliRunner()


def run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def _cluster(tmp_path: Path) -> Path:
    path = tmp_path / "measured.yaml"
    code, out = run(
        "cluster", "generate", "degraded", "--nodes", "2", "--seed", "3", "-o", str(path)
    )
    assert code == 0, out
    return path


def _solve_on(cluster: Path, plan_path: Path) -> None:
    """``solve --model gpt3-1.3b --cluster FILE -o PLAN`` (greedy, 5 s), which must succeed."""
    code, out = run(
        "solve", "--model", "gpt3-1.3b", "--cluster", str(cluster), "--global-batch", "64",
        "--method", "greedy", "--time-limit", "5", "-o", str(plan_path),
    )  # fmt: skip
    assert code == 0, out


def test_solve_on_a_cluster_file_writes_an_instance_export_can_reload(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    plan_path = tmp_path / "plan.json"
    _solve_on(cluster, plan_path)
    plan = read_plan_document(json.loads(plan_path.read_text()))
    assert plan.instance == "plan.instance.yaml"  # next to the plan, never an absolute path
    inst = load_instance(plan_path.parent / plan.instance)
    assert inst.model.name == "gpt3-1.3b" and inst.cluster.num_gpus == 16
    assert inst.training.global_batch_size == 64 and inst.name == "gpt3-1.3b-on-measured"
    assert plan.dp * plan.pp * plan.tp <= 16
    code, out = run("export", str(plan_path), "--megatron")
    assert code == 0 and "--global-batch-size 64" in out


def test_a_solved_plan_and_its_instance_move_together(tmp_path: Path) -> None:
    """The instance refers to the cluster file relative to itself: moving the folder
    (plan, instance and cluster) keeps export working from anywhere."""
    work = tmp_path / "work"
    work.mkdir()
    cluster = _cluster(work)
    plan_path = work / "plan.json"
    _solve_on(cluster, plan_path)
    text = (work / "plan.instance.yaml").read_text()
    assert str(tmp_path) not in text and str(tmp_path) not in plan_path.read_text()
    moved = tmp_path / "moved"
    work.rename(moved)
    code, out = run("export", str(moved / "plan.json"), "--megatron")
    assert code == 0 and "--global-batch-size 64" in out, out


def test_solve_checks_its_output_before_the_work_and_writes_after_it(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder" / "plan.json"
    code, out = run("solve", "gpt3-1.3b-nominal-8", "--time-limit", "5", "-o", str(missing))
    assert code == 2 and "does not exist" in out
    code, out = run("solve", "gpt3-1.3b-nominal-8", "--time-limit", "5", "-o", str(tmp_path))
    assert code == 2 and "is a directory" in out
    plan_path = tmp_path / "plan.json"
    code, out = run("solve", "gpt3-1.3b-nominal-8", "--tp", "3", "-o", str(plan_path))
    assert code != 0 and not plan_path.exists()  # a failed solve writes nothing
    assert not list(tmp_path.glob(".plan.json.*"))  # nor leaves temporary files


def test_export_refuses_another_models_instance(tmp_path: Path) -> None:
    plan_path = tmp_path / "plan.json"
    code, out = run("solve", "gpt3-1.3b-nominal-8", "--method", "greedy", "--time-limit", "5",
                    "-o", str(plan_path))  # fmt: skip
    assert code == 0, out
    other = tmp_path / "other.yaml"
    other.write_text(
        "model: gpt3-2.7b\ncluster: {gpu: A100-SXM4-80GB, num_nodes: 1, gpus_per_node: 8, "
        "nominal: true, nics_per_node: 8, nic_bandwidth_gb_per_s: 25, "
        "intra_node_bandwidth_gb_per_s: 235, inter_node_bandwidth_gb_per_s: 25}\n"
        "training: {global_batch_size: 512, seq_length: 2048}\n"
    )
    code, out = run("export", str(plan_path), "--megatron", "--instance", str(other))
    assert code == 2 and "the plan was made for gpt3-1.3b-nominal-8" in out, out


def test_predict_uses_the_measured_profile(tmp_path: Path) -> None:
    layout = ("--tp", "2", "--pp", "1", "--mb", "1", "--dp", "4", "--json")
    base = ("predict", "gpt3-1.3b-nominal-8", *layout)
    code, out = run(*base)
    assert code == 0, out
    analytic = json.loads(out)
    profile = tmp_path / "profile.json"
    # Ten times slower than any real layer, so the difference cannot be noise.
    profile.write_text(json.dumps({"entries": [
        {"tp": 2, "micro_batch_size": 1, "forward_s": 0.05, "backward_s": 0.1},
    ]}))  # fmt: skip
    code, out = run(*base, "--profile", str(profile))
    assert code == 0, out
    measured = json.loads(out)
    key = "iteration_time_s"
    assert measured[key] > 3 * analytic[key]


def test_bad_replacements_are_one_line_errors(tmp_path: Path) -> None:
    code, out = run("predict", "--cluster", str(tmp_path / "missing.yaml"))
    assert code == 2 and "no such file" in out and len(out.strip().splitlines()) == 1
    code, out = run("solve", "--model", "no-such-model", "--time-limit", "1")
    assert code == 2 and "no-such-model" in out and len(out.strip().splitlines()) == 1
    code, out = run("predict", "--seq-length", "0")
    assert code == 2 and "seq_length" in out


def test_solve_with_a_replaced_batch_writes_the_bundled_cluster_inline(tmp_path: Path) -> None:
    plan_path = tmp_path / "plan.json"
    code, out = run(
        "solve", "gpt3-1.3b-nominal-8", "--global-batch", "64", "--method", "greedy",
        "--time-limit", "5", "-o", str(plan_path),
    )  # fmt: skip
    assert code == 0, out
    inst = load_instance(tmp_path / "plan.instance.yaml")
    bundled = load_instance("gpt3-1.3b-nominal-8")
    assert inst.training.global_batch_size == 64
    assert inst.cluster.node_names == bundled.cluster.node_names
    assert (inst.cluster.matrix == bundled.cluster.matrix).all()
    code, out = run("export", str(plan_path), "--megatron")
    assert code == 0 and "--global-batch-size 64" in out


def test_an_instance_on_a_fabric_is_written_inline_and_reloads(tmp_path: Path) -> None:
    bundled = load_instance("gpt3-1.3b-nominal-8")
    cluster = fat_tree_cluster(64, seed=1, leaf_nodes=4)
    inst = bundled.model_copy(update={"cluster": cluster, "name": "on-a-fat-tree"})
    at = tmp_path / "plan.instance.yaml"
    at.write_text(instance_text(inst, at, None, None))
    again = load_instance(at)
    assert again.cluster.fabric == cluster.fabric
    assert again.cluster.node_names == cluster.node_names


def test_written_files_follow_the_umask(tmp_path) -> None:
    """A plan or instance file is written as a plain write would make it (0666 less the
    umask), not with the temporary file's 0600."""
    import os
    import stat

    from pipette_cp.cli.outputs import write_atomically

    old = os.umask(0o022)
    try:
        write_atomically(tmp_path / "plan.json", "{}")
        os.umask(0o077)
        write_atomically(tmp_path / "private.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "plan.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "private.json").stat().st_mode) == 0o600
    assert (tmp_path / "plan.json").read_text() == "{}"


def test_predict_exits_3_for_a_layout_that_does_not_fit() -> None:
    """The prediction is printed, the verdict goes to stderr, the exit code says it."""
    from typer.testing import CliRunner

    from pipette_cp.cli import app

    result = CliRunner().invoke(app, ["predict", "gpt3-1.3b-nominal-8", "--tp", "1", "--pp", "1",
                                      "--mb", "64", "--json"])  # fmt: skip
    assert result.exit_code == 3
    assert '"fits": false' in result.stdout
    assert "does not fit: stage 0 needs" in result.stderr
    fits = CliRunner().invoke(app, ["predict", "gpt3-1.3b-nominal-8", "--tp", "1", "--pp", "1",
                                    "--mb", "1"])  # fmt: skip
    assert fits.exit_code == 0, fits.output


@pytest.mark.slow
def test_a_piped_solve_reports_progress_in_lines() -> None:
    """stderr no terminal (a pipe, a log): each phase and each new best plan is a line."""
    from typer.testing import CliRunner

    from pipette_cp.cli import app

    result = CliRunner().invoke(app, ["solve", "gpt3-1.3b-nominal-8", "--time-limit", "5"])
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert any("scoring:" in line and "to do" in line for line in lines), result.stderr
    best = [line for line in lines if "best: dp" in line]
    assert best and best[0].startswith("["), result.stderr
    # the gap, labelled, once the search has a lower bound (else said to be unknown)
    assert all("(search gap " in line for line in best)
