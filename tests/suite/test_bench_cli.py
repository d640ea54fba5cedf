"""``pipette-cp bench``: the commands, and a run killed with SIGKILL that resumes."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pipette_cp import __version__
from pipette_cp.cli import app
from pipette_cp.io import instance_file
from pipette_cp.io.instance_file import instance_path, load_instance
from pipette_cp.specs import Plan
from pipette_cp.suite import BenchStore

TINY = "gpt3-1.3b-nominal-8"
runner = CliRunner()


def run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def test_bench_run_report_and_update_best_known(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = yaml.safe_load(instance_path(TINY).read_text()) | {"name": "tiny", "best_known": None}
    bundled = tmp_path / "instances"  # update-best-known writes bundled instance files only
    bundled.mkdir()
    monkeypatch.setattr(instance_file, "INSTANCES_DIR", bundled)
    (bundled / "tiny.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    instance = "tiny"
    db = str(tmp_path / "b.sqlite")
    args = ("bench", instance, "--methods", "greedy,megatron-default", "--time-limit", "5")
    code, out = run(*args, "--db", db)
    assert code == 0 and "2 jobs: 2 run, 0 already in" in out
    code, out = run(*args, "--db", db)  # `bench run` spelled out, nothing left to do
    assert code == 0 and "2 jobs: 0 run, 2 already in" in out
    code, out = run("bench", "report", "--db", db)
    assert code == 0 and f"| {instance} | nominal | 8 | 5 |" in out
    assert "no cpsat rows in the store" in out
    code, out = run("bench", "report", "--db", db, "--format", "csv")
    assert code == 0 and out.startswith("instance,family,num_gpus,time_limit_s,greedy")
    code, out = run("bench", "update-best-known", "--db", db)
    assert code == 0 and "best_known" in out
    best = load_instance(instance).best_known
    assert best is not None and best.package_version == __version__
    assert best.method in ("greedy", "megatron-default") and best.predictor == "simulator"
    code, out = run("bench", "update-best-known", "--db", db)  # nothing beats it now
    assert code == 0 and "no row of version" in out


def test_bench_bad_input_is_one_line(tmp_path: Path) -> None:
    db = str(tmp_path / "b.sqlite")
    for args, expected in [
        (("bench", TINY, "--methods", "nope", "--db", db), "unknown method"),
        (("bench", TINY, "--seeds", "a,b", "--db", db), "--seeds="),
        (("bench", "report", "--db", str(tmp_path / "none.sqlite")), "no such file"),
        (("bench", "report", "--db", db, "--format", "html"), "--format="),
        (("bench", "no-such-instance", "--db", db), "no such file or bundled instance"),
    ]:
        code, out = run(*args)
        assert code == 2, (args, out)
        assert expected in out and "Traceback" not in out


def _store_with_rows(tmp_path: Path, instances: list[str]) -> Path:
    """A store holding one solved greedy row of this version per instance name."""
    from pipette_cp.suite.jobs import BenchRow

    db = tmp_path / "b.sqlite"
    with BenchStore(db) as store:
        for name in instances:
            store.write(BenchRow(
                name, "greedy", 0, 5.0, __version__, "nominal", 8, "heuristic", 1.0,
                "2026-01-01T00:00:00+00:00", predictor="simulator", layout="dp8-pp1-tp1-mb1",
                iteration_time_s=1e-3, analytic_time_s=1e-3, fits=True, plan_json="{}",
            ))  # fmt: skip
    return db


def test_update_best_known_writes_only_bundled_instance_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store naming a file outside the instances directory (or a cluster file, or a
    link leading out) is refused with one line, and no file is written."""
    data = yaml.safe_load(instance_path(TINY).read_text()) | {"best_known": None}
    bundled = tmp_path / "instances"
    bundled.mkdir()
    monkeypatch.setattr(instance_file, "INSTANCES_DIR", bundled)
    text = yaml.safe_dump(data, sort_keys=False)
    (bundled / "mine.yaml").write_text(text)
    outside = tmp_path / "outside.yaml"
    outside.write_text(text)
    (bundled / "link.yaml").symlink_to(outside)
    (bundled / "clusters").mkdir()
    cluster = bundled / "clusters" / "c.yaml"
    cluster.write_text(
        "format: pipette-cp-cluster/1\ngpu: a100\ngpus_per_node: 1\n"
        "nominal: true\nnum_nodes: 2\ninter_node_bandwidth_gb_per_s: 10\n"
    )
    for foreign in (str(outside), "link", str(cluster)):
        db = _store_with_rows(tmp_path, ["mine", foreign])
        code, out = run("bench", "update-best-known", "--db", str(db))
        assert code == 2 and out.startswith("error: instance=") and len(out.splitlines()) == 1
        assert "update-best-known writes only bundled instance files" in out, out
        assert (bundled / "mine.yaml").read_text() == text  # nothing written
        assert outside.read_text() == text
        db.unlink()
    db = _store_with_rows(tmp_path, ["mine"])
    code, out = run("bench", "update-best-known", "--db", str(db))
    assert code == 0 and "best_known 0.001 s by greedy" in out
    assert load_instance(bundled / "mine.yaml").best_known is not None


def test_report_opens_the_store_read_only(tmp_path: Path) -> None:
    """``bench report`` changes not a byte (no journal-mode switch, no table created)
    and works on a file it may not write."""
    db = _store_with_rows(tmp_path, [TINY])
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA journal_mode=DELETE")  # what opening for writing would undo
    before = db.read_bytes()
    db.chmod(0o444)
    try:
        code, out = run("bench", "report", "--db", str(db))
    finally:
        db.chmod(0o644)
    assert code == 0 and f"| {TINY} |" in out, out
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.sqlite"]
    empty = tmp_path / "empty.sqlite"
    sqlite3.connect(empty).close()  # a SQLite file without the results table
    code, out = run("bench", "report", "--db", str(empty))
    assert code == 2 and "not a pipette-cp bench store" in out


def test_a_fifo_or_device_as_store_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.sqlite"
    os.mkfifo(fifo)
    for db, what in ((fifo, "not a regular file"), (Path("/dev/zero"), "not a regular file")):
        for args in (("bench", "report"), ("bench", TINY, "--methods", "greedy")):
            code, out = run(*args, "--db", str(db))
            assert code == 2 and what in out and "Traceback" not in out, out


# --- resume after SIGKILL -----------------------------------------------------------

#: Runs `pipette-cp bench` in this interpreter; with BENCH_TEST_BLOCK set, the
#: megatron-default solver (second job) blocks, so the run is killed mid-job.
DRIVER = """
import os, sys, time
from pipette_cp.solvers import METHODS
original = METHODS["megatron-default"]
def blocking(*args):
    if os.environ.get("BENCH_TEST_BLOCK"):
        time.sleep(600)
    return original(*args)
METHODS["megatron-default"] = blocking
from pipette_cp.cli import main
sys.argv = ["pipette-cp", "bench", *sys.argv[1:]]
main()
"""


def _committed(db: Path) -> int:
    try:
        with sqlite3.connect(db, timeout=5) as conn:
            return int(conn.execute("SELECT count(*) FROM results").fetchone()[0])
    except sqlite3.Error:  # not created yet
        return 0


def test_a_killed_run_resumes_without_duplicate_or_partial_rows(tmp_path: Path) -> None:
    db = tmp_path / "b.sqlite"
    args = [sys.executable, "-c", DRIVER, TINY, "--methods", "greedy,megatron-default,random",
            "--time-limit", "5", "--db", str(db)]  # fmt: skip
    env = os.environ | {"BENCH_TEST_BLOCK": "1"}
    first = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120  # a safety net only: the job blocks until killed
        while _committed(db) < 1 and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert first.poll() is None, first.stderr.read() if first.stderr else ""
        assert _committed(db) == 1
        os.kill(first.pid, signal.SIGKILL)
    finally:
        first.kill()
        first.wait()
    with BenchStore(db) as store:
        (greedy,) = store.rows()
    assert greedy.method == "greedy" and greedy.solved
    env.pop("BENCH_TEST_BLOCK")
    second = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert "3 jobs: 2 run, 1 already in" in second.stdout
    with sqlite3.connect(db) as conn:
        keys = conn.execute(
            "SELECT instance, method, seed, time_limit_s, version, count(*) FROM results "
            "GROUP BY instance, method, seed, time_limit_s, version"
        ).fetchall()
    assert sorted(k[1] for k in keys) == ["greedy", "megatron-default", "random"]
    assert all(k[-1] == 1 for k in keys)
    with BenchStore(db) as store:
        rows = {r.method: r for r in store.rows()}
    assert rows["greedy"] == greedy  # skipped, not run again
    for r in rows.values():  # every row whole: a plan that parses and every number set
        assert r.solved and r.plan_json is not None
        plan = Plan.model_validate_json(r.plan_json)
        assert plan.evaluation is not None and plan.layout() == r.layout
        assert None not in (r.tokens_per_s, r.mfu, r.memory_bytes_max, r.analytic_time_s)
        assert json.loads(r.plan_json)["solve_info"]["method"] == r.method
