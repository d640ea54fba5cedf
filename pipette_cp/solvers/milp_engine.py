"""The MILP engines behind the split and placement masters: one call in, one result out.

An engine is named by ``milp_solver`` (:data:`ENGINES`): ``highs`` (HiGHS through
``highspy``, in process; the default), ``cbc`` (PuLP's bundled CBC, one process per
solve) and, when PuLP can start them, ``gurobi``, ``cplex`` and ``xpress``
(:data:`PULP_SOLVERS`: the in-process API first, else the command-line one).
:func:`solve_milp` hands every engine the same time limit, threads, relative MIP gap,
seed and warm start, and reads back one :class:`MilpResult`: status, objective, the
best proven bound (also of a solve stopped by its time limit) and the wall time.

Where the bound comes from: HiGHS ``Highs.getInfo().mip_dual_bound`` (PuLP keeps the
``highspy.Highs`` object as ``problem.solverModel``), CBC the last ``Lower bound:`` of
its log (PuLP does not return it), Gurobi ``ObjBound``, CPLEX
``solution.MIP.get_best_objective()``, Xpress ``bestbound``; the command-line variants
of the commercial engines report none, so their unfinished solves have no bound.

HiGHS counts its time limit from the start of its run, after PuLP has passed the
model in Python; :class:`_HiGHS` sets it just before the run to what is left of the
caller's limit, and passes the warm start (PuLP's HiGHS interface passes none).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import highspy
import numpy as np
import pulp

from pipette_cp.errors import SpecError

#: Engines by ``milp_solver`` name (the default first).
ENGINES = ("highs", "cbc", "gurobi", "cplex", "xpress")
#: The default engine: in process, and it honours its time limit (``python -m
#: pipette_cp.experiments.solving.milp_engines``).
DEFAULT_ENGINE = "highs"
#: PuLP's solver classes for each engine, preferred first.
PULP_SOLVERS: dict[str, tuple[str, ...]] = {
    "highs": ("HiGHS",),
    "cbc": ("COIN_CMD", "PULP_CBC_CMD"),
    "gurobi": ("GUROBI", "GUROBI_CMD"),
    "cplex": ("CPLEX_PY", "CPLEX_CMD"),
    "xpress": ("XPRESS_PY", "XPRESS"),
}
#: How the engines are called in messages.
LABELS = {"highs": "HiGHS", "cbc": "CBC", "gurobi": "Gurobi", "cplex": "CPLEX", "xpress": "Xpress"}
#: Shortest time limit worth starting each engine with, s.  CBC: process start, MPS
#: file, presolve (given 0.4 s on an 80-unit LNS neighbourhood it took 1.06 s,
#: ``python -m pipette_cp.experiments.solving.time_limits``; at 1 s on full masters of 6,144-9,248
#: terms it overran by 0.16-0.35 s with no solution).  HiGHS runs in process: at 0.05 s it
#: returns the warm start or better, at most 0.06 s late, and LNS steps under 1 s improved
#: the plans of 3 of 8 layouts that run to the 10 s default (``python -m
#: pipette_cp.experiments.solving.milp_engines --limits 0.05,0.2,1``).  The commercial engines are
#: not measured here: CBC's rule.
MIN_START_S: dict[str, float] = {"highs": 0.05, "cbc": 1.0, "gurobi": 1.0, "cplex": 1.0,
                                 "xpress": 1.0}  # fmt: skip

_LOWER = re.compile(r"Lower bound:\s+([-+0-9.eE]+)")
#: HiGHS model statuses after which its ``mip_dual_bound`` is a bound (it ran).
_HIGHS_RAN = frozenset(
    ("kOptimal", "kTimeLimit", "kInterrupt", "kIterationLimit", "kObjectiveBound",
     "kObjectiveTarget", "kSolutionLimit", "kMemoryLimit")
)  # fmt: skip
#: HiGHS's primal solution status of a run that holds a solution.
_FEASIBLE = highspy.SolutionStatus.kSolutionStatusFeasible
#: Threads of HiGHS's process-wide scheduler, once a solve has started it.
_highs_threads: list[int] = []


@dataclass(frozen=True)
class MilpResult:
    """One MILP solve, in the model's own units.

    ``status``: ``optimal`` (within the MIP gap asked for), ``feasible`` (stopped with a
    solution), ``infeasible`` or ``unknown`` (stopped without one); ``bound``: a proven
    lower bound of the optimum (minimisation), ``None`` where the engine reports none;
    ``wall_time_s``: the whole call, the model's hand-over to the engine included.
    """

    engine: str
    status: str
    objective: float | None
    bound: float | None
    wall_time_s: float

    @property
    def gap(self) -> float | None:
        """``(objective - bound) / |objective|``, None without both (0 when both are 0)."""
        if self.objective is None or self.bound is None:
            return None
        if self.objective == 0:
            return 0.0 if self.bound >= 0 else math.inf
        return max(self.objective - self.bound, 0.0) / abs(self.objective)


def check_engine(engine: str, field: str = "milp_solver") -> str:
    """``engine`` if it is one of :data:`ENGINES`, else a SpecError naming ``field``."""
    if engine not in ENGINES:
        raise SpecError(field, engine, f"unknown MILP solver; known: {', '.join(ENGINES)}")
    return engine


@functools.cache
def available_solvers() -> frozenset[str]:
    """The solvers PuLP reports available, asked once per process (asking starts every
    solver PuLP knows, Gurobi's licence check among them)."""
    return frozenset(pulp.listSolvers(onlyAvailable=True))


def pulp_solver_name(engine: str, field: str = "milp_solver") -> str:
    """The PuLP solver class that runs ``engine`` here, or a one-line SpecError naming
    ``field`` when PuLP can start none of them."""
    available = available_solvers()
    for name in PULP_SOLVERS[check_engine(engine, field)]:
        if name in available:
            return name
    label = LABELS[engine]
    why = "is not installed" if engine in ("highs", "cbc") else "is not installed or has no licence"
    hint = " (pip install highspy)" if engine == "highs" else " (PuLP cannot start it)"
    raise SpecError(field, engine, f"{label} {why}{hint}")


def require_engine(engine: str, field: str = "milp_solver") -> None:
    """Raise the SpecError of :func:`pulp_solver_name` when ``engine`` cannot run."""
    pulp_solver_name(engine, field)


def solve_milp(
    problem: pulp.LpProblem,
    engine: str = DEFAULT_ENGINE,
    *,
    time_limit_s: float,
    threads: int = 1,
    gap: float = 0.0,
    seed: int = 0,
    start: Mapping[Any, float] | None = None,
    solver_name: str | None = None,
) -> MilpResult:
    """Minimise ``problem`` with ``engine`` within ``time_limit_s`` (the whole call).

    ``start``: a warm start, values of some variables (the engine completes the rest);
    ``solver_name``: the PuLP solver class, when the caller has resolved it already
    (:func:`pulp_solver_name`).  An engine that dies (killed, or no time to start)
    gives status ``unknown``.
    """
    assert problem.sense == pulp.LpMinimize, "the bounds read back are for minimisation"
    started = time.perf_counter()
    name = solver_name or pulp_solver_name(engine)
    for var, value in (start or {}).items():
        var.setInitialValue(value)
    limit = max(time_limit_s, 0.01)
    with _cbc_log(name) as log:
        solver = _solver(name, started + limit, limit, threads, gap, seed, start, log)
        try:
            problem.solve(solver)
        except pulp.PulpSolverError:
            return MilpResult(engine, "unknown", None, None, time.perf_counter() - started)
        wall = time.perf_counter() - started
        bound = _bound(name, problem, log)
    status = _status(name, problem)
    if status == "infeasible":
        return MilpResult(engine, status, None, None, wall)
    objective = None
    if status in ("optimal", "feasible"):
        objective = float(pulp.value(problem.objective) or 0.0)
    if bound is not None and not math.isfinite(bound):
        bound = None
    if objective is not None:
        if status == "optimal" and bound is None:  # within the gap asked for
            bound = objective - gap * abs(objective)
        bound = None if bound is None else min(bound, objective)
    return MilpResult(engine, status, objective, bound, wall)


def _status(name: str, problem: pulp.LpProblem) -> str:
    sol = problem.sol_status
    if name == "GUROBI" and sol != pulp.LpSolutionOptimal:  # PuLP marks a timed-out
        model = problem.solverModel  # Gurobi solve "not solved" whatever it holds
        if problem.status == pulp.LpStatusInfeasible:
            return "infeasible"
        return "feasible" if model.SolCount >= 1 else "unknown"
    found = sol in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    if (
        found
        and name == "HiGHS"
        and problem.solverModel.getInfo().primal_solution_status != _FEASIBLE
    ):
        return "unknown"  # PuLP reads an interrupted run as feasible, solution or not
    if sol == pulp.LpSolutionOptimal:
        return "optimal"
    if sol == pulp.LpSolutionIntegerFeasible:
        return "feasible"
    if sol == pulp.LpSolutionInfeasible or problem.status == pulp.LpStatusInfeasible:
        return "infeasible"
    return "unknown"


def _bound(name: str, problem: pulp.LpProblem, log: str | None) -> float | None:
    """The engine's best bound of the optimum, None where it reports none."""
    model: Any = getattr(problem, "solverModel", None)
    if name == "HiGHS":  # PuLP does not pass the objective's constant to HiGHS
        if not problem.isMIP() or model.getModelStatus().name not in _HIGHS_RAN:
            return None  # an LP (no MIP bound), or it never ran: its info holds no bound
        constant = float(problem.objective.constant) if problem.objective is not None else 0.0
        return float(model.getInfo().mip_dual_bound) + constant
    if log is not None:  # CBC
        with open(log, encoding="utf-8", errors="replace") as f:
            found = _LOWER.findall(f.read())
        return float(found[-1]) if found else None
    with contextlib.suppress(Exception):  # the commercial APIs, untested without a licence
        if name == "GUROBI":
            return float(model.ObjBound)
        if name == "CPLEX_PY":
            return float(model.solution.MIP.get_best_objective())
        if name == "XPRESS_PY":
            return float(model.getAttrib("bestbound"))
    return None


def _solver(
    name: str, deadline: float, limit: float, threads: int, gap: float, seed: int,
    start: Mapping[Any, float] | None, log: str | None,
) -> pulp.LpSolver:  # fmt: skip
    common: dict[str, Any] = {"msg": False, "timeLimit": limit, "gapRel": gap}
    warm = bool(start)
    threads = max(threads, 1)
    if name == "HiGHS":
        return _HiGHS(deadline, start, threads=threads, random_seed=seed, **common)
    if name in ("COIN_CMD", "PULP_CBC_CMD"):  # PuLP's binary by COIN_CMD (PULP_CBC_CMD is
        # deprecated in PuLP 3.3)
        path = None if pulp.COIN_CMD().available() else pulp.PULP_CBC_CMD.pulp_cbc_path
        return pulp.COIN_CMD(threads=threads, warmStart=warm, logPath=log, path=path,
                             options=[f"randomCbcSeed {seed + 1}"], **common)  # fmt: skip
    if name == "GUROBI":
        return pulp.GUROBI(warmStart=warm, Threads=threads, Seed=seed, **common)
    if name == "GUROBI_CMD":
        return pulp.GUROBI_CMD(warmStart=warm, threads=threads, options=[("Seed", seed)], **common)
    if name == "CPLEX_PY":
        return pulp.CPLEX_PY(warmStart=warm, threads=threads, **common)
    if name == "CPLEX_CMD":
        return pulp.CPLEX_CMD(warmStart=warm, threads=threads,
                              options=[f"set randomseed {seed}"], **common)  # fmt: skip
    xpress = pulp.XPRESS_PY if name == "XPRESS_PY" else pulp.XPRESS
    return xpress(warmStart=warm, options=[f"THREADS={threads}", f"RANDOMSEED={seed}"], **common)


@contextlib.contextmanager
def _cbc_log(name: str) -> Iterator[str | None]:
    """A temporary log file for CBC (its bound is read there), None for the others."""
    if name not in ("COIN_CMD", "PULP_CBC_CMD"):
        yield None
        return
    handle, log = tempfile.mkstemp(suffix=".log", prefix="pipette_cbc_")
    os.close(handle)
    try:
        yield log
    finally:
        os.unlink(log)


class _HiGHS(pulp.HiGHS):
    """PuLP's HiGHS with the time limit counted from the caller's start and a warm start."""

    def __init__(self, deadline: float, start: Mapping[Any, float] | None, **options: Any):
        super().__init__(**options)
        self.deadline, self.start = deadline, start

    def createAndConfigureSolver(self, lp: pulp.LpProblem) -> None:
        _quiet_highs_banner()
        threads = int(self.threads or 1)
        if _highs_threads and _highs_threads[0] != threads:  # HiGHS refuses to run else
            highspy.Highs.resetGlobalScheduler(True)
        _highs_threads[:] = [threads]
        super().createAndConfigureSolver(lp)

    def callSolver(self, lp: pulp.LpProblem) -> None:
        model = lp.solverModel
        model.setOptionValue("time_limit", max(self.deadline - time.perf_counter(), 0.01))
        if self.start:
            pairs = [(v.index, float(x)) for v, x in self.start.items() if hasattr(v, "index")]
            index = np.array([i for i, _ in pairs], dtype=np.int32)
            model.setSolution(len(pairs), index, np.array([x for _, x in pairs]))
        super().callSolver(lp)


_banner_quiet: list[bool] = []


def _quiet_highs_banner() -> None:
    """Start HiGHS once with the process's stdout closed: its first ``Highs()`` prints a
    copyright banner on the C stdout before PuLP can switch its output off."""
    if _banner_quiet:
        return
    sys.stdout.flush()
    saved, null = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)
    _banner_quiet.append(True)
