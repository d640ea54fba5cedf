"""Statistics of a bandwidth matrix, as used in docs/design.md, section 5.

All statistics work on the *node-pair* matrix (inter-node links only): the
real measurements are per node pair, and so are the targets the generators
must reproduce.  A pair is *failed* when its bandwidth is 0, *degraded* when
it delivers less than ``DEGRADED_BELOW`` x the median of the non-failed pairs,
and *healthy* otherwise.  A one-node cluster has no node pair: its statistics say
``num_pairs=0`` and hold the values of an empty set (median 0, no degraded or failed
pair, no asymmetry, no group ratio).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipette_cp.specs.cluster import ClusterSpec

#: A pair below this fraction of the median is degraded (the real H100 data has
#: healthy pairs within a few % and degraded ones at 0.54-0.70 x, so any cut in
#: 0.75-0.9 gives the same split).
DEGRADED_BELOW = 0.8


@dataclass(frozen=True)
class BandwidthStats:
    """Summary of the off-diagonal entries of a node x node bandwidth matrix."""

    num_pairs: int
    median_bytes_per_s: float
    healthy_cv: float
    degraded_fraction: float
    degraded_ratio_mean: float
    failed_fraction: float
    asymmetry_mean: float
    asymmetry_max: float
    cross_vs_same_group_ratio: float | None


def off_diagonal(matrix: np.ndarray) -> np.ndarray:
    """The off-diagonal entries of a square matrix, row by row."""
    n = matrix.shape[0]
    return matrix[~np.eye(n, dtype=bool)]


def matrix_stats(matrix: np.ndarray, groups: tuple[int, ...] | None = None) -> BandwidthStats:
    """Statistics of a node x node matrix (bytes/s; 0 = failed; diagonal ignored).

    >>> matrix_stats(np.zeros((1, 1))).num_pairs
    0
    """
    values = off_diagonal(matrix)
    alive = values > 0
    median = float(np.median(values[alive])) if alive.any() else 0.0
    degraded = alive & (values < DEGRADED_BELOW * median)
    healthy = alive & ~degraded
    healthy_values = values[healthy]
    cv = float(healthy_values.std() / healthy_values.mean()) if healthy_values.size > 1 else 0.0
    ratio = float(values[degraded].mean() / median) if degraded.any() else 1.0
    asym_mean, asym_max = _asymmetry(matrix)
    pairs = max(values.size, 1)  # no pair (one node): fractions of an empty set are 0
    return BandwidthStats(
        num_pairs=int(values.size),
        median_bytes_per_s=median,
        healthy_cv=cv,
        degraded_fraction=float(degraded.sum() / pairs),
        degraded_ratio_mean=ratio,
        failed_fraction=float((~alive).sum() / pairs),
        asymmetry_mean=asym_mean,
        asymmetry_max=asym_max,
        cross_vs_same_group_ratio=_group_ratio(matrix, groups, median),
    )


def cluster_stats(cluster: ClusterSpec) -> BandwidthStats:
    """:func:`matrix_stats` of a cluster's node-pair matrix."""
    return matrix_stats(cluster.node_matrix(), cluster.node_groups)


def _asymmetry(matrix: np.ndarray) -> tuple[float, float]:
    """Mean and max of |B_ij - B_ji| / mean(B_ij, B_ji) over pairs alive both ways."""
    upper = np.triu_indices(matrix.shape[0], k=1)
    forward, backward = matrix[upper], matrix.T[upper]
    both = (forward > 0) & (backward > 0)
    if not both.any():
        return 0.0, 0.0
    rel = np.abs(forward[both] - backward[both]) / ((forward[both] + backward[both]) / 2)
    return float(rel.mean()), float(rel.max())


def _group_ratio(matrix: np.ndarray, groups: tuple[int, ...] | None, median: float) -> float | None:
    """Median cross-group / median same-group bandwidth, over non-degraded pairs."""
    if groups is None or len(set(groups)) < 2:
        return None
    labels = np.asarray(groups)
    same = labels[:, None] == labels[None, :]
    off = ~np.eye(len(labels), dtype=bool)
    usable = (matrix >= DEGRADED_BELOW * median) & off
    same_vals, cross_vals = matrix[usable & same], matrix[usable & ~same]
    if not same_vals.size or not cross_vals.size:
        return None
    return float(np.median(cross_vals) / np.median(same_vals))


def snapshot_correlation(first: np.ndarray, second: np.ndarray) -> float:
    """Pearson correlation of the per-pair log-deviations from the median between two
    snapshots of the same cluster, over pairs alive in both (docs/design.md: about 0.55)."""
    a, b = off_diagonal(first), off_diagonal(second)
    alive = (a > 0) & (b > 0)
    if not alive.any():  # no pair (one node): nothing changed, as with no variation
        return 1.0
    la, lb = np.log(a[alive]), np.log(b[alive])
    la, lb = la - np.median(la), lb - np.median(lb)
    if la.std() == 0 or lb.std() == 0:
        return 1.0
    return float(np.corrcoef(la, lb)[0, 1])
