"""Choosing the GPUs: excluded nodes, the objective across GPU totals, idle nodes named.

The search runs on the nodes not excluded (:func:`restrict`), so every method,
heuristic or exact, sees only them, and its plans are mapped back onto the
cluster's GPU ids (:func:`lift`).  Whether a layout leaves whole nodes idle is
the outer loop's choice (:func:`~pipette_cp.specs.selection.gpu_totals`); which
nodes stay idle is the placement's (a unit may go on any node's block).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pipette_cp.specs import ClusterSpec, Instance, Plan, SearchSpace
from pipette_cp.specs.selection import excluded_nodes, gpu_totals

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
    cleared), and the cluster GPU id of each of its GPUs."""
    cluster, space = instance.cluster, instance.search_space
    out = set(excluded_nodes(cluster, space))
    keep = [n for n in range(cluster.num_nodes) if n not in out]
    g = cluster.gpus_per_node
    gpus = np.array([n * g + k for n in keep for k in range(g)], dtype=np.int64)
    matrix = cluster.bandwidth_bytes_per_s[np.ix_(gpus, gpus)]
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
    narrowed = space.model_copy(update={"exclude_nodes": ()})
    return instance.model_copy(update={"cluster": sub, "search_space": narrowed}), gpus


def node_preference(cluster: ClusterSpec) -> np.ndarray:
    """Nodes best first: by the mean bandwidth of their links to the other nodes (each
    pair at its slower direction, a failed pair at 0), then hostfile order."""
    m = cluster.node_matrix()
    n = cluster.num_nodes
    if n == 1:
        return np.zeros(1, dtype=np.int64)
    g = cluster.gpus_per_node
    failed = cluster.failed_mask.reshape(n, g, n, g).mean(axis=(1, 3))
    pair = np.minimum(m, m.T) * (1.0 - np.maximum(failed, failed.T))
    np.fill_diagonal(pair, 0.0)
    score = pair.sum(axis=1) / (n - 1)
    return np.array(sorted(range(n), key=lambda k: (-score[k], k)), dtype=np.int64)


def on_preferred_nodes(plan: Plan, cluster: ClusterSpec, order: np.ndarray) -> Plan:
    """A skeleton that leaves GPUs idle, moved (rank order kept) onto the best nodes of
    ``order`` (:func:`node_preference`) in hostfile order, instead of the first ones."""
    g = cluster.gpus_per_node
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
