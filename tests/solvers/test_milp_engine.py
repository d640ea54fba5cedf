"""The MILP engines (``milp_solver``): selection, the same optimum, valid bounds, the CLI."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pulp
import pytest
from typer.testing import CliRunner

import pipette_cp.cli.solve as cli_solve
from pipette_cp.cli import app
from pipette_cp.errors import InfeasibleError, SpecError
from pipette_cp.search import search
from pipette_cp.search.options import SearchOptions
from pipette_cp.solvers import METHODS, SolveOptions
from pipette_cp.solvers import milp_engine as engine_module
from pipette_cp.solvers.milp_engine import (
    DEFAULT_ENGINE,
    ENGINES,
    PULP_SOLVERS,
    MilpResult,
    available_solvers,
    check_engine,
    pulp_solver_name,
    solve_milp,
)
from pipette_cp.solvers.placement import milp as placement_milp
from pipette_cp.solvers.placement import solve_placement
from pipette_cp.solvers.split import milp as split_milp
from pipette_cp.solvers.split import solve_split
from pipette_cp.specs.layouts import make_plan
from tests.conftest import small_instance

OPEN = ("highs", "cbc")


@pytest.fixture(autouse=True)
def ask_pulp_again() -> Iterator[None]:
    """Every test sees PuLP's own answer (or its patched one), not a cached one."""
    available_solvers.cache_clear()
    yield
    available_solvers.cache_clear()


def only(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """PuLP reports exactly ``names`` as available."""
    monkeypatch.setattr(pulp, "listSolvers", lambda onlyAvailable=False: list(names))
    available_solvers.cache_clear()


def knapsack(n: int, m: int, seed: int) -> tuple[pulp.LpProblem, np.ndarray, np.ndarray, list]:
    """A multi-dimensional 0/1 knapsack as a minimisation (``-value``), its data and
    variables (n=80, m=10: about 0.5 s to the optimum, unfinished after 0.2 s)."""
    rng = np.random.default_rng(seed)
    weights, values = rng.integers(10, 100, (m, n)), rng.integers(10, 100, n)
    problem = pulp.LpProblem("knapsack", pulp.LpMinimize)
    xs = [problem.add_variable(f"x{i}", 0, 1, cat="Binary") for i in range(n)]
    problem += pulp.LpAffineExpression([(x, -float(v)) for x, v in zip(xs, values, strict=True)])
    for k in range(m):
        row = pulp.LpAffineExpression([(x, float(w)) for x, w in zip(xs, weights[k], strict=True)])
        problem += row <= float(weights[k].sum() // 2)
    return problem, weights, values, xs


# ------------------------------------------------------------------ selection


def test_default_is_highs_and_unknown_names_are_refused() -> None:
    assert DEFAULT_ENGINE == "highs" and SolveOptions().milp_solver == "highs"
    assert ENGINES == ("highs", "cbc", "gurobi", "cplex", "xpress")
    assert check_engine("cbc") == "cbc"
    with pytest.raises(SpecError) as err:
        SolveOptions(milp_solver="glpk")
    assert str(err.value) == (
        "milp_solver='glpk': unknown MILP solver; known: highs, cbc, gurobi, cplex, xpress"
    )


def test_open_engines_run_here() -> None:
    assert pulp_solver_name("highs") == "HiGHS"
    assert pulp_solver_name("cbc") in ("COIN_CMD", "PULP_CBC_CMD")


@pytest.mark.parametrize(
    ("engine", "available", "chosen"),
    [
        ("gurobi", ["HiGHS", "GUROBI", "GUROBI_CMD"], "GUROBI"),
        ("gurobi", ["GUROBI_CMD"], "GUROBI_CMD"),
        ("cplex", ["CPLEX_CMD"], "CPLEX_CMD"),
        ("cplex", ["CPLEX_CMD", "CPLEX_PY"], "CPLEX_PY"),
        ("xpress", ["XPRESS"], "XPRESS"),
        ("xpress", ["XPRESS_PY", "XPRESS"], "XPRESS_PY"),
        ("cbc", ["PULP_CBC_CMD"], "PULP_CBC_CMD"),
    ],
)
def test_commercial_engines_are_used_when_pulp_reports_them(
    monkeypatch: pytest.MonkeyPatch, engine: str, available: list[str], chosen: str
) -> None:
    only(monkeypatch, *available)
    assert pulp_solver_name(engine) == chosen


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ("gurobi", "milp_solver='gurobi': Gurobi is not installed or has no licence (PuLP cannot start it)"),
        ("cplex", "milp_solver='cplex': CPLEX is not installed or has no licence (PuLP cannot start it)"),
        ("xpress", "milp_solver='xpress': Xpress is not installed or has no licence (PuLP cannot start it)"),
        ("highs", "milp_solver='highs': HiGHS is not installed (pip install highspy)"),
    ],
)  # fmt: skip
def test_an_engine_pulp_cannot_start_is_one_line(
    monkeypatch: pytest.MonkeyPatch, engine: str, message: str
) -> None:
    only(monkeypatch, "PULP_CBC_CMD")
    with pytest.raises(SpecError) as err:
        pulp_solver_name(engine)
    assert str(err.value) == message and err.value.exit_code == 2


def test_methods_and_search_refuse_an_unavailable_engine_before_any_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    only(monkeypatch, "HiGHS", "PULP_CBC_CMD")
    inst = small_instance()
    plan = make_plan(num_layers=8, dp=2, pp=2, tp=2, micro_batch_size=1)
    options = SolveOptions(time_limit_s=5, milp_solver="cplex")
    for method in ("milp", "split-milp"):
        with pytest.raises(SpecError, match="CPLEX is not installed"):
            METHODS[method](inst, plan, options)
    with pytest.raises(SpecError, match="milp_solver='cplex'"):
        search(inst, SearchOptions(method="milp", time_limit_s=5, milp_solver="cplex"))
    METHODS["greedy"](inst, plan, options)  # the other methods never start it


def test_the_options_engine_reaches_both_masters(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str]] = []

    def spy(where: str) -> Any:
        def solve(problem: pulp.LpProblem, engine: str, **kw: Any) -> MilpResult:
            seen.append((where, engine))
            return solve_milp(problem, engine, **kw)

        return solve

    monkeypatch.setattr(split_milp, "solve_milp", spy("split"))
    monkeypatch.setattr(placement_milp, "solve_milp", spy("placement"))
    inst = small_instance(nodes=3, global_batch_size=12)
    plan = make_plan(num_layers=8, dp=3, pp=2, tp=2, micro_batch_size=1)
    METHODS["milp"](inst, plan, SolveOptions(time_limit_s=10, milp_solver="cbc"))
    assert {where for where, _ in seen} == {"split", "placement"}
    assert {engine for _, engine in seen} == {"cbc"}


@pytest.mark.parametrize("name", [n for names in PULP_SOLVERS.values() for n in names])
def test_every_engine_is_handed_the_same_limit_gap_threads_and_start(name: str) -> None:
    solver = engine_module._solver(name, 0.0, 7.5, 3, 0.01, 4, {"x": 1}, None)
    assert solver.timeLimit in (7.5, -7.5)  # PuLP's Xpress negates it: stop without a solution
    gap = getattr(solver, "gapRel", None) or solver.optionsDict.get("gapRel")
    assert gap == 0.01 and solver.msg is False
    threads = getattr(solver, "threads", None) or solver.optionsDict.get("threads")
    options = [str(o) for o in getattr(solver, "options", []) or []]
    given = {**getattr(solver, "solver_params", {}), **getattr(solver, "optionsDict", {})}
    assert threads == 3 or given.get("Threads") == 3 or "THREADS=3" in options
    assert given.get("warmStart") or isinstance(solver, engine_module._HiGHS)


# ------------------------------------------------------------------ the same answers


def test_highs_and_cbc_agree_with_brute_force_on_a_tiny_milp() -> None:
    _, weights, values, _ = knapsack(14, 3, seed=5)
    points = np.array(list(itertools.product((0, 1), repeat=14)))
    fits = (points @ weights.T <= weights.sum(axis=1) // 2).all(axis=1)
    best = -float((points[fits] @ values).max())
    for engine in OPEN:
        problem, *_ = knapsack(14, 3, seed=5)
        res = solve_milp(problem, engine, time_limit_s=30)
        assert res.status == "optimal" and res.objective == pytest.approx(best)
        assert res.bound == pytest.approx(best) and res.gap == pytest.approx(0.0)


@pytest.mark.parametrize("vpp", [1, 2])
def test_highs_and_cbc_give_the_same_split(vpp: int) -> None:
    inst = small_instance(nodes=2, gpus_per_node=4, layers=16)
    plan = make_plan(num_layers=16, dp=1, pp=4, tp=2, vpp=vpp, micro_batch_size=1)
    found = {e: solve_split(inst, plan, SolveOptions(time_limit_s=20, milp_solver=e), "milp")
             for e in OPEN}  # fmt: skip
    for result in found.values():
        assert result.status == "optimal" and result.bound_s is not None
    highs, cbc = found["highs"], found["cbc"]
    assert highs.objective_s == pytest.approx(cbc.objective_s, rel=1e-9)


def test_highs_and_cbc_give_the_same_placement() -> None:
    rng = np.random.default_rng(3)
    matrix = 20e9 * rng.lognormal(0.0, 0.3, (3, 3))
    np.fill_diagonal(matrix, 0.0)
    inst = small_instance(nodes=3, node_bandwidth=matrix, global_batch_size=12)
    plan = make_plan(num_layers=8, dp=3, pp=2, tp=2, micro_batch_size=1)
    objectives = {}
    for engine in OPEN:
        placed = solve_placement(inst, plan, SolveOptions(time_limit_s=20, milp_solver=engine),
                                 backend="milp", dp_algorithm="ring")  # fmt: skip
        info = placed.solve_info
        assert info is not None and info.status == "optimal"
        objectives[engine] = info.objective
    assert objectives["highs"] == pytest.approx(objectives["cbc"], rel=1e-6)


# ------------------------------------------------------------------ bounds


@pytest.mark.slow
@pytest.mark.parametrize(("engine", "limit_s"), [("highs", 0.2), ("cbc", 0.3)])
def test_an_interrupted_solve_reports_a_valid_bound(engine: str, limit_s: float) -> None:
    """The other engine, solved to optimality, is the oracle."""
    problem, *_ = knapsack(80, 10, seed=1)
    other = "cbc" if engine == "highs" else "highs"
    oracle, *_ = knapsack(80, 10, seed=1)
    optimum = solve_milp(oracle, other, time_limit_s=120)
    assert optimum.status == "optimal" and optimum.objective is not None
    res = solve_milp(problem, engine, time_limit_s=limit_s)
    assert res.status in ("optimal", "feasible", "unknown")
    if engine == "highs":  # HiGHS's mip_dual_bound is read whatever stopped it
        assert res.bound is not None
    if res.bound is not None:
        assert res.bound <= optimum.objective + 1e-6
    if res.objective is not None:
        assert res.objective >= optimum.objective - 1e-6
        assert res.bound is None or res.bound <= res.objective


def test_warm_start_and_thread_changes_keep_highs_running() -> None:
    """A start is passed on (PuLP's HiGHS passes none) and a new thread count does not
    stop HiGHS (its scheduler is reset)."""
    for threads in (1, 2, 1):
        problem, _, _, xs = knapsack(30, 5, seed=2)
        res = solve_milp(problem, "highs", time_limit_s=30, threads=threads,
                         start={x: 0 for x in xs})  # fmt: skip
        assert res.status == "optimal" and res.bound == pytest.approx(res.objective)


def test_a_model_without_integers_is_bounded_by_its_optimum() -> None:
    for engine in OPEN:
        problem = pulp.LpProblem("lp", pulp.LpMinimize)
        x = problem.add_variable("x", 1.5, 4)
        problem += pulp.LpAffineExpression([(x, 2.0)])
        res = solve_milp(problem, engine, time_limit_s=5)
        assert res.status == "optimal" and res.objective == pytest.approx(3.0)
        assert res.bound == pytest.approx(3.0)


def test_an_infeasible_model_has_no_objective_or_bound() -> None:
    for engine in OPEN:
        problem = pulp.LpProblem("none", pulp.LpMinimize)
        x = problem.add_variable("x", 0, 1, cat="Integer")
        problem += pulp.LpAffineExpression([(x, 1.0)])
        problem += pulp.LpAffineExpression([(x, 1.0)]) >= 2
        res = solve_milp(problem, engine, time_limit_s=5)
        assert (res.status, res.objective, res.bound, res.gap) == ("infeasible", None, None, None)


# ------------------------------------------------------------------ the command line

runner = CliRunner()


def lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--method", "milp", "--milp-solver", "bogus"],
         "error: --milp-solver='bogus': unknown MILP solver; known: highs, cbc, gurobi, cplex, xpress"),
        (["--milp-solver", "cbc"],
         "error: --milp-solver='cbc': applies to --method milp and split-milp only; give one"),
        (["--method", "milp", "--milp-solver", "gurobi"],
         "error: --milp-solver='gurobi': Gurobi is not installed or has no licence (PuLP cannot start it)"),
    ],
)  # fmt: skip
def test_cli_refuses_a_bad_milp_solver_in_one_line(
    monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    only(monkeypatch, "HiGHS", "PULP_CBC_CMD")
    result = runner.invoke(app, ["solve", "gpt3-1.3b-nominal-8", *args])
    assert result.exit_code == 2
    assert lines(result.output) == [message]


@pytest.mark.parametrize("engine", OPEN)
def test_cli_passes_the_milp_solver_on(monkeypatch: pytest.MonkeyPatch, engine: str) -> None:
    given: dict[str, Any] = {}

    def stop(instance: Any, options: SearchOptions) -> None:
        given["milp_solver"] = options.milp_solver
        raise InfeasibleError("stopped by the test")

    monkeypatch.setattr(cli_solve, "solve_with_options", stop)
    args = ["solve", "gpt3-1.3b-nominal-8", "--method", "milp", "--milp-solver", engine]
    result = runner.invoke(app, args)
    assert result.exit_code == 3 and given["milp_solver"] == engine
    monkeypatch.setattr(cli_solve, "solve_with_options", stop)
    assert runner.invoke(app, ["solve", "gpt3-1.3b-nominal-8"]).exit_code == 3
    assert given["milp_solver"] == DEFAULT_ENGINE


def test_highs_prints_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    """Not even the banner of its first start (``--json`` output stays JSON)."""
    engine_module._banner_quiet.clear()
    problem, *_ = knapsack(10, 2, seed=0)
    solve_milp(problem, "highs", time_limit_s=5)
    out, _ = capfd.readouterr()
    assert "HiGHS" not in out
