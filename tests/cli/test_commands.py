"""The command line: the happy paths and the bad-input catalogue (one line, no traceback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pipette_cp.cli import app
from pipette_cp.io.cluster_file import read_cluster_file
from pipette_cp.io.instance_file import DEFAULT_INSTANCE, list_instances
from tests.conftest import FIXTURES

runner = CliRunner()
FIXTURES = FIXTURES


def run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def test_list_and_show_default() -> None:
    code, out = run("list")
    assert code == 0 and f"{DEFAULT_INSTANCE}  (default)" in out
    code, out = run("show")
    assert code == 0 and "total params" in out and "healthy CV" in out


@pytest.mark.parametrize("what", ["models", "gpus", "generators"])
def test_list_catalogues(what: str) -> None:
    code, out = run("list", what)
    assert code == 0 and out.strip()


def test_list_gpus_shows_architecture_and_fp4_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipette_cp.cli.console import console

    monkeypatch.setattr(console, "width", 200)  # every column whole, whatever the terminal
    code, out = run("list", "gpus")
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if "│" in line}
    assert code == 0 and "architecture" in out and "fp4 TFLOP/s" in out
    gb300 = [cell.strip() for cell in rows["GB300-NVL72-288GB"].split("│")[1:-1]]
    assert gb300[1] == "blackwell" and gb300[5] == "15000"
    h800 = [cell.strip() for cell in rows["H800-SXM5-80GB"].split("│")[1:-1]]
    assert h800[1] == "hopper" and h800[5] == "-"


def test_generate_writes_a_loadable_cluster_file(tmp_path: Path) -> None:
    out = tmp_path / "g3.yaml"
    code, text = run(
        "cluster", "generate", "degraded", "--nodes", "6", "--seed", "3", "-o", str(out)
    )
    assert code == 0, text
    cluster = read_cluster_file(out)
    assert cluster.num_nodes == 6 and cluster.name == "g3-degraded-n6-s3"


def test_generate_timeline_writes_one_file_per_snapshot(tmp_path: Path) -> None:
    code, text = run(
        "cluster", "generate", "g6", "-n", "4", "--snapshots", "3", "-o", str(tmp_path / "t.yaml")
    )
    assert code == 0, text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t-t00.yaml", "t-t01.yaml", "t-t02.yaml"]


def test_schema_writes_the_file_formats_and_with_specs_the_api_specs(tmp_path: Path) -> None:
    code, _ = run("schema", "-o", str(tmp_path / "files"))
    assert code == 0
    written = sorted(p.name for p in (tmp_path / "files").iterdir())
    assert written == [
        f"{k}.schema.json" for k in ("cluster", "instance", "model", "plan", "profile")
    ]
    plan = json.loads((tmp_path / "files" / "plan.schema.json").read_text())
    assert "memory_gb_per_gpu_max" in plan["properties"]  # user units, as the plan file
    code, _ = run("schema", "--specs", "-o", str(tmp_path / "specs"))
    assert code == 0 and (tmp_path / "specs" / "Plan.schema.json").exists()


def _instance(tmp_path: Path, **parts: object) -> Path:
    data: dict[str, object] = {
        "model": "tiny-gpt",
        "cluster": {"generator": {"kind": "healthy-a100", "nodes": 2, "seed": 0}},
        "training": {"global_batch_size": 8, "seq_length": 256},
    }
    data.update(parts)
    path = tmp_path / "inst.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _nominal(**over: object) -> dict[str, object]:
    base: dict[str, object] = {
        "gpu": "a100",
        "num_nodes": 2,
        "gpus_per_node": 2,
        "nics_per_node": 1,
        "nic_bandwidth_gb_per_s": 25,
        "intra_node_bandwidth_gb_per_s": 200,
        "node_bandwidth_gb_per_s": [[None, 20], [20, None]],
    }
    base.update(over)
    return base


def _matrix_model(**over: object) -> dict[str, object]:
    base: dict[str, object] = {
        "name": "m",
        "num_layers": 2,
        "hidden_size": 256,
        "num_attention_heads": 8,
        "ffn_hidden_size": 1024,
        "vocab_size": 1000,
        "max_seq_length": 256,
    }
    base.update(over)
    return base


BAD_INPUTS = {
    "missing file": (None, "no such file"),
    "unknown instance": ("no-such-instance", "no such file or bundled instance"),
    "unknown GPU": ({"cluster": _nominal(gpu="R100")}, "unknown GPU"),
    "non-square matrix": (
        {"cluster": _nominal(node_bandwidth_gb_per_s=[[None, 20]])},
        "node_bandwidth_gb_per_s",
    ),
    "wrongly sized matrix": (
        {"cluster": _nominal(node_bandwidth_gb_per_s=[[None, 1, 1], [1, None, 1], [1, 1, None]])},
        "node",
    ),
    "NaN bandwidth": (
        {"cluster": _nominal(node_bandwidth_gb_per_s=[[None, ".nan"], [20, None]])},
        "nan",
    ),
    "negative bandwidth": (
        {"cluster": _nominal(node_bandwidth_gb_per_s=[[None, -5], [20, None]])},
        "[0][1]=-5: expected a finite bandwidth >= 0",
    ),
    "node with all links failed": (
        {
            "cluster": _nominal(
                num_nodes=3, node_bandwidth_gb_per_s=[[None, 0, 0], [0, None, 9], [0, 9, None]]
            )
        },
        "every inter-node link failed",
    ),
    "heads not divisible by kv heads": ({"model": _matrix_model(num_kv_heads=3)}, "num_kv_heads=3"),
    "unknown model": ({"model": "llama-9-7b"}, "llama-9-7b"),
    "bad training value": (
        {"training": {"global_batch_size": -1, "seq_length": 256}},
        "global_batch_size=-1",
    ),
    "unknown instance field": ({"trainig": {}}, "trainig"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS), ids=list(BAD_INPUTS))
def test_bad_input_is_one_line_and_exit_2(case: str, tmp_path: Path) -> None:
    parts, expected = BAD_INPUTS[case]
    if parts is None:
        target = str(tmp_path / "absent.yaml")
    elif isinstance(parts, str):
        target = parts
    else:
        target = str(_instance(tmp_path, **parts))
    code, out = run("show", target)
    assert code == 2, out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), out
    assert expected.lower() in out.lower(), out
    assert "Traceback" not in out


def test_malformed_yaml_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("model: tiny-gpt\ncluster: [unclosed\n")
    code, out = run("show", str(path))
    assert code == 2 and "malformed YAML at line" in out


def test_malformed_json(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"model": "tiny-gpt",')
    code, out = run("show", str(path))
    assert code == 2 and "malformed JSON" in out


def test_hf_config_missing_a_field(tmp_path: Path) -> None:
    config = json.loads((FIXTURES / "hf" / "meta-llama--Llama-2-7b-hf.json").read_text())
    del config["hidden_size"]
    hf = tmp_path / "config.json"
    hf.write_text(json.dumps(config))
    code, out = run("show", str(_instance(tmp_path, model={"hf_config": str(hf)})))
    assert code == 2 and "hidden_size" in out


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    result = runner.invoke(app, ["--debug", "show", str(tmp_path / "absent.yaml")])
    assert result.exception is not None and result.exit_code != 0


def test_every_bundled_instance_loads() -> None:
    from pipette_cp.io.instance_file import load_instance

    names = list_instances()
    assert len(names) >= 24
    sizes = [load_instance(n).cluster.num_gpus for n in names if "4096" not in n]
    assert min(sizes) == 8 and max(sizes) == 1024
    assert sum("4096" in n for n in names) >= 4


@pytest.mark.parametrize(
    "args",
    [
        ["nccl-tests", str(FIXTURES / "nccl" / "pairwise")],
        ["mpigraph", str(FIXTURES / "mpigraph" / "mpigraph_4nodes.txt"), "--gpu", "a100"],
        ["pipette-json", str(FIXTURES / "pipette" / "cluster_4nodes.json"), "--gpu", "a100"],
    ],
    ids=["nccl-tests", "mpigraph", "pipette-json"],
)
def test_cluster_import_round_trip(args: list[str], tmp_path: Path) -> None:
    out = tmp_path / "c.yaml"
    code, text = run("cluster", "import", *args, "-o", str(out))
    assert code == 0, text
    cluster = read_cluster_file(out)
    assert cluster.num_nodes == 4
    code, text = run("show", str(out))
    assert code == 0 and "healthy CV" in text


def test_cluster_import_csv_round_trip(tmp_path: Path) -> None:
    csv = tmp_path / "m.csv"
    csv.write_text("node,a,b,c\na,,20,20\nb,20,,10\nc,20,10,\n")
    out = tmp_path / "c.yaml"
    code, text = run(
        "cluster",
        "import",
        "csv",
        str(csv),
        "--gpu",
        "h100",
        "--gpus-per-node",
        "4",
        "-o",
        str(out),
    )
    assert code == 0, text
    cluster = read_cluster_file(out)
    assert cluster.node_names == ("a", "b", "c") and cluster.num_gpus == 12
    assert cluster.node_matrix()[1, 2] == pytest.approx(10e9)


PREDICT_KEYS = {
    "iteration_time_s",
    "tokens_per_s",
    "model_tflops_per_gpu",
    "hardware_tflops_per_gpu",
    "mfu",
    "hfu",
    "memory_gb_per_gpu_max",
    "memory_gb_by_stage",
    "fits",
    "breakdown",
}


def test_predict_json_contract() -> None:
    code, out = run(
        "predict", "--tp", "2", "--pp", "2", "--mb", "2", "--recompute", "selective", "--json"
    )
    assert code == 0, out
    data = json.loads(out)
    assert set(data) >= PREDICT_KEYS
    assert data["dp"] == 16 and len(data["memory_gb_by_stage"]) == 2
    assert sum(data["breakdown"].values()) == pytest.approx(data["iteration_time_s"], rel=1e-9)
    assert set(data["memory_breakdown_gb_by_stage"][0]) >= {"weights", "activations", "runtime"}
    assert data["fits"] is True


def test_predict_defaults_are_what_solve_tries_first() -> None:
    """Sequence parallelism on where tp > 1 (off at tp 1, where it is the same as off) and
    the distributed optimizer on; either turned off when asked."""
    layouts = {}
    for extra in ([], ["--no-sp"], ["--no-dist-opt"]):
        for tp in ("1", "2"):
            code, out = run("predict", "--tp", tp, "--pp", "1", *extra, "--json")
            assert code == 0, out
            layouts[(tp, *extra)] = json.loads(out)["layout"]
    assert layouts[("2",)].endswith("-tp2-mb1-sp-do") and layouts[("1",)].endswith("-tp1-mb1-do")
    assert layouts[("2", "--no-sp")].endswith("-tp2-mb1-do")
    assert layouts[("2", "--no-dist-opt")].endswith("-tp2-mb1-sp")


def test_predict_table_and_simulator() -> None:
    code, out = run("predict", "--tp", "2", "--pp", "2", "--predictor", "simulator")
    assert code == 0 and "simulator" in out and "Memory per stage" in out


def test_predict_takes_a_placement_from_a_plan_file(tmp_path: Path) -> None:
    from pipette_cp.specs.layouts import make_plan

    placement = tuple(
        reversed(make_plan(num_layers=32, dp=16, pp=2, tp=2, micro_batch_size=1).placement)
    )
    plan = make_plan(num_layers=32, dp=16, pp=2, tp=2, micro_batch_size=1, placement=placement)
    path = tmp_path / "plan.json"
    path.write_text(plan.model_dump_json())
    code, out = run("predict", "--tp", "2", "--pp", "2", "--placement", str(path), "--json")
    assert code == 0, out


PREDICT_BAD = {
    "tp does not divide heads": (["--tp", "3", "--dp", "1", "--pp", "1"], "tp"),
    "tp*pp does not divide GPUs": (["--tp", "2", "--pp", "3"], "must divide the 64 GPUs"),
    "dp*mb does not divide the batch": (
        ["--tp", "2", "--pp", "4", "--mb", "3"],
        "must divide global_batch_size=512",
    ),
    "too many GPUs": (["--tp", "8", "--pp", "2", "--dp", "8"], "128"),
    "split not covering the layers": (["--tp", "2", "--pp", "2", "--split", "10,10"], "32"),
    "split not integers": (["--tp", "2", "--pp", "2", "--split", "a,b"], "--split='a,b'"),
    "vpp without pp": (["--tp", "2", "--pp", "1", "--vpp", "2"], "vpp"),
    "zero micro-batch": (["--tp", "2", "--pp", "2", "--mb", "0"], "--mb=0"),
    "plan file with other degrees": (
        ["--tp", "4", "--pp", "2", "--placement", "PLAN"],
        "holds dp=16 pp=2 tp=2",
    ),
    "missing plan file": (
        ["--tp", "2", "--pp", "2", "--placement", "/nonexistent.json"],
        "no such file",
    ),
}


@pytest.mark.parametrize("case", list(PREDICT_BAD), ids=list(PREDICT_BAD))
def test_predict_bad_input(case: str, tmp_path: Path) -> None:
    from pipette_cp.specs.layouts import make_plan

    args, expected = PREDICT_BAD[case]
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(
        make_plan(num_layers=32, dp=16, pp=2, tp=2, micro_batch_size=1).model_dump_json()
    )
    args = [str(plan_file) if a == "PLAN" else a for a in args]
    code, out = run("predict", *args)
    assert code == 2, out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), out
    assert expected in out, out


@pytest.mark.slow
def test_solve_export_plot_round_trip(tmp_path: Path) -> None:
    plan_file = tmp_path / "plan.json"
    code, out = run(
        "solve", "gpt3-1.3b-nominal-8", "--method", "megatron-default", "--top", "3",
        "--time-limit", "20", "-o", str(plan_file),
    )  # fmt: skip
    assert code == 0, out
    assert "Top plans" in out and "layouts:" in out
    code, out = run("export", str(plan_file), "--megatron")
    assert code == 0 and "--tensor-model-parallel-size" in out, out
    code, out = run("export", str(plan_file), "--hostfile", str(tmp_path / "launch"))
    assert code == 0 and (tmp_path / "launch" / "rankfile").exists()
    code, out = run(
        "plot",
        str(plan_file),
        "--timeline",
        str(tmp_path / "t.png"),
        "--placement",
        str(tmp_path / "p.png"),
    )
    assert code == 0 and (tmp_path / "t.png").exists() and (tmp_path / "p.png").exists()


def test_solve_json_and_search_space_override() -> None:
    code, out = run(
        "solve", "gpt3-1.3b-nominal-8", "--method", "megatron-default", "--tp", "2", "--mb", "1,2", "--json",
        "--time-limit", "20",
    )  # fmt: skip
    assert code == 0, out
    plans = json.loads(out)
    assert plans and all(p["tp"] == 2 and p["micro_batch_size"] in (1, 2) for p in plans)
    assert all(p["fits"] for p in plans)
    times = [p["iteration_time_s"] for p in plans]
    assert times == sorted(times)


def test_solve_says_what_would_make_it_fit(tmp_path: Path) -> None:
    path = _instance(
        tmp_path,
        model="gpt3-13b",  # fits on 16 GPUs at maximal sharding, but not with tp <= 2
        cluster={"generator": {"kind": "v100-cube", "nodes": 2, "seed": 0}},
        training={"global_batch_size": 16, "seq_length": 2048, "flash_attention_available": False},
        search_space={"tp": [1, 2], "recompute": ["none"], "distributed_optimizer": [False]},
    )
    code, out = run("solve", str(path), "--method", "megatron-default")
    assert code == 3, out
    assert (
        "nothing fits in memory" in out
        and "GB more per GPU" in out
        and "allow --recompute full" in out
        and "time-limit" not in out
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["solve", "--method", "nope"], "unknown method"),
        (["solve", "--tp", "x"], "--tp='x'"),
        (["solve", "--mb", "0"], "micro_batch_size"),
        (["export", "/nonexistent.json"], "no such file"),
        (["plot", "/nonexistent.json"], "give at least one output file"),
    ],
)
def test_solve_export_bad_input(args: list[str], expected: str) -> None:
    code, out = run(*args)
    assert code in (2, 3), out
    assert expected in out and "Traceback" not in out


def test_show_reads_a_hugging_face_config_or_its_folder(tmp_path: Path) -> None:
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
              "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
              "num_hidden_layers": 32, "vocab_size": 128256, "rms_norm_eps": 1e-5,
              "max_position_embeddings": 8192, "tie_word_embeddings": False}  # fmt: skip
    folder = tmp_path / "llama-3-8b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    for target in (folder / "config.json", folder):
        code, out = run("show", str(target))
        assert code == 0, out
        assert "32 x 4096" in out and "8.03B" in out and "32 / 8 kv" in out
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    code, out = run("show", str(bad))
    assert code == 2 and "\n" not in out.strip()
