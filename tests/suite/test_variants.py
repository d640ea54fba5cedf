"""``pipette-cp bench run --nodes/--model/--global-batch/--seq-length``: what-if variants."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from pipette_cp.cli import app
from pipette_cp.errors import SpecError
from pipette_cp.io.instance_file import instance_path
from pipette_cp.suite import BenchStore, prepare_jobs
from pipette_cp.suite.jobs import COLUMNS, Job, failed_row
from pipette_cp.suite.variants import Sweep, Variant

FILE_CLUSTER = "gpt3-1.3b-nominal-8"  # one node, an inline cluster
GENERATED = "gpt3-1.3b-g5-16"  # two nodes of a v100-cube generator
runner = CliRunner()


def run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def sweep_args(db: Path, *extra: str) -> list[str]:
    return ["bench", "run", FILE_CLUSTER, "--global-batch", "256,512",
            "--methods", "megatron-default", "--time-limit", "2", "--db", str(db), *extra]  # fmt: skip


def test_the_cross_product_and_its_names() -> None:
    sweep = Sweep(nodes=[1, 2, 1], model=["Llama-3-8B", "llama-3-8b"], global_batch=[256, 512])
    variants = sweep.variants(GENERATED)
    assert [v.name for v in variants] == [
        f"{GENERATED}+nodes=1+model=llama-3-8b+global_batch=256",
        f"{GENERATED}+nodes=1+model=llama-3-8b+global_batch=512",
        f"{GENERATED}+nodes=2+model=llama-3-8b+global_batch=256",
        f"{GENERATED}+nodes=2+model=llama-3-8b+global_batch=512",
    ]
    assert Sweep(seq_length=[4096]).variants("some/dir/my inst.yaml")[0].name == (
        "my_inst+seq_length=4096"
    )
    assert not Sweep() and Sweep().variants(GENERATED) == []
    first = variants[0]
    assert Variant.from_json(first.to_json()) == first
    assert json.loads(first.to_json()) == {
        "instance": GENERATED, "nodes": 1, "model": "Llama-3-8B", "global_batch": 256,
    }  # fmt: skip


def test_a_variant_is_built_as_asked() -> None:
    inst = Variant(GENERATED, nodes=4, global_batch=1024, seq_length=4096).build()
    assert inst.name == f"{GENERATED}+nodes=4+global_batch=1024+seq_length=4096"
    assert (inst.cluster.num_nodes, inst.cluster.num_gpus) == (4, 32)
    assert (inst.training.global_batch_size, inst.training.seq_length) == (1024, 4096)
    assert inst.training.precision == "fp16" and inst.best_known is None  # the rest is kept
    assert Variant(FILE_CLUSTER, nodes=1, model="gpt3-350m").build().model.name == "gpt3-350m"


def test_prepare_jobs_runs_the_variants_in_place_of_the_instance() -> None:
    planned = prepare_jobs(
        [GENERATED], ["greedy"], [0, 1], [None], Sweep(nodes=[1, 4], global_batch=[256])
    )
    assert [(j.instance, j.seed, j.num_gpus, j.time_limit_s) for j in planned.jobs] == [
        (f"{GENERATED}+nodes=1+global_batch=256", 0, 8, 8.0),
        (f"{GENERATED}+nodes=1+global_batch=256", 1, 8, 8.0),
        (f"{GENERATED}+nodes=4+global_batch=256", 0, 32, 8.0),
        (f"{GENERATED}+nodes=4+global_batch=256", 1, 32, 8.0),
    ]
    assert all(Variant.from_json(j.variant).name == j.instance for j in planned.jobs)
    assert dict(planned.best_known) == {}  # variants have none (and are not asked for one)


def _rows(db: Path) -> list[tuple[Any, ...]]:
    with BenchStore(db, readonly=True) as store:
        return sorted((r.instance, r.method, r.status, r.layout, r.iteration_time_s,
                       json.loads(r.variant)) for r in store.rows())  # fmt: skip


def test_a_tiny_sweep_lands_one_row_per_variant_and_resumes(tmp_path: Path) -> None:
    db = tmp_path / "b.sqlite"
    code, out = run(*sweep_args(db))
    assert code == 0, out
    assert "2 jobs: 2 run, 0 already in" in out
    rows = _rows(db)
    assert [r[0] for r in rows] == [f"{FILE_CLUSTER}+global_batch=256",
                                    f"{FILE_CLUSTER}+global_batch=512"]  # fmt: skip
    assert all(r[2] in ("heuristic", "feasible", "optimal") and r[3] for r in rows)
    assert [r[5] for r in rows] == [{"instance": FILE_CLUSTER, "global_batch": b}
                                    for b in (256, 512)]  # fmt: skip
    assert rows[0][4] < rows[1][4]  # half the batch, less time
    code, out = run(*sweep_args(db))
    assert code == 0 and "2 jobs: 0 run, 2 already in" in out
    assert _rows(db) == rows
    code, out = run(*sweep_args(db, "--seq-length", "1024"))  # new variants: new rows
    assert code == 0 and "2 jobs: 2 run, 0 already in" in out
    code, report = run("bench", "report", "--db", str(db))
    assert code == 0, report
    assert f"| {FILE_CLUSTER}+global_batch=512+seq_length=1024 | nominal | 8 |" in report
    assert "no best_known" not in report  # variants have none by design


def test_the_sweep_on_ray_gives_the_rows_of_the_local_run(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    code, out = run(*sweep_args(tmp_path / "local.sqlite"))
    assert code == 0, out
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        code, out = run(*sweep_args(tmp_path / "ray.sqlite", "--executor", "ray"))
    finally:
        ray.shutdown()
    assert code == 0 and "2 jobs: 2 run" in out, out
    assert _rows(tmp_path / "ray.sqlite") == _rows(tmp_path / "local.sqlite")


def _restricted(tmp_path: Path) -> str:
    """An instance whose layouts all use micro-batches of 4 and tp 8."""
    data = yaml.safe_load(instance_path(GENERATED).read_text())
    data.update(name="mb4", best_known=None,
                search_space={"micro_batch_size": [4], "tp": [8]})  # fmt: skip
    path = tmp_path / "mb4.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


BAD = [
    ([FILE_CLUSTER, "--nodes", "2"], "--nodes=2: gpt3-1.3b-nominal-8+nodes=2: the cluster of "
     "gpt3-1.3b-nominal-8 is not generated"),
    ([GENERATED, "--nodes", "0"], "--nodes=0: expected a positive integer"),
    ([GENERATED, "--nodes", "2,x"], "--nodes='2,x': expected comma-separated int values"),
    ([GENERATED, "--global-batch", "-8"], "--global-batch=-8: expected a positive integer"),
    ([GENERATED, "--seq-length", ","], "--seq-length=',': expected comma-separated positive"),
    ([GENERATED, "--seq-length", "4000000"], "--seq-length=4000000: gpt3-1.3b-g5-16+"
     "seq_length=4000000: Input should be less than or equal to 2097152"),
    ([GENERATED, "--model", "llama-9"], "--model='llama-9': gpt3-1.3b-g5-16+model=llama-9: "
     "no bundled model of that name"),
    ([GENERATED, "--model", ","], "--model=',': expected comma-separated model names or files"),
    (["MB4", "--global-batch", "2"], "--global-batch=2: mb4+global_batch=2: no layout of the "
     "search space splits a global batch of 2 into dp x micro-batches (dp: 1, 2; "
     "micro_batch_size: 4)"),
    (["MB4", "--model", "gpt3-125m"], "--model='gpt3-125m': mb4+model=gpt3-125m: "
     "search_space.tp=(8,): no tensor-parallel size can run"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "error"), BAD, ids=[" ".join(a[1:]) for a, _ in BAD])
def test_bad_input_is_one_line_before_any_work(tmp_path: Path, args: list[str], error: str) -> None:
    db = tmp_path / "b.sqlite"
    args = [_restricted(tmp_path) if a == "MB4" else a for a in args]
    code, out = run("bench", "run", *args, "--methods", "greedy", "--db", str(db))
    assert code == 2, out
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {error}"), out
    assert not db.exists()  # nothing ran, nothing was written


def test_a_model_file_missing_is_an_error_of_the_option(short_tmp: Path) -> None:
    with pytest.raises(SpecError, match=r"^--model=.*missing\.yaml'?: .*no such file"):
        Sweep(model=[str(short_tmp / "missing.yaml")]).variants(GENERATED)[0].build()


def _old_store(path: Path) -> None:
    """A store as written before the ``variant`` column, holding one row."""
    old = [c for c in COLUMNS if c != "variant"]
    row = failed_row(Job("x", "greedy", 0, 8.0), "infeasible", "too big")
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(f"CREATE TABLE results ({', '.join(old)}, "
                     "PRIMARY KEY (instance, method, seed, time_limit_s, version))")  # fmt: skip
        conn.execute(f"INSERT INTO results VALUES ({', '.join('?' for _ in old)})",
                     [getattr(row, c) for c in old])  # fmt: skip
        conn.execute("PRAGMA user_version=1")
    conn.close()


def test_a_store_without_the_variant_column_still_opens(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    _old_store(path)
    with BenchStore(path, readonly=True) as store:  # read-only: nothing added
        assert [(r.instance, r.variant) for r in store.rows()] == [("x", "")]
    conn = sqlite3.connect(path)
    assert "variant" not in {r[1] for r in conn.execute("PRAGMA table_info(results)")}
    conn.close()
    variant = Variant(FILE_CLUSTER, global_batch=256)
    job = Job(variant.name, "greedy", 0, 8.0, variant=variant.to_json())
    with BenchStore(path) as store:  # for writing: the column is added
        store.write(failed_row(job, "infeasible", "too big"))
        assert {(r.instance, r.variant) for r in store.rows()} == {
            ("x", ""),
            (variant.name, variant.to_json()),
        }
        assert ("x", "greedy", 0, 8.0, job.version) in store.finished()
