"""``--deterministic``: the search budgeted by work, not wall time, gives the same plans
bit for bit across runs, for any ``jobs``, and on a slower machine."""

from __future__ import annotations

import json
import time

import pytest
from ortools.sat.python import cp_model
from typer.testing import CliRunner

from pipette_cp.checker import check_plan
from pipette_cp.cli import app
from pipette_cp.errors import SpecError
from pipette_cp.io.instance_file import instance_from_mapping, load_instance
from pipette_cp.search import search
from pipette_cp.search.executors import workers
from pipette_cp.search.options import SearchOptions
from pipette_cp.solvers import work_meter as work

#: small bundled instances; budgets of a few reference seconds
SMALL = "gpt3-1.3b-g5-16"
BUDGET_S = 3.0

runner = CliRunner()


def _dump(result) -> list[str]:
    """Every returned plan, bit for bit (its JSON: split, placement, evaluation, solve info)."""
    return [plan.model_dump_json() for plan in result.plans]


@pytest.fixture(scope="module")
def small():
    return load_instance(SMALL)


@pytest.fixture(scope="module")
def first(small):
    return search(small, SearchOptions(time_limit_s=BUDGET_S, jobs=1, deterministic=True))


@pytest.mark.slow
def test_two_runs_give_the_same_plans(small, first) -> None:
    again = search(small, SearchOptions(time_limit_s=BUDGET_S, jobs=1, deterministic=True))
    assert _dump(again) == _dump(first)
    assert again.stats.solved == first.stats.solved
    assert any(note.startswith("deterministic: 3 reference s") for note in again.stats.notes)


@pytest.mark.slow
def test_one_and_two_workers_give_the_same_plans(small, first) -> None:
    parallel = search(small, SearchOptions(time_limit_s=BUDGET_S, jobs=2, deterministic=True))
    assert _dump(parallel) == _dump(first)
    s, p = first.stats, parallel.stats
    assert (p.solved, p.pruned_bound, p.skipped_budget) == (s.solved, s.pruned_bound,
                                                             s.skipped_budget)  # fmt: skip


@pytest.mark.slow
def test_a_slower_machine_gives_the_same_plans(small, first, monkeypatch) -> None:
    """Every solve and greedy plan 0.15 s slower: far more wall time than the budget's
    share per solve allows, the same plans (the budget counts work, not seconds)."""
    solve, sweep = workers.solve_skeleton, workers.sweep_layouts

    def slow_solve(skeleton, options):
        time.sleep(0.15)
        return solve(skeleton, options)

    def slow_sweep(indices, options):
        time.sleep(0.02)
        return sweep(indices, options)

    monkeypatch.setattr(workers, "solve_skeleton", slow_solve)
    monkeypatch.setattr(workers, "sweep_layouts", slow_sweep)
    slowed = search(small, SearchOptions(time_limit_s=BUDGET_S, jobs=1, deterministic=True))
    assert _dump(slowed) == _dump(first)
    assert slowed.stats.wall_time_s > first.stats.wall_time_s  # it was slowed


@pytest.mark.slow
def test_another_instance_and_method_are_deterministic() -> None:
    inst = load_instance("llama-2-7b-g3-32")
    runs = [search(inst, SearchOptions(method="greedy", time_limit_s=2.0, jobs=jobs, deterministic=True))
            for jobs in (1, 2)]  # fmt: skip
    assert _dump(runs[0]) == _dump(runs[1])


def test_the_milp_methods_are_refused(small) -> None:
    with pytest.raises(SpecError, match=r"^method='milp': not deterministic"):
        search(small, SearchOptions(method="milp", time_limit_s=1.0, deterministic=True))


def test_the_meter_is_a_virtual_clock() -> None:
    outside = work.now()
    assert not work.active() and abs(outside - time.perf_counter()) < 1.0
    with work.metered(cap_s=0.5) as meter:
        start = work.now()
        assert start == work.ORIGIN_S and work.active()
        time.sleep(0.01)  # the wall clock does not move it
        assert work.now() == start
        work.spend_s(0.25)
        assert work.now() - start == 0.25 and not work.exhausted()
        with work.metered() as inner:
            work.spend(work.TICKS_PER_S // 4)
        assert inner.ticks == work.TICKS_PER_S // 4 and work.exhausted()
    assert meter.ticks == work.TICKS_PER_S // 2 and not work.active()


def test_cpsat_gets_a_deterministic_limit_under_the_meter() -> None:
    plain, metered = cp_model.CpSolver(), cp_model.CpSolver()
    work.limit(plain, 2.0, 1, 7)
    with work.metered(cap_s=1.5):
        work.limit(metered, 2.0, 3, 7)
    assert plain.parameters.max_time_in_seconds == 2.0
    p = metered.parameters
    assert p.max_deterministic_time == pytest.approx(1.5 / work.CPSAT_S_PER_DET)
    assert p.max_time_in_seconds > 1e300  # no wall-clock limit at all
    assert (p.num_workers, p.random_seed, p.interleave_search) == (3, 7, True)


@pytest.mark.slow
def test_the_cli_flag_gives_the_same_json_twice() -> None:
    args = ["solve", "gpt3-2.7b-g1-64", "--deterministic", "--time-limit", "2", "--jobs", "1",
            "--json", "--top", "2"]  # fmt: skip
    outs = [runner.invoke(app, args) for _ in range(2)]
    assert [o.exit_code for o in outs] == [0, 0], outs[0].output
    assert json.loads(outs[0].stdout) == json.loads(outs[1].stdout)
    assert "deterministic: 2 reference s of work took" in outs[0].stderr


def test_the_flag_is_in_help() -> None:
    out = runner.invoke(app, ["solve", "--help"], terminal_width=200)
    assert out.exit_code == 0
    assert "--deterministic" in out.output


@pytest.mark.parametrize(
    ("extra", "named"),
    [(["--method", "milp"], "--method='milp'"),
     (["--method", "split-milp"], "--method='split-milp'"),
     (["--snapshots", "instances/clusters"], "--deterministic=True")],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(extra, named) -> None:
    out = runner.invoke(app, ["solve", SMALL, "--deterministic", *extra])
    assert out.exit_code == 2
    lines = out.output.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], out.output


@pytest.mark.parametrize("method", ["megatron-default", "amp", "pipette-sa"])
def test_a_work_budget_gives_baselines_a_plan_on_failed_links(method: str) -> None:
    """A baseline's plan that crosses a failed pair is a failed solve, not the end of the
    search (it raised InfeasibleError out of the work-budget search)."""
    inst = instance_from_mapping({
        "name": "h2-failed", "model": "gpt3-1.3b",
        "cluster": {"generator": {"kind": "degraded", "base": "h100-multileaf", "nodes": 8,
                                  "seed": 3, "failed_fraction": 0.15}},
        "training": {"global_batch_size": 128, "seq_length": 2048},
    })  # fmt: skip
    assert inst.cluster.has_failed_pairs
    result = search(inst, SearchOptions(method=method, time_limit_s=10, deterministic=True))
    assert result.plans and check_plan(inst, result.plans[0]) == []
