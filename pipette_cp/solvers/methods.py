"""The exact methods ``cpsat`` and ``milp``: the layer split, then the placement.

This module composes the parts: the exact split (:mod:`pipette_cp.solvers.split`),
the exact placement (:mod:`pipette_cp.solvers.placement`) and, as its warm
starts, the heuristics of :mod:`pipette_cp.solvers.baselines`
(:class:`BaselineSeeder`).  The exact models never import the heuristics.
"""

from __future__ import annotations

import random
import time
from dataclasses import replace

import numpy as np

from pipette_cp.cost import comm
from pipette_cp.cost.evaluate import Evaluator
from pipette_cp.errors import LayoutError, PipetteError
from pipette_cp.solvers.baselines.greedy import greedy_assignments, lay_out, node_costs, walk
from pipette_cp.solvers.baselines.megatron_default import node_packed_placements
from pipette_cp.solvers.baselines.pipette_sa import pipette_sa
from pipette_cp.solvers.baselines.random_method import random_placement
from pipette_cp.solvers.options import SolveOptions
from pipette_cp.solvers.placement import PlainSeeder, solve_placement
from pipette_cp.solvers.placement.data import PlacementData
from pipette_cp.solvers.split import with_optimal_split
from pipette_cp.specs import Instance, Plan

#: Share of the time limit the layer split may use.
SPLIT_SHARE = 0.2


class BaselineSeeder(PlainSeeder):
    """Warm starts from the baselines: the plan's own placement (e.g. one solved for
    another micro-batch of the same degrees), Megatron's order and its whole-node
    permutations (two-level all-reduce), two random placements, Pipette's SA when
    given time, and the greedy walks."""

    def hint_plans(
        self, instance: Instance, plan: Plan, options: SolveOptions, sa_s: float
    ) -> list[Plan]:
        plans = super().hint_plans(instance, plan, options, sa_s)
        if plan.dp > 1:  # whole-node permutations of Megatron's order: two-level all-reduce
            packed = node_packed_placements(instance, plan, options.seed)[1:]
            plans += [plan.model_copy(update={"placement": p}) for p in packed]
        rng = random.Random(options.seed)
        for _ in range(2):
            placement = random_placement(instance.cluster, plan.dp, plan.pp, plan.tp, rng)
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
    """:func:`~pipette_cp.solvers.placement.solve_placement` warm-started by the baselines."""
    return solve_placement(instance, plan, options, backend, dp_algorithm, BaselineSeeder())


def split_then_place(
    instance: Instance, skeleton: Plan, options: SolveOptions, backend: str
) -> Plan:
    """Optimal layer split on a runnable placement, then the placement for that split.

    The split is costed on the skeleton's placement, or, when that one crosses a
    failed link, on a placement solved first for the skeleton's split."""
    started = time.perf_counter()
    total = options.time_limit_s
    plan = skeleton
    try:
        Evaluator(instance).iteration_time(plan)
    except PipetteError:
        first = replace(options, time_limit_s=SPLIT_SHARE * total)
        plan = exact_placement(instance, plan, first, backend)
    share = replace(options, time_limit_s=SPLIT_SHARE * total)
    plan = with_optimal_split(instance, plan, share, backend)  # type: ignore[arg-type]
    left = max(total - (time.perf_counter() - started), 0.2 * total)
    result = exact_placement(instance, plan, replace(options, time_limit_s=left), backend)
    assert result.solve_info is not None
    info = result.solve_info.model_copy(update={"wall_time_s": time.perf_counter() - started})
    return result.model_copy(update={"solve_info": info})


def cpsat(instance: Instance, skeleton: Plan, options: SolveOptions) -> Plan:
    """Optimal layer split, then the CP-SAT placement."""
    return split_then_place(instance, skeleton, options, "cpsat")


def milp(instance: Instance, skeleton: Plan, options: SolveOptions) -> Plan:
    """Optimal layer split, then the MILP placement (PuLP)."""
    return split_then_place(instance, skeleton, options, "milp")
