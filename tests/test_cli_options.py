"""`--model`, `--cluster`, `--profile`, `--global-batch`, `--seq-length` on predict and solve."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from pipette_cp.cli import app
from pipette_cp.io.instance_file import load_instance
from pipette_cp.specs import Plan

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


def test_solve_on_a_cluster_file_writes_an_instance_export_can_reload(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    plan_path = tmp_path / "plan.json"
    code, out = run(
        "solve", "--model", "gpt3-1.3b", "--cluster", str(cluster), "--global-batch", "64",
        "--method", "greedy", "--time-limit", "5", "-o", str(plan_path),
    )  # fmt: skip
    assert code == 0, out
    plan = Plan.model_validate_json(plan_path.read_text())
    assert plan.instance is not None and plan.instance.endswith("plan.instance.yaml")
    inst = load_instance(plan.instance)
    assert inst.model.name == "gpt3-1.3b" and inst.cluster.num_gpus == 16
    assert inst.training.global_batch_size == 64 and inst.name == "gpt3-1.3b-on-measured"
    assert plan.dp * plan.pp * plan.tp <= 16
    code, out = run("export", str(plan_path), "--megatron")
    assert code == 0 and "--global-batch-size 64" in out


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
