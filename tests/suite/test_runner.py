"""pipette_cp.suite: the store, the runner (skip on re-run), the report and best_known."""

from __future__ import annotations

import json
import math
import sqlite3
import sys
import threading
from pathlib import Path

import pytest
import yaml

from pipette_cp import __version__
from pipette_cp.errors import InputFileError, SpecError
from pipette_cp.io.instance_file import instance_path, load_instance, write_best_known
from pipette_cp.solvers import METHODS
from pipette_cp.specs import BestKnown, Plan
from pipette_cp.suite import (
    BenchRow,
    BenchStore,
    Job,
    all_flags,
    best_known_updates,
    build_report,
    flags_for,
    make_executor,
    prepare_jobs,
    run_bench,
    run_job,
    to_csv,
    to_markdown,
)
from pipette_cp.suite.jobs import CRASH, failed_row
from pipette_cp.suite.plots import write_plots

TINY = "gpt3-1.3b-nominal-8"


def row(
    instance: str = "a",
    method: str = "cpsat",
    t: float | None = 1.0,
    *,
    seed: int = 0,
    limit: float = 10.0,
    family: str = "fam",
    status: str = "feasible",
    objective: float | None = None,
    layout: str = "dp8-pp1-tp1-mb1",
    timestamp: str = "2025-01-01T00:00:00+00:00",
    gap: float | None = None,
    gpus: int = 8,
) -> BenchRow:
    """A hand-built row; ``t=None`` gives a row without a plan."""
    plan = {} if t is None else dict(
        predictor="simulator", layout=layout, iteration_time_s=t, analytic_time_s=t,
        tokens_per_s=1e5, mfu=0.4, memory_bytes_max=5e10, fits=True,
        objective=t if objective is None else objective, gap=gap, plan_json="{}",
    )  # fmt: skip
    return BenchRow(
        instance, method, seed, limit, __version__, family, gpus, status,
        wall_time_s=2.0, timestamp=timestamp, **plan,
    )  # fmt: skip


def bundled_copy(tmp_path: Path, name: str = TINY, **changes: object) -> Path:
    """A copy of a bundled instance file (with a comment line), fields changed."""
    data = yaml.safe_load(instance_path(name).read_text())
    data.pop("best_known", None)  # the bundled files carry one since the suite was run
    data.update(changes)
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text("# a comment that must survive\n" + yaml.safe_dump(data, sort_keys=False))
    return path


# --- store --------------------------------------------------------------------------


def test_store_round_trip_and_crash_rows_are_not_finished(tmp_path: Path) -> None:
    with BenchStore(tmp_path / "b.sqlite") as store:
        store.write(row("a", "cpsat", 1.5))
        store.write(failed_row(Job("b", "milp", 0, 8.0), CRASH, "boom"))
        store.write(failed_row(Job("c", "milp", 0, 8.0), "infeasible", "too big"))
        rows = {r.instance: r for r in store.rows()}
        finished = store.finished()
    assert rows["a"] == row("a", "cpsat", 1.5)  # types survive (fits is a bool again)
    assert rows["b"].status == CRASH and rows["c"].iteration_time_s is None
    assert ("a", "cpsat", 0, 10.0, __version__) in finished
    assert ("c", "milp", 0, 8.0, __version__) in finished
    assert ("b", "milp", 0, 8.0, __version__) not in finished  # a crash is retried


def test_store_replaces_a_row_with_the_same_key(tmp_path: Path) -> None:
    with BenchStore(tmp_path / "b.sqlite") as store:
        store.write(row("a", t=2.0))
        store.write(row("a", t=1.0))
        assert [r.iteration_time_s for r in store.rows()] == [1.0]


def test_store_refuses_other_files(tmp_path: Path) -> None:
    junk = tmp_path / "junk.sqlite"
    junk.write_text("not a database " * 100)
    with pytest.raises(InputFileError, match="SQLite"):
        BenchStore(junk)
    with pytest.raises(InputFileError, match="no such file"):
        BenchStore(tmp_path / "missing.sqlite", create=False)
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(InputFileError, match="schema version"):
        BenchStore(other)


def _locked(db: Path) -> sqlite3.Connection:
    """Another connection holding the store's write lock (BEGIN EXCLUSIVE)."""
    other = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN EXCLUSIVE")
    return other


def test_a_locked_store_keeps_the_row_and_writes_it_later(tmp_path: Path) -> None:
    """Another process holding the lock beyond the busy timeout: the row is kept (and
    counted as finished), written with the next one once the lock is gone."""
    db = tmp_path / "b.sqlite"
    with BenchStore(db) as store:
        store.write(row("a"))
    other = _locked(db)
    store = BenchStore(db, busy_timeout_s=0.2)  # opening needs no lock
    store.write(row("b"))  # waits 0.2 s, then keeps the row: no exception
    assert [r.instance for r in store.pending] == ["b"]
    assert ("b", "cpsat", 0, 10.0, __version__) in store.finished()
    assert sorted(r.instance for r in store.rows()) == ["a", "b"]
    other.rollback()
    other.close()
    store.write(row("c"))
    assert store.pending == ()
    store.close()
    with BenchStore(db) as again:
        assert sorted(r.instance for r in again.rows()) == ["a", "b", "c"]


def test_a_lock_released_during_the_wait_loses_nothing(tmp_path: Path) -> None:
    db = tmp_path / "b.sqlite"
    BenchStore(db).close()
    other = _locked(db)
    timer = threading.Timer(0.3, other.rollback)
    timer.start()
    with BenchStore(db, busy_timeout_s=10) as store:
        store.write(row("a"))  # waits about 0.3 s
        assert store.pending == ()
    timer.join()
    other.close()


def test_rows_still_locked_at_close_are_saved_and_written_next_time(tmp_path: Path) -> None:
    db = tmp_path / "b.sqlite"
    BenchStore(db).close()
    other = _locked(db)
    store = BenchStore(db, busy_timeout_s=0.1)
    store.write(row("a", t=2.0))
    with pytest.raises(InputFileError, match=r"locked by another process .* 1 finished rows saved"):
        store.close()
    saved = tmp_path / "b.sqlite.pending.json"
    assert saved.is_file()
    reopened = BenchStore(db, busy_timeout_s=0.1)  # still locked: the saved row stays saved
    assert [r.instance for r in reopened.pending] == ["a"]
    with pytest.raises(InputFileError, match="locked by another process"):
        reopened.close()
    assert len(json.loads(saved.read_text())) == 1  # saved once, not twice
    other.rollback()
    other.close()
    with BenchStore(db) as store:
        assert [(r.instance, r.iteration_time_s) for r in store.rows()] == [("a", 2.0)]
    assert not saved.exists()


def test_read_only_store_writes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "b.sqlite"
    with BenchStore(db) as store:
        store.write(row("a"))
    before = db.read_bytes()
    with BenchStore(db, readonly=True) as store:
        assert [r.instance for r in store.rows()] == ["a"]
        with pytest.raises(InputFileError, match="read-only"):
            store.write(row("b"))
    assert db.read_bytes() == before
    with pytest.raises(InputFileError, match="no such file"):
        BenchStore(tmp_path / "absent.sqlite", readonly=True)


# --- jobs and runner ----------------------------------------------------------------


def test_prepare_jobs_checks_methods_and_uses_default_limits() -> None:
    with pytest.raises(SpecError, match="unknown method"):
        prepare_jobs([TINY], ["nope"])
    with pytest.raises(SpecError, match="positive"):
        prepare_jobs([TINY], ["greedy"], time_limits_s=[0.0])
    planned = prepare_jobs([TINY], ["greedy", "cpsat"], seeds=[0, 1], time_limits_s=[None, 3])
    assert len(planned.jobs) == 8
    assert {j.time_limit_s for j in planned.jobs} == {8.0, 3.0}  # 8 GPUs: the 8 s floor
    assert {(j.family, j.num_gpus) for j in planned.jobs} == {("nominal", 8)}


def test_rerun_skips_finished_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"greedy": 0, "megatron-default": 0}
    for name in calls:
        original = METHODS[name]

        def counted(*args: object, _name: str = name, _original=original) -> Plan:
            calls[_name] += 1
            return _original(*args)

        monkeypatch.setitem(METHODS, name, counted)
    planned = prepare_jobs([TINY], ["greedy", "megatron-default"], time_limits_s=[5.0])
    with BenchStore(tmp_path / "b.sqlite") as store:
        first = run_bench(planned, store, make_executor())
        before = {r.key: r.timestamp for r in store.rows()}
        counted_once = dict(calls)
        second = run_bench(planned, store, make_executor())
        after = {r.key: r.timestamp for r in store.rows()}
    assert len(first.rows) == 2 and first.skipped == 0
    assert all(r.solved and r.predictor == "simulator" for r in first.rows)
    assert all(Plan.model_validate_json(r.plan_json or "").instance == TINY for r in first.rows)
    assert min(counted_once.values()) > 0
    assert second.rows == [] and second.skipped == 2
    assert calls == counted_once and after == before


def test_a_crash_row_is_run_again(tmp_path: Path) -> None:
    planned = prepare_jobs([TINY], ["megatron-default"], time_limits_s=[5.0])
    with BenchStore(tmp_path / "b.sqlite") as store:
        store.write(failed_row(planned.jobs[0], CRASH, "boom"))
        summary = run_bench(planned, store, make_executor())
        assert [r.status for r in store.rows()] == ["heuristic"]
    assert summary.skipped == 0


def test_nothing_fits_is_an_infeasible_row(tmp_path: Path) -> None:
    path = bundled_copy(tmp_path, model="gpt3-175b")
    result = run_job(Job(str(path), "greedy", 0, 5.0))
    assert result.status == "infeasible" and "nothing fits" in result.message
    assert result.iteration_time_s is None and result.plan_json is None


def test_pool_executor_runs_jobs_in_workers(tmp_path: Path) -> None:
    planned = prepare_jobs([TINY], ["megatron-default", "greedy"], time_limits_s=[5.0])
    with BenchStore(tmp_path / "b.sqlite") as store:
        summary = run_bench(planned, store, make_executor("local", 2))
        assert sorted(r.method for r in store.rows()) == ["greedy", "megatron-default"]
    assert all(r.solved for r in summary.rows)


def test_ray_missing_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(SpecError, match=r"install pipette-cp\[ray\]"):
        make_executor("ray")
    with pytest.raises(SpecError, match="--executor"):
        make_executor("slurm")
    with pytest.raises(SpecError, match="--jobs"):
        make_executor("local", 0)


# --- report -------------------------------------------------------------------------


def hand_built() -> list[BenchRow]:
    """Family f1: x (speed-ups 2 and 1.5), y (milp wins: 4, no pipette-sa); f2: z (1)."""
    return [
        row("x", "cpsat", 1.0, family="f1"),
        row("x", "cpsat", 3.0, family="f1", seed=1),  # mean over seeds: 2.0
        row("x", "megatron-default", 4.0, family="f1", status="heuristic"),
        row("x", "pipette-sa", 3.0, family="f1", status="heuristic"),
        row("x", "cpsat", 9.0, family="f1", limit=1.0),  # a smaller limit: not reported
        row("y", "cpsat", 1.0, family="f1"),
        row("y", "milp", 0.5, family="f1"),
        row("y", "megatron-default", 5.0, family="f1", status="heuristic"),
        row(
            "y",
            "megatron-default",
            2.0,
            family="f1",
            status="heuristic",
            timestamp="2025-02-01T00:00:00+00:00",
        ),  # fmt: skip  (newer: replaces 5.0)
        row("z", "cpsat", 2.0, family="f2"),
        row("z", "megatron-default", 2.0, family="f2", status="heuristic"),
        row("z", "pipette-sa", None, family="f2", status="infeasible"),
    ]


def test_report_speedups_and_geometric_means() -> None:
    report = build_report(hand_built(), {})
    lines = {line.instance: line for line in report.lines}
    assert lines["x"].times["cpsat"] == pytest.approx(2.0)
    assert lines["x"].speedups == pytest.approx({"megatron-default": 2.0, "pipette-sa": 1.5})
    assert lines["y"].best_solver == "milp"
    assert lines["y"].speedups["megatron-default"] == pytest.approx(4.0)
    assert lines["y"].speedups["pipette-sa"] is None
    assert lines["z"].outcomes["pipette-sa"] == "infeasible"
    geo = {g.group: g for g in report.geomeans}
    assert geo["f1"].speedups["megatron-default"] == pytest.approx(math.sqrt(8.0))
    assert geo["f1"].speedups["pipette-sa"] == pytest.approx(1.5)
    assert geo["f2"].speedups["megatron-default"] == pytest.approx(1.0)
    assert geo["all"].speedups["megatron-default"] == pytest.approx(2.0)  # (2*4*1)^(1/3)
    assert geo["all"].counts == {"megatron-default": 3, "pipette-sa": 1}
    markdown = to_markdown(report)
    assert "| x | f1 | 8 | 10 | 2 |" in markdown and "2.828x (2)" in markdown
    assert "infeasible" in markdown and "no best_known for 3 instance(s)" in markdown
    csv_lines = to_csv(report).splitlines()
    assert csv_lines[0].startswith("instance,family,num_gpus,time_limit_s,cpsat_iteration")
    assert csv_lines[-1].startswith("geomean,all,") and len(csv_lines) == 1 + 3 + 3


def test_report_at_a_chosen_time_limit() -> None:
    report = build_report(hand_built(), {}, time_limit_s=1.0)
    assert [line.instance for line in report.lines] == ["x"]
    assert report.lines[0].times["cpsat"] == 9.0
    assert any("no rows at time limit 1 s" in note for note in report.notes)


def test_plots_are_written(tmp_path: Path) -> None:
    later = "2025-03-01T00:00:00+00:00"  # newer than the hand-built rows of the same keys
    rows = [*hand_built(), row("x", "cpsat", 1.0, family="f1", limit=1.0, gap=0.2, timestamp=later),
            row("x", "cpsat", 1.0, family="f1", gap=0.05, timestamp=later)]  # fmt: skip
    written, skipped = write_plots(build_report(rows, {}), rows, tmp_path / "plots")
    assert sorted(p.name for p in written) == [
        "gap_vs_time_limit.png", "solve_time_vs_gpus.png", "speedup.png",
    ]  # fmt: skip
    assert skipped == [] and all(p.stat().st_size > 1000 for p in written)
    _, skipped = write_plots(build_report(hand_built(), {}), hand_built(), tmp_path / "p2")
    assert skipped and "gap_vs_time_limit.png" in skipped[0]


# --- best_known ---------------------------------------------------------------------


def best(t: float = 2.0, layout: str = "dp8-pp1-tp1-mb1") -> BestKnown:
    return BestKnown(iteration_time_s=t, method="cpsat", layout=layout,
                     predictor="simulator", analytic_time_s=t)  # fmt: skip


def test_flags_both_directions() -> None:
    faster = row("x", "greedy", 1.5, status="heuristic")
    assert [f.kind for f in flags_for(faster, best())] == ["beats-best-known"]
    bad_optimal = row("x", "cpsat", 2.5, status="optimal")
    assert [f.kind for f in flags_for(bad_optimal, best())] == ["optimal-above-best-known"]
    assert "claims optimal" in flags_for(bad_optimal, best())[0].message()
    # not flagged: another layout, within tolerance, slower without an optimal claim
    assert (
        flags_for(row("x", "cpsat", 2.5, status="optimal", layout="dp4-pp2-tp1-mb1"), best()) == []
    )
    assert flags_for(row("x", "cpsat", 2.0 * (1 + 1e-6), status="optimal"), best()) == []
    assert flags_for(row("x", "cpsat", 1.99999, status="optimal"), best()) == []
    assert flags_for(row("x", "cpsat", 3.0, status="feasible"), best()) == []
    assert flags_for(faster, None) == []  # nothing to compare with
    rows = [faster, bad_optimal, row("y", "cpsat", 1.0)]
    assert len(all_flags(rows, {"x": best(), "y": None})) == 2
    report = build_report(rows, {"x": best(), "y": None})
    assert "beats best_known: greedy" in to_markdown(report)


def test_flags_compare_the_analytic_time_across_predictors() -> None:
    other = BestKnown(iteration_time_s=2.0, method="cpsat", predictor="analytic",
                      analytic_time_s=2.0)  # fmt: skip
    faster = row("x", "greedy", 1.5, status="heuristic")  # simulator 1.5, analytic 1.5
    assert [f.kind for f in flags_for(faster, other)] == ["beats-best-known"]
    no_analytic = BestKnown(iteration_time_s=1.0, method="cpsat", predictor="analytic")
    assert flags_for(faster, no_analytic) == []


def test_best_known_updates_pick_the_fastest_fitting_plan() -> None:
    rows = [row("x", "cpsat", 1.8), row("x", "greedy", 1.7, status="heuristic"),
            row("x", "amp", None, status="infeasible"), row("y", "cpsat", 3.0)]  # fmt: skip
    updates = best_known_updates(rows, {"x": best(2.0), "y": best(1.0)}, __version__)
    assert list(updates) == ["x"]  # y's best_known is better than any row
    assert updates["x"].method == "greedy" and updates["x"].iteration_time_s == 1.7
    assert updates["x"].date == "2025-01-01" and updates["x"].package_version == __version__
    assert best_known_updates(rows, {}, "0.0.0-other") == {}


def _without_entry(text: str) -> str:
    """The text with the ``best_known:`` line and its indented lines removed."""
    out, inside = [], False
    for line in text.splitlines(keepends=True):
        if line.startswith("best_known:"):
            inside = True
        elif inside and line.startswith(" "):
            continue
        else:
            inside = False
            out.append(line)
    return "".join(out)


def test_write_best_known_keeps_the_rest_of_the_file(tmp_path: Path) -> None:
    path = bundled_copy(tmp_path)
    lines = path.read_text().replace("best_known: null\n", "").splitlines(keepends=True)
    middle = next(i for i, line in enumerate(lines) if line.startswith("model:"))
    path.write_text("".join([*lines[:middle], "best_known: null\n", *lines[middle:]]))
    rest = _without_entry(path.read_text())
    assert rest.startswith("# a comment that must survive")
    write_best_known(path, best(1.25))
    assert _without_entry(path.read_text()) == rest
    assert load_instance(path).best_known == best(1.25)
    write_best_known(path, best(1.0, layout="dp4-pp2-tp1-mb1"))  # replaces a block entry
    assert _without_entry(path.read_text()) == rest
    assert load_instance(path).best_known == best(1.0, layout="dp4-pp2-tp1-mb1")
    assert path.read_text().count("best_known:") == 1
    missing = tmp_path / "missing.yaml"
    missing.write_text(rest)
    write_best_known(missing, best(3.0))  # appended
    assert _without_entry(missing.read_text()) == rest
    assert load_instance(missing).best_known == best(3.0)
