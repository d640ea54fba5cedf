"""The masters :mod:`pipette_cp.experiments.solving.milp_engines` solves: the last split and
placement masters of a CP-SAT run of Kelley's loop, rebuilt for any engine.

The split master holds every cut of :func:`~pipette_cp.solvers.split.solve.solve_split`'s
loop (the greedy trail's, those around each incumbent, one per master solution), the
cut-off at the best split and its hint; the placement master is the full one of
:func:`~pipette_cp.solvers.placement.solve.solve_placement`'s exact path (every unit on
every allowed slot, symmetry broken) with every cut of the run (at the seeds, the lower
bound and the master's solutions), the bounds and cut-off of the best placement, and
its warm start.  Each ``solve`` returns status, objective, bound (s) and the wall time
of the solve itself.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

import numpy as np

from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.errors import PipetteError
from pipette_cp.experiments.solving.placement import representative_plan
from pipette_cp.experiments.solving.time_limits import skeleton
from pipette_cp.solvers import METHODS, SolveOptions
from pipette_cp.solvers.methods import BaselineSeeder
from pipette_cp.solvers.placement.build import build_placement_data
from pipette_cp.solvers.placement.cpsat import CpSatBackend
from pipette_cp.solvers.placement.kelley import CutPool, bounds, kelley, lower_x
from pipette_cp.solvers.placement.milp import MilpBackend
from pipette_cp.solvers.placement.model import PlacementModel
from pipette_cp.solvers.placement.solve import (
    EXACT_SIZE,
    SEED_CUTS,
    master_size,
    seed_assignments,
)
from pipette_cp.solvers.split.cost import split_cost
from pipette_cp.solvers.split.cpsat import CpSatSplitBackend
from pipette_cp.solvers.split.heuristics import feasible_start, local_search
from pipette_cp.solvers.split.milp import MilpSplitBackend
from pipette_cp.solvers.split.model import SplitModel
from pipette_cp.solvers.split.solve import CHUNK_SPREAD, TOLERANCE
from pipette_cp.specs import Instance, Plan

#: Seconds the seeds' local search and the split's greedy trail may take.
SEED_S = 2.0
#: Seconds of the CP-SAT Kelley run whose last master is benchmarked.
KELLEY_S = 30.0


class SplitMaster:
    """The last split master of Kelley's loop on ``plan`` (CP-SAT, one worker, at most
    :data:`KELLEY_S`): every cut of the run, the cut-off at the best split, its hint;
    rebuilt for each engine from the same cuts."""

    def __init__(self, instance: Instance, plan: Plan) -> None:
        self.cost = cost = replace(split_cost(instance, plan), chunk_spread=CHUNK_SPREAD)
        cost.require_feasible()
        rng = np.random.default_rng(0)
        deadline = time.perf_counter() + KELLEY_S
        trail = local_search(cost, feasible_start(cost), rng,
                             deadline_s=time.perf_counter() + SEED_S)  # fmt: skip
        self.best, self.best_s = trail.split, trail.time_s
        self.cuts = [*trail.cuts, *cost.cuts_around(self.best, rng)]
        while cost.num_chunks > 1 and time.perf_counter() < deadline:
            status, _, bound, _ = self.solve("cpsat", deadline - time.perf_counter())
            sol = self.last
            if sol.split is None or status != "optimal":
                break
            value = cost.iteration_time_s(sol.split)
            if value < self.best_s:
                self.best, self.best_s = sol.split, value
                self.cuts += cost.cuts_around(self.best, rng)
            if bound is not None and self.best_s - bound <= TOLERANCE * self.best_s:
                break
            cut = cost.cut(sol.split, rng)
            if cut(sol.split) <= sol.objective_s + 0.5 * TOLERANCE * value:
                break  # cannot separate
            self.cuts.append(cut)
        self.size = cost.num_chunks * len(self.cuts)

    def solve(self, engine: str, limit_s: float) -> tuple[str, float | None, float | None, float]:
        if engine == "cpsat":
            backend: Any = CpSatSplitBackend(self.best_s, self.cost.num_layers)
        else:
            backend = MilpSplitBackend(engine=engine)
        master = SplitModel(self.cost, backend)
        for cut in self.cuts:
            master.add_iteration_time(cut)
        master.add_objective_cutoff(self.best_s)
        master.add_hint(self.best)
        started = time.perf_counter()
        self.last = sol = master.solve(limit_s)
        wall = time.perf_counter() - started
        objective = sol.objective_s if sol.split is not None else None
        return sol.status, objective, sol.bound_s if math.isfinite(sol.bound_s) else None, wall


class PlacementMaster:
    """The last full placement master of Kelley's loop on ``plan`` (CP-SAT, one worker, at
    most :data:`KELLEY_S`, from the seeds of the exact path): every cut of the run, the
    bounds and cut-off of the best placement, warm-started there."""

    def __init__(self, instance: Instance, plan: Plan) -> None:
        self.data = data = build_placement_data(instance, plan, aligned=False)
        self.size = master_size(data)
        self.best: np.ndarray | None = None
        if self.size > EXACT_SIZE:
            return
        seeder, options = BaselineSeeder(), SolveOptions()
        plans = seeder.hint_plans(instance, plan, options, 0.0)
        seeds = seed_assignments(data, plans, seeder, options, time.perf_counter() + SEED_S)
        if not seeds:
            return
        upper, best = seeds[0]
        lx = lower_x(data)
        self.pool = CutPool(data, upper_s=upper)
        self.pool.add_at(lx)
        for _, assign in seeds[:SEED_CUTS]:
            x = data.x_of(assign)
            self.pool.add_at(x)
            self.pool.add_at(lx + 0.5 * (x - lx))
        self.full = [np.flatnonzero(data.allowed[data.stage_of(u)]) for u in range(data.num_units)]
        res = kelley(data, CpSatBackend, domains=self.full, start=best, pool=self.pool,
                     deadline=time.perf_counter() + KELLEY_S)  # fmt: skip
        self.best, self.upper = res.assign, res.value_s

    def solve(self, engine: str, limit_s: float) -> tuple[str, float | None, float | None, float]:
        assert self.best is not None
        low, high = bounds(self.pool, self.upper)
        backend: Any = CpSatBackend() if engine == "cpsat" else MilpBackend(engine)
        model = PlacementModel(self.data, backend, self.full, low, high,
                               self.upper * (1 + 1e-9) + 1e-6)  # fmt: skip
        for k, (a, g) in enumerate(self.pool.cuts):
            model.add_cut(a, g, f"cut_{k}")
        model.set_hint(model.canonical(self.best))
        started = time.perf_counter()
        res = backend.solve(limit_s, 1, 0)
        wall = time.perf_counter() - started
        return res.status, res.objective_s, res.bound_s, wall


def layout_of(instance: Instance, layout: str) -> Plan | None:
    """``representative``: :func:`~pipette_cp.experiments.solving.placement.representative_plan`;
    ``bound``: the fitting layout with the smallest time lower bound, pp and dp >= 2
    (:func:`~pipette_cp.experiments.solving.time_limits.skeleton`: more units, larger masters)."""
    return representative_plan(instance) if layout == "representative" else skeleton(instance)


def runnable(instance: Instance, plan: Plan, master: PlacementMaster) -> Plan:
    """``plan`` on a placement that avoids the failed links, for the split's cost: its
    own, else the placement master's best, else the greedy method's."""
    try:
        Evaluator(instance).iteration_time(plan)
        return plan
    except PipetteError:
        pass
    if master.best is not None:
        return plan.model_copy(update={"placement": master.data.placement(master.best)})
    return METHODS["greedy"](instance, plan, SolveOptions(time_limit_s=SEED_S))
