"""Greedy placement: walk the cluster along its fastest links and lay the units on it.

A seeded nearest-neighbour walk over the nodes (each step to the unvisited
node whose link, in both directions, is fastest; failed pairs last) gives a
sequence of places in which neighbours are well connected; the units are laid
on it in pipeline-major order (the stages of one replica next to each other,
so pipeline hops use the walk's links or stay inside a node) or in ring-major
order (the replicas of one stage next to each other, Megatron's tp-dp-pp
order, so DP rings do).  Every (start, order) candidate is scored with the
placement model (:mod:`pipette_cp.solvers.placement.data`) and the best is
kept.  Layer split: the skeleton's.  It is the cheap seed of the exact
methods and of the large-cluster search (:mod:`pipette_cp.solvers.placement.lns`).
"""

from __future__ import annotations

import time

import numpy as np

from pipette_cp.checker import check_plan
from pipette_cp.errors import InfeasibleError
from pipette_cp.solvers.baselines.common import best_of, finish_plan
from pipette_cp.solvers.baselines.megatron_default import node_packed_placements
from pipette_cp.solvers.options import SolveOptions
from pipette_cp.solvers.placement.build import (
    MAX_MASTER_PLACES,
    build_placement_data,
    master_places,
)
from pipette_cp.solvers.placement.data import PlacementData
from pipette_cp.solvers.placement.local_search import local_search
from pipette_cp.solvers.placement.repair import repair_placement
from pipette_cp.specs import Instance, Plan

#: Walk starts tried (the best-connected node, then seeded random ones).
STARTS = 4


def node_costs(data: PlacementData) -> np.ndarray:
    """Node x node cost of a walk step: the slower direction's inverse bandwidth."""
    n = data.instance.cluster.num_nodes
    cost = np.full((n, n), np.inf)
    inv = np.maximum(data.inv_bw, data.inv_bw.T)
    rows, cols = np.broadcast_arrays(data.place_node[:, None], data.place_node[None, :])
    np.minimum.at(cost, (rows, cols), inv)
    np.fill_diagonal(cost, np.inf)
    return cost


def walk(cost: np.ndarray, start: int, rng: np.random.Generator) -> list[int]:
    """Nearest-neighbour order of the nodes from ``start`` (ties broken at random)."""
    n = cost.shape[0]
    order, seen = [start], np.zeros(n, dtype=bool)
    seen[start] = True
    jitter = rng.uniform(0, 1e-9, size=(n, n))
    finite = np.where(np.isfinite(cost), cost, 1e30)
    for _ in range(n - 1):
        row = np.where(seen, np.inf, finite[order[-1]] * (1 + jitter[order[-1]]))
        nxt = int(np.argmin(row))
        order.append(nxt)
        seen[nxt] = True
    return order


def lay_out(data: PlacementData, node_order: list[int], ring_major: bool) -> np.ndarray | None:
    """Units laid on the places of ``node_order`` (each place repeated by its capacity)."""
    pp, dp = data.plan.pp, data.plan.replicas
    by_node: dict[int, list[int]] = {}
    for p, n in enumerate(data.place_node):
        by_node.setdefault(int(n), []).append(p)
    sequence = [p for n in node_order for p in by_node.get(n, []) for _ in range(data.capacity[p])]
    units = [s * dp + r for s in range(pp) for r in range(dp)]
    if not ring_major:
        units = [s * dp + r for r in range(dp) for s in range(pp)]
    assign = np.empty(pp * dp, dtype=np.int64)
    free = list(sequence)
    for u in units:
        ok = [i for i, p in enumerate(free) if data.allowed[data.stage_of(u), p]]
        if not ok:
            return None
        assign[u] = free.pop(ok[0])
    return assign


def greedy_assignments(data: PlacementData, seed: int) -> list[tuple[float, np.ndarray]]:
    """Every greedy candidate with its model value, best first (infeasible ones dropped)."""
    rng = np.random.default_rng(seed)
    cost = node_costs(data)
    n = cost.shape[0]
    finite = np.where(np.isfinite(cost), cost, 1e30)
    np.fill_diagonal(finite, 0.0)
    starts = [int(np.argmin(finite.sum(axis=1)))]
    starts += [int(s) for s in rng.permutation(n)[: STARTS - 1] if s != starts[0]]
    found: list[tuple[float, np.ndarray]] = []
    for start in starts:
        order = walk(cost, start, rng)
        for ring_major in (False, True):
            assign = lay_out(data, order, ring_major)
            if assign is not None:
                value = data.value(assign)
                if np.isfinite(value):
                    found.append((value, assign))
    found.sort(key=lambda item: item[0])
    return found


def repaired(data: PlacementData, seed: int, deadline: float) -> list[tuple[float, np.ndarray]]:
    """The first walk's layout after a local search that moves units off failed links."""
    rng = np.random.default_rng(seed)
    first = lay_out(data, walk(node_costs(data), 0, rng), ring_major=True)
    if first is None:
        return []
    assign, value = local_search(data, first, deadline, rng, repair_only=True)
    return [(value, assign)] if np.isfinite(value) else []


def _swapped_off_failures(
    instance: Instance, skeleton: Plan, data: PlacementData, seed: int
) -> Plan | None:
    """The first walk's layout with its tensor groups swapped off the failed pairs
    (:func:`~pipette_cp.solvers.placement.repair.repair_placement`), if that avoids them."""
    rng = np.random.default_rng(seed)
    first = lay_out(data, walk(node_costs(data), 0, rng), ring_major=True)
    if first is None:
        return None
    plan = skeleton.model_copy(update={"placement": data.placement(first)})
    moved = repair_placement(instance, plan, seed=seed)
    return moved if moved is not plan and not check_plan(instance, moved) else None


def greedy(instance: Instance, skeleton: Plan, options: SolveOptions) -> Plan:
    """Fast-link walk placement (see the module docstring), skeleton's layer split, seeded;
    when replicas of a stage may share a node, the better (by the Evaluator) of it and
    whole-node permutations of Megatron's order, which the two-level all-reduce rewards.

    ``solve_info.objective`` is the model's iteration time of the plan (s), the
    Evaluator's with DP rings in replica order (or the Evaluator's own, for a
    node permutation).  If every candidate crosses a
    failed link, the first candidate is returned anyway (the checker's
    ``no_failed_link`` family reports it) with objective None.

    Raises
    ------
    LayoutError
        tp does not divide gpus_per_node, or too many units for the cluster.
    """
    started = time.perf_counter()
    if master_places(instance, skeleton) > MAX_MASTER_PLACES:  # no place x place tables
        placed = repair_placement(instance, skeleton)
        return finish_plan(skeleton, layer_split=skeleton.layer_split,
                           placement=placed.placement, method="greedy (repair)",
                           objective_s=None, started_at=started)  # fmt: skip
    data = build_placement_data(instance, skeleton)
    found = greedy_assignments(data, options.seed)
    if not found:  # every walk crosses a failed link: swap groups off them, fast
        swapped = _swapped_off_failures(instance, skeleton, data, options.seed)
        if swapped is not None:
            return finish_plan(skeleton, layer_split=skeleton.layer_split,
                               placement=swapped.placement, method="greedy",
                               objective_s=None, started_at=started)  # fmt: skip
    if not found:  # still: the local search moves the culprits
        found = repaired(data, options.seed, started + options.time_limit_s)
    objective: float | None = None
    if found:
        objective, assign = found[0]
    else:
        order = list(range(instance.cluster.num_nodes))
        first = lay_out(data, order, ring_major=True)
        if first is None:
            raise InfeasibleError("no place can hold some stage (memory or failed TP links)")
        assign = first
    placement = data.placement(assign)
    if skeleton.replicas > 1 and data.multi:  # the two-level all-reduce may beat the ring
        packed = node_packed_placements(instance, skeleton, options.seed)
        value, best = best_of(instance, skeleton, [placement, *packed])
        if best is not None and best != placement:
            placement, objective = best, value
    return finish_plan(
        skeleton,
        layer_split=skeleton.layer_split,
        placement=placement,
        method="greedy",
        objective_s=objective,
        started_at=started,
    )
