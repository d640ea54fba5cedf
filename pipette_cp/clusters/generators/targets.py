"""Target ranges of the generators' statistics, and the few extra statistics they need.

The main statistics are :func:`pipette_cp.clusters.stats.cluster_stats`; three more
are defined here because the targets need them:

- ``noise_cv``: CV of the healthy pairs after dividing each by the median of its
  class (same switch group / across groups), i.e. the pair noise without the
  leaf structure (stats' ``healthy_cv`` mixes the two levels);
- ``asymmetry_second_max``: the largest direction asymmetry once the single
  largest pair is set aside (docs/design.md: max 15 %, one pair at 31 %);
- ``cross_group_ratio_all``: median cross-group / median same-group over all live
  pairs, with no degraded cut (a G4 cross-pod pair may sit below 0.8 x the median,
  where stats' ratio would drop it).

Targets are statistical: they are meant to hold from ``Targets.min_nodes`` nodes up.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields

import numpy as np

from pipette_cp.clusters.stats import DEGRADED_BELOW, cluster_stats, snapshot_correlation
from pipette_cp.specs.cluster import ClusterSpec

Range = tuple[float, float]


@dataclass(frozen=True)
class Targets:
    """Closed ranges each statistic must fall in; ``None`` = not targeted.

    A statistic that cannot be measured on a given cluster (``cross_group_ratio``
    with a single leaf) is skipped, not failed.
    """

    healthy_cv: Range | None = (0.002, 0.04)
    noise_cv: Range | None = (0.002, 0.04)
    degraded_fraction: Range | None = (0.0, 0.01)
    degraded_ratio: Range | None = None
    failed_fraction: Range | None = (0.0, 0.0)
    asymmetry_mean: Range | None = (0.03, 0.05)
    asymmetry_max: Range | None = (0.0, 0.32)
    asymmetry_second_max: Range | None = (0.0, 0.15)
    cross_group_ratio: Range | None = None
    cross_group_ratio_all: Range | None = None
    snapshot_correlation: Range | None = None
    min_nodes: int = 16
    notes: str = ""

    def ranges(self) -> dict[str, Range]:
        """The targeted statistics and their ranges."""
        skip = {"min_nodes", "notes"}
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in skip and getattr(self, f.name) is not None
        }

    def violations(self, measured: Mapping[str, float | None]) -> list[str]:
        """One line per statistic outside its range, e.g. ``healthy_cv=0.051 not in [0.002, 0.04]``."""
        out = []
        for name, (low, high) in self.ranges().items():
            value = measured.get(name)
            if value is not None and not (low - 1e-12 <= value <= high + 1e-12):
                out.append(f"{name}={value:.4g} not in [{low:g}, {high:g}]")
        return out


def noise_cv(matrix: np.ndarray, groups: Sequence[int] | None) -> float:
    """CV of the healthy pairs, each divided by the median of its group class."""
    n = matrix.shape[0]
    off = ~np.eye(n, dtype=bool)
    labels = np.asarray(groups if groups is not None else np.zeros(n, dtype=int))
    same = labels[:, None] == labels[None, :]
    parts = []
    for cls in (same & off, ~same & off):
        values = matrix[cls]
        values = values[values > 0]
        if values.size < 2:
            continue
        values = values / np.median(values)
        parts.append(values[values >= DEGRADED_BELOW])
    healthy = np.concatenate(parts) if parts else np.zeros(0)
    return float(healthy.std() / healthy.mean()) if healthy.size > 1 else 0.0


def asymmetries(matrix: np.ndarray) -> np.ndarray:
    """``|B_ij - B_ji| / mean(B_ij, B_ji)`` of every pair i < j alive both ways."""
    upper = np.triu_indices(matrix.shape[0], k=1)
    forward, backward = matrix[upper], matrix.T[upper]
    both = (forward > 0) & (backward > 0)
    return np.abs(forward[both] - backward[both]) / ((forward[both] + backward[both]) / 2)


def cross_group_ratio_all(matrix: np.ndarray, groups: Sequence[int] | None) -> float | None:
    """Median cross-group / median same-group bandwidth over all live pairs."""
    if groups is None or len(set(groups)) < 2:
        return None
    labels = np.asarray(groups)
    same = labels[:, None] == labels[None, :]
    alive = (matrix > 0) & ~np.eye(len(labels), dtype=bool)
    same_vals, cross_vals = matrix[alive & same], matrix[alive & ~same]
    if not same_vals.size or not cross_vals.size:
        return None
    return float(np.median(cross_vals) / np.median(same_vals))


def measure(cluster: ClusterSpec) -> dict[str, float | None]:
    """Every statistic a :class:`Targets` can name, for one cluster (snapshot); all None
    for one node (no node pair: nothing to measure, so no target is failed)."""
    matrix = cluster.node_matrix()
    stats = asdict(cluster_stats(cluster))
    asym = np.sort(asymmetries(matrix))
    measured: dict[str, float | None] = {
        "healthy_cv": stats["healthy_cv"],
        "noise_cv": noise_cv(matrix, cluster.node_groups),
        "degraded_fraction": stats["degraded_fraction"],
        "degraded_ratio": stats["degraded_ratio_mean"] if stats["degraded_fraction"] else None,
        "failed_fraction": stats["failed_fraction"],
        "asymmetry_mean": stats["asymmetry_mean"],
        "asymmetry_max": stats["asymmetry_max"],
        "asymmetry_second_max": float(asym[-2]) if asym.size > 1 else None,
        "cross_group_ratio": stats["cross_vs_same_group_ratio"],
        "cross_group_ratio_all": cross_group_ratio_all(matrix, cluster.node_groups),
    }
    return measured if stats["num_pairs"] else dict.fromkeys(measured, None)


def consecutive_correlations(timeline: Sequence[ClusterSpec]) -> list[float]:
    """:func:`~pipette_cp.clusters.stats.snapshot_correlation` of each consecutive pair."""
    mats = [c.node_matrix() for c in timeline]
    return [snapshot_correlation(a, b) for a, b in itertools.pairwise(mats)]


def measure_timeline(timeline: Sequence[ClusterSpec]) -> dict[str, float | None]:
    """:func:`measure` of the first snapshot, plus ``snapshot_correlation``: the mean of
    the consecutive-snapshot correlations (None for a single snapshot or node)."""
    out = measure(timeline[0])
    corr = consecutive_correlations(timeline) if timeline[0].num_nodes > 1 else []
    out["snapshot_correlation"] = float(np.mean(corr)) if corr else None
    return out
