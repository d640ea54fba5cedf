"""Bandwidth snapshots of one cluster and the planning matrix made from them.

Helpers of :mod:`pipette_cp.search.robust`: validating that snapshots measure one
cluster, the element-wise quantile matrix "from the slow side", the instance on a
given snapshot, and the position of a quantile among a few values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pipette_cp.errors import SpecError
from pipette_cp.specs import ClusterSpec, Instance, validate_spec

#: Fields that must agree between snapshots of one cluster.
_SAME = ("num_nodes", "gpus_per_node", "node_names", "node_gpu_types", "gpu_types")


def check_quantile(quantile: float, field_name: str = "quantile") -> float:
    """``quantile`` as a float in (0, 1], else a :class:`SpecError`."""
    q = float(quantile)
    if not 0.0 < q <= 1.0:
        raise SpecError(
            field_name, quantile, "expected a fraction in (0, 1]: 1 = worst snapshot, 0.5 = median"
        )
    return q


def check_snapshots(snapshots: Sequence[ClusterSpec]) -> None:
    """Raise :class:`SpecError` unless ``snapshots`` are >= 1 measurements of one cluster
    (same nodes, node names, GPUs per node and GPU types)."""
    if not snapshots:
        raise SpecError("snapshots", [], "expected at least one cluster snapshot")
    first = snapshots[0]
    for j, snap in enumerate(snapshots[1:], 1):
        for name in _SAME:
            mine, theirs = getattr(snap, name), getattr(first, name)
            if mine != theirs:
                raise SpecError(
                    f"snapshots[{j}].{name}",
                    mine,
                    f"snapshot {snap.name!r} must measure the same cluster as "
                    f"{first.name!r} ({name}={theirs!r})",
                )


def planning_matrix(snapshots: Sequence[ClusterSpec], quantile: float = 1.0) -> np.ndarray:
    """Element-wise q-quantile of the bandwidth matrices from the slow side, bytes/s.

    ``np.quantile(stack, 1 - q, axis=0)``: ``q = 1`` gives the minimum over the
    snapshots, so a pair failed (0) in any snapshot is failed.

    Examples
    --------
    >>> import numpy as np
    >>> from pipette_cp.clusters.generators.registry import generate_timeline
    >>> snaps = generate_timeline("failslow", nodes=2, seed=0, snapshots=3, gpus_per_node=2)
    >>> stack = np.stack([s.matrix for s in snaps])
    >>> bool((planning_matrix(snaps) == stack.min(axis=0)).all())
    True
    """
    q = check_quantile(quantile)
    check_snapshots(snapshots)
    stack = np.stack([s.matrix for s in snapshots])
    if q == 1.0:
        return stack.min(axis=0)
    return np.quantile(stack, 1.0 - q, axis=0)


def planning_cluster(snapshots: Sequence[ClusterSpec], quantile: float = 1.0) -> ClusterSpec:
    """The first snapshot with :func:`planning_matrix` as its bandwidth (NIC bandwidth and
    latencies taken from the slow side the same way), validated as any cluster."""
    matrix = planning_matrix(snapshots, quantile)
    q, first = float(quantile), snapshots[0]
    nic = np.quantile([s.nic_bandwidth_bytes_per_s for s in snapshots], 1.0 - q)
    intra = np.quantile([s.intra_node_latency_s for s in snapshots], q)
    inter = np.quantile([s.inter_node_latency_s for s in snapshots], q)
    data = {
        **dict(first),
        "name": f"{first.name}-robust-q{q:g}-of-{len(snapshots)}",
        "bandwidth_bytes_per_s": matrix,
        "nic_bandwidth_bytes_per_s": float(nic),
        "intra_node_latency_s": float(intra),
        "inter_node_latency_s": float(inter),
        "source": f"element-wise {q:g}-quantile (slow side) of {len(snapshots)} snapshots: "
        + ", ".join(s.name for s in snapshots),
    }
    return validate_spec(ClusterSpec, data, "planning cluster")


def with_cluster(instance: Instance, cluster: ClusterSpec) -> Instance:
    """``instance`` on ``cluster`` (its best-known value dropped: it was for the old one)."""
    data = {**dict(instance), "cluster": cluster, "best_known": None}
    return validate_spec(Instance, data, "instance")


def quantile_index(count: int, quantile: float) -> int:
    """Position in ascending order of the q-quantile of ``count`` values: the
    ``ceil(q count)``-th smallest (q = 1: the largest).

    >>> quantile_index(3, 1.0), quantile_index(3, 0.5), quantile_index(4, 0.5)
    (2, 1, 1)
    """
    return min(max(math.ceil(quantile * count - 1e-9) - 1, 0), count - 1)
