"""The exact methods ``cpsat`` and ``milp``: the layer split, then the placement.

This module composes the parts: the exact split (:mod:`pipette_cp.solvers.split`),
the exact placement (:mod:`pipette_cp.solvers.placement`) and, as its warm
starts, the heuristics of :mod:`pipette_cp.solvers.baselines`
(:class:`BaselineSeeder`).  The exact models never import the heuristics.
"""

from __future__ import annotations

import contextlib
import random
import time
from dataclasses import replace

import numpy as np

from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.cost.network import collectives as comm
from pipette_cp.errors import LayoutError, PipetteError
from pipette_cp.solvers.baselines.greedy import greedy_assignments, lay_out, node_costs, walk
from pipette_cp.solvers.baselines.megatron_default import node_packed_placements
from pipette_cp.solvers.baselines.pipette_sa import pipette_sa
from pipette_cp.solvers.baselines.random_method import random_placement
from pipette_cp.solvers.milp_engine import require_engine
from pipette_cp.solvers.options import SolveOptions
from pipette_cp.solvers.placement import PlainSeeder, solve_placement
from pipette_cp.solvers.placement.build import MAX_MASTER_PLACES, master_places
from pipette_cp.solvers.placement.data import PlacementData
from pipette_cp.solvers.placement.repair import repair_placement
from pipette_cp.solvers.split.claim_check import guard_optimal_claim
from pipette_cp.solvers.split.solve import (
    Backend,
    SplitResult,
    solve_split,
    with_optimal_split,
)
from pipette_cp.specs import Instance, Plan, SolveInfo

#: Share of the time limit the layer split may use (it returns once proven optimal,
#: usually in well under a second, leaving the rest to the placement).
SPLIT_SHARE = 0.4
#: Share of the time limit kept for re-solving the split on the placement found.
RESPLIT_SHARE = 0.1
#: Shortest re-solve of the split, s (set-up and a first master solve).
RESPLIT_MIN_S = 0.5


class BaselineSeeder(PlainSeeder):
    """Warm starts from the baselines: the plan's own placement (e.g. one solved for
    another micro-batch of the same degrees), Megatron's order and its whole-node
    permutations (two-level all-reduce), two random placements, Pipette's SA when
    given time, and the greedy walks."""

    def hint_plans(
        self, instance: Instance, plan: Plan, options: SolveOptions, sa_s: float
    ) -> list[Plan]:
        plans = super().hint_plans(instance, plan, options, sa_s)
        if plan.replicas > 1:  # whole-node permutations of Megatron's order: two-level all-reduce
            packed = node_packed_placements(instance, plan, options.seed)[1:]
            plans += [plan.model_copy(update={"placement": p}) for p in packed]
        rng = random.Random(options.seed)
        for _ in range(2):
            with contextlib.suppress(LayoutError):  # fewer groups than units
                placement = random_placement(instance.cluster, plan.replicas, plan.pp, plan.tp, rng)
                plans.append(plan.model_copy(update={"placement": placement}))
        if sa_s > 0:
            try:
                sa = pipette_sa(instance, plan, replace(options, time_limit_s=sa_s))
                plans.append(plan.model_copy(update={"placement": sa.placement}))
            except LayoutError:
                pass  # a layout Pipette cannot express
        return plans

    def assignments(self, data: PlacementData, seed: int) -> list[tuple[float, np.ndarray]]:
        return greedy_assignments(data, seed)

    def first_layout(self, data: PlacementData, rng: np.random.Generator) -> np.ndarray | None:
        return lay_out(data, walk(node_costs(data), 0, rng), ring_major=True)


def exact_placement(
    instance: Instance,
    plan: Plan,
    options: SolveOptions,
    backend: str = "cpsat",
    dp_algorithm: comm.Algorithm = "best",
) -> Plan:
    """:func:`~pipette_cp.solvers.placement.solve_placement` warm-started by the baselines;
    beyond the masters' size (:func:`~pipette_cp.solvers.placement.build.master_places`),
    the plan's placement repaired off the fabric's exceptions (no bound)."""
    if master_places(instance, plan) > MAX_MASTER_PLACES:
        return large_placement(instance, plan, backend)
    return solve_placement(instance, plan, options, backend, dp_algorithm, BaselineSeeder())


def large_placement(instance: Instance, plan: Plan, method: str) -> Plan:
    """The placement of a plan beyond the masters: its own (Megatron's order on the
    preferred nodes), repaired on a hierarchical fabric
    (:func:`~pipette_cp.solvers.placement.repair.repair_placement`); ``feasible``, no bound."""
    started = time.perf_counter()
    evaluator = Evaluator(instance, validate=False)
    placed = repair_placement(instance, plan, evaluator)
    info = SolveInfo(method=f"{method} (repair: beyond the masters' {MAX_MASTER_PLACES} places)",
                     status="feasible", objective=evaluator.iteration_time(placed),
                     wall_time_s=time.perf_counter() - started)  # fmt: skip
    return placed.model_copy(update={"solve_info": info})


def _with_split(plan: Plan, result: SplitResult) -> Plan:
    return plan.model_copy(
        update={"layer_split": result.split, "evaluation": None, "solve_info": result.solve_info()}
    )


def split_then_place(
    instance: Instance, skeleton: Plan, options: SolveOptions, backend: Backend
) -> Plan:
    """The optimal layer split on a runnable placement, the placement for that split,
    and, when the placement moved, the split again on the placement found.

    The split is costed on the skeleton's placement, or, when that one crosses a
    failed link, on a placement solved first for the skeleton's split.  The plan is
    ``optimal`` only when both claims are proven for what is returned: its split is
    optimal on its placement and its placement optimal for its split.  Otherwise it is
    ``feasible``.  ``bound`` and ``gap`` are always the placement master's for the
    returned split (None when the split changed after the placement was solved): they
    bound every placement of that split, not other splits.  Every ``optimal``
    claim is checked by :func:`~pipette_cp.solvers.split.claim_check.guard_optimal_claim`.
    A ``milp_solver`` PuLP cannot start is a SpecError before any work."""
    if backend == "milp":
        require_engine(options.milp_solver)
    started = time.perf_counter()
    total = options.time_limit_s
    deadline = started + total
    plan = skeleton
    evaluator = Evaluator(instance)
    try:
        evaluator.iteration_time(plan)
    except PipetteError:
        first = replace(options, time_limit_s=SPLIT_SHARE * total)
        plan = exact_placement(instance, plan, first, backend)
    split = solve_split(instance, plan, replace(options, time_limit_s=SPLIT_SHARE * total), backend)
    plan = _with_split(plan, split)
    left = max(deadline - time.perf_counter() - RESPLIT_SHARE * total, 0.2 * total)
    placed = exact_placement(instance, plan, replace(options, time_limit_s=left), backend)
    split_proven = split.status == "optimal" and placed.placement == plan.placement
    place_proven = placed.solve_info is not None and placed.solve_info.status == "optimal"
    objective = evaluator.iteration_time(placed)
    if placed.placement != plan.placement:  # the split was costed on another placement
        limit = max(deadline - time.perf_counter(), RESPLIT_MIN_S)
        again = solve_split(instance, placed, replace(options, time_limit_s=limit), backend)
        # optimal there: the returned split is then the re-solved one or one as fast
        split_proven = again.status == "optimal"
        moved = _with_split(placed, again)
        if again.split != placed.layer_split and evaluator.iteration_time(moved) < objective:
            placed, place_proven = moved, False  # the placement was solved for another split
            objective = evaluator.iteration_time(placed)
            placed = placed.model_copy(update={"solve_info": None})  # its bound was for that one
    info = placed.solve_info or SolveInfo(method=backend, status="feasible")
    if split_proven and place_proven:
        info = info.model_copy(update={"method": backend, "status": "optimal"})
    else:  # the placement's bound (for the returned split) stands; the plan is not proven
        info = info.model_copy(update={"method": backend, "status": "feasible"})
    info = info.model_copy(
        update={"objective": objective, "wall_time_s": time.perf_counter() - started}
    )
    result = placed.model_copy(update={"solve_info": info})
    return guard_optimal_claim(instance, result, options.constraints, evaluator)


def cpsat(instance: Instance, skeleton: Plan, options: SolveOptions) -> Plan:
    """Optimal layer split, then the CP-SAT placement."""
    return split_then_place(instance, skeleton, options, "cpsat")


def milp(instance: Instance, skeleton: Plan, options: SolveOptions) -> Plan:
    """Optimal layer split, then the MILP placement (PuLP)."""
    return split_then_place(instance, skeleton, options, "milp")


def split_cpsat(instance: Instance, skeleton: Plan, options: SolveOptions) -> Plan:
    """The skeleton's placement with the CP-SAT-optimal layer split."""
    plan = with_optimal_split(instance, skeleton, options, "cpsat")
    return guard_optimal_claim(instance, plan, options.constraints)


def split_milp(instance: Instance, skeleton: Plan, options: SolveOptions) -> Plan:
    """The skeleton's placement with the MILP-optimal layer split."""
    plan = with_optimal_split(instance, skeleton, options, "milp")
    return guard_optimal_claim(instance, plan, options.constraints)
