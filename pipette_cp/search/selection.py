"""Choosing the GPUs: excluded nodes, the objective across GPU totals, idle nodes named.

The search runs on the nodes not excluded (:func:`restrict`), so every method,
heuristic or exact, sees only them, and its plans are mapped back onto the
cluster's GPU ids (:func:`lift`).  Whether a layout leaves whole nodes idle is
the outer loop's choice (:func:`~pipette_cp.specs.selection.gpu_totals`); which
nodes stay idle is the placement's (a unit may go on any node's block).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from pipette_cp.checker import check_plan
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.errors import PipetteError, SpecError
from pipette_cp.search.rerank import plan_time
from pipette_cp.search.sweep import Candidate
from pipette_cp.solvers import SolveOptions, get_method
from pipette_cp.specs import ClusterSpec, Instance, Plan, SearchSpace, SolveInfo
from pipette_cp.specs.plan import share_placement
from pipette_cp.specs.selection import excluded_nodes, gpu_totals

#: Skeletons on every usable GPU placed greedily for the idle-node report.
REFERENCE_TRIES = 3

#: ``weight(plan)``: what one second of the plan's iteration costs under the objective.
Weight = Callable[[Plan], float]


def objective_weight(space: SearchSpace) -> Weight:
    """1 for ``objective: time``; the plan's GPU count for ``throughput-per-gpu``
    (the search then minimises GPU-seconds per iteration)."""
    if space.objective == "throughput-per-gpu":
        return lambda plan: float(plan.num_gpus)
    return lambda plan: 1.0


def check_selection(instance: Instance, space: SearchSpace) -> None:
    """Raise :class:`~pipette_cp.errors.SpecError` for an excluded node that does not
    exist or a ``min_gpus`` above the GPUs left (before any work)."""
    gpu_totals(instance.cluster, space)


def restrict(instance: Instance) -> tuple[Instance, np.ndarray]:
    """``instance`` on the nodes ``search_space.exclude_nodes`` leaves (that field
    cleared), and the cluster GPU id of each of its GPUs.  Where an exclusion takes
    part of an NVLink domain, the sub-cluster's domains are single nodes (a tensor
    group then stays inside one tray)."""
    cluster, space = instance.cluster, instance.search_space
    if cluster.fabric is not None:
        raise SpecError("search_space.exclude_nodes", list(space.exclude_nodes),
                        "a hierarchical fabric keeps its nodes: give the fabric without "
                        "them (or leave them idle with use_all_gpus: false)")  # fmt: skip
    out = set(excluded_nodes(cluster, space))
    keep = [n for n in range(cluster.num_nodes) if n not in out]
    g = cluster.gpus_per_node
    gpus = np.array([n * g + k for n in keep for k in range(g)], dtype=np.int64)
    matrix = cluster.matrix[np.ix_(gpus, gpus)]
    matrix.flags.writeable = False
    groups = cluster.node_groups
    sub = cluster.model_copy(
        update={
            "num_nodes": len(keep),
            "node_gpu_types": tuple(cluster.node_gpu_types[n] for n in keep),
            "node_names": tuple(cluster.node_names[n] for n in keep),
            "node_groups": None if groups is None else tuple(groups[n] for n in keep),
            "bandwidth_bytes_per_s": matrix,
        }
    )
    per = cluster.nodes_per_nvlink_domain
    whole = per == 1 or all(sum(1 for n in keep if n // per == d) in (0, per)
                            for d in range(cluster.num_nodes // per))  # fmt: skip
    if not whole:  # a domain lost some trays: tensor groups stay inside one tray there
        sub = sub.model_copy(update={"nodes_per_nvlink_domain": 1})
    narrowed = space.model_copy(update={"exclude_nodes": ()})
    return instance.model_copy(update={"cluster": sub, "search_space": narrowed}), gpus


def node_preference(cluster: ClusterSpec) -> np.ndarray:
    """Nodes best first: by the mean bandwidth of their GPUs' links to the other nodes'
    GPUs, the slower of the sending and the receiving side (a failed pair counts 0),
    then hostfile order.  One pass over the matrix, no copy of it."""
    n, g = cluster.num_nodes, cluster.gpus_per_node
    if n == 1:
        return np.zeros(1, dtype=np.int64)
    if cluster.fabric is not None:
        sent, received = cluster.fabric.node_bandwidth_sums()
        score = np.minimum(sent, received) / (n - 1)
        return np.array(sorted(range(n), key=lambda k: (-score[k], k)), dtype=np.int64)
    bw = cluster.links
    blocks = bw.reshape(n, g, n, g)
    diag = np.arange(n)
    intra = blocks[diag, :, diag, :]  # (n, g, g): each node's own block
    sent = bw.sum(axis=1).reshape(n, g).sum(axis=1) - intra.sum(axis=(1, 2))
    received = bw.sum(axis=0).reshape(n, g).sum(axis=1) - intra.sum(axis=(1, 2))
    score = np.minimum(sent, received) / (g * g * (n - 1))
    return np.array(sorted(range(n), key=lambda k: (-score[k], k)), dtype=np.int64)


def on_preferred_nodes(plan: Plan, cluster: ClusterSpec, order: np.ndarray) -> Plan:
    """A skeleton that leaves GPUs idle, moved (rank order kept) onto the best nodes of
    ``order`` (:func:`node_preference`) in hostfile order, instead of the first ones."""
    g, per = cluster.gpus_per_node, cluster.nodes_per_nvlink_domain
    if per > 1:  # whole NVLink domains first (a wide tensor group spans trays of one)
        rank = {int(node): i for i, node in enumerate(order)}
        domains = sorted(range(cluster.num_nodes // per),
                         key=lambda d: (np.mean([rank[d * per + k] for k in range(per)]), d))  # fmt: skip
        order = np.array([d * per + k for d in domains for k in range(per)], dtype=np.int64)
    nodes = sorted(order[: -(-plan.num_gpus // g)].tolist())
    gpus = np.array([n * g + k for n in nodes for k in range(g)], dtype=np.int64)
    return lift(plan, gpus)


def lift(plan: Plan, gpus: np.ndarray) -> Plan:
    """``plan`` (placed on a :func:`restrict` instance) with the cluster's GPU ids."""
    placement = tuple(tuple(int(gpus[g]) for g in unit) for unit in plan.placement)
    return plan.model_copy(update={"placement": placement})


@dataclass(frozen=True)
class IdleNodes:
    """The nodes the best plan leaves idle, and what using every node would cost."""

    names: tuple[str, ...]
    excluded: tuple[str, ...]
    #: best plan found on every usable GPU, s (inf: none fits or none was found)
    all_gpus_time_s: float
    #: lower bound of every layout on every usable GPU, s (inf: none fits)
    all_gpus_bound_s: float

    def describe(self, best_s: float) -> str:
        """One line: which nodes idle and why."""
        if not self.names and not self.excluded:
            return ""
        parts = []
        if self.excluded:
            parts.append(f"excluded by request: {', '.join(self.excluded)}")
        if self.names:
            shown = ", ".join(self.names[:6]) + (", ..." if len(self.names) > 6 else "")
            why = _why(best_s, self.all_gpus_time_s, self.all_gpus_bound_s)
            parts.append(f"left idle: {shown} ({why})")
        return "Nodes " + "; ".join(parts)


def _why(best_s: float, found_s: float, bound_s: float) -> str:
    if not math.isfinite(bound_s):
        return "no layout on every GPU fits in memory"
    if bound_s > best_s:
        return f"every layout on all GPUs is at least {100 * (bound_s / best_s - 1):.1f} % slower"
    if math.isfinite(found_s):
        return f"the best plan found on all GPUs is {100 * (found_s / best_s - 1):.1f} % slower"
    return "no plan on all GPUs was found in the budget"


def idle_nodes(
    instance: Instance, plan: Plan, best_by_gpus: dict[int, float], bound_by_gpus: dict[int, float]
) -> IdleNodes:
    """The nodes ``plan`` leaves idle on ``instance``; ``best_by_gpus`` and
    ``bound_by_gpus``: the best plan found and the least lower bound of a layout that
    may fit, per GPU total (from the search's statistics)."""
    cluster = instance.cluster
    excluded = excluded_nodes(cluster, instance.search_space)
    used = {g // cluster.gpus_per_node for unit in plan.placement for g in unit}
    idle = [n for n in range(cluster.num_nodes) if n not in used and n not in excluded]
    usable = (cluster.num_nodes - len(excluded)) * cluster.gpus_per_node
    return IdleNodes(
        names=tuple(cluster.node_names[n] for n in idle),
        excluded=tuple(cluster.node_names[n] for n in excluded),
        all_gpus_time_s=best_by_gpus.get(usable, math.inf),
        all_gpus_bound_s=bound_by_gpus.get(usable, math.inf),
    )


def preferred_skeletons(instance: Instance, layouts: list[Plan]) -> list[Plan]:
    """Skeletons that leave nodes idle moved onto the best-connected nodes (one
    placement per (dp, pp, tp), shared by the skeletons of those degrees)."""
    cluster = instance.cluster
    order: np.ndarray | None = None
    moved: dict[tuple[int, int, int], tuple[tuple[int, ...], ...]] = {}  # by size and start
    out = []
    for plan in layouts:
        if plan.num_gpus == cluster.num_gpus:
            out.append(plan)
            continue
        key = (plan.num_gpus, plan.tp, id(plan.placement))  # placements are shared
        if key not in moved:
            order = node_preference(cluster) if order is None else order
            moved[key] = share_placement(on_preferred_nodes(plan, cluster, order).placement)
        out.append(plan.model_copy(update={"placement": moved[key]}))
    return out


def all_gpus_reference(
    instance: Instance,
    evaluator: Evaluator,
    plans: list[Plan],
    candidates: list[Candidate],
    options: SolveOptions,
    best_by_gpus: dict[int, float],
    until: float,
) -> list[Plan]:
    """When the best plan leaves GPUs idle and no plan on every usable GPU was found:
    greedy plans of the best-scored such skeletons (at most :data:`REFERENCE_TRIES`, 1 s
    each, within ``until``), so the report can say what using every GPU costs."""
    usable = max(gpu_totals(instance.cluster, instance.search_space))
    best = min(plans, key=plan_time)
    if best.num_gpus == usable or usable in best_by_gpus:
        return []
    greedy, found = get_method("greedy"), []
    for cand in [c for c in candidates if c.plan.num_gpus == usable][:REFERENCE_TRIES]:
        left = until - time.perf_counter()
        if left < 0.2:
            break
        with contextlib.suppress(PipetteError):
            plan = greedy(instance, cand.plan, replace(options, time_limit_s=min(1.0, left)))
            evaluation = evaluator.evaluate(plan)
            if evaluation.fits and not check_plan(instance, plan):
                info = SolveInfo(method="greedy (all-GPU reference)", status="heuristic")
                found.append(plan.model_copy(update={"evaluation": evaluation, "solve_info": info}))
    return found
