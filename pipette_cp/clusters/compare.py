"""Drift between two measurements of one cluster: is the plan made on the first still valid?

A *pair* here is an unordered pair of distinct GPUs (or nodes); it *changed* when
one of its two directions changed by more than ``threshold`` relative to the first
snapshot A, ``|B - A| / A > threshold``, or went from alive to failed (a *new
failure*, bandwidth > 0 in A and 0 in B) or from failed to alive (*recovered*).
Node pairs use :meth:`~pipette_cp.specs.ClusterSpec.node_matrix` (mean over the
healthy GPU pairs of two nodes), so a node pair fails only when all its GPU pairs
do; :attr:`DriftReport.new_failures` lists the node pairs holding any newly failed
GPU pair.

**Verdict.**  Re-planning is recommended when a GPU pair failed that was alive in
A, or when a GPU pair in the *slowest decile* changed by more than ``threshold``;
otherwise the plan is still valid.  The slowest decile is every directed GPU pair,
alive in A or in B, at or below the 10th percentile of the alive off-diagonal
bandwidths of that snapshot (so both a slow link that got slower or faster and a
fast link that became one of the slowest count).  Only those pairs can move the
plan's bottleneck: placement avoids them or is gated by them, and drift among the
fast pairs changes little.

The correlation is Pearson's r of the off-diagonal node-pair bandwidths alive in
both snapshots (the inter-node links; GPU pairs would mostly correlate NVLink
with NVLink); None with fewer than two such pairs or a constant matrix.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import Field

from pipette_cp.errors import SpecError
from pipette_cp.specs._base import FrozenSpec
from pipette_cp.specs.cluster import ClusterSpec

#: The slowest fraction of pairs the verdict watches (module doc).
SLOW_QUANTILE = 0.1


class PairChange(FrozenSpec):
    """One directed GPU pair whose bandwidth differs between the snapshots."""

    src_node: str = Field(description="Host of the sending GPU.")
    dst_node: str = Field(description="Host of the receiving GPU.")
    src_gpu: int = Field(description="Global index of the sending GPU.")
    dst_gpu: int = Field(description="Global index of the receiving GPU.")
    before_bytes_per_s: float = Field(description="Bandwidth in snapshot A, bytes/s (0 = failed).")
    after_bytes_per_s: float = Field(description="Bandwidth in snapshot B, bytes/s (0 = failed).")
    relative_change: float | None = Field(
        description="(B - A) / A; -1 for a new failure; None when A had failed (recovered)."
    )
    slowest_decile: bool = Field(description="In the slowest decile of A or of B.")


class DriftReport(FrozenSpec):
    """What changed between snapshot A and snapshot B (module doc for every rule)."""

    cluster_a: str = Field(description="Name of snapshot A.")
    cluster_b: str = Field(description="Name of snapshot B.")
    threshold: float = Field(description="Relative change above which a pair counts as changed.")
    gpu_pairs: int = Field(description="Unordered pairs of distinct GPUs.")
    gpu_pairs_changed: int = Field(description="GPU pairs changed by more than threshold.")
    node_pairs: int = Field(description="Unordered pairs of distinct nodes.")
    node_pairs_changed: int = Field(description="Node pairs changed by more than threshold.")
    correlation: float | None = Field(
        description="Pearson r of the node-pair bandwidths alive in both snapshots."
    )
    new_failures: tuple[tuple[str, str], ...] = Field(
        description="Node pairs (names) with a GPU pair alive in A and failed in B."
    )
    new_failed_gpu_pairs: int = Field(description="Unordered GPU pairs newly failed.")
    recovered: tuple[tuple[str, str], ...] = Field(
        description="Node pairs (names) with a GPU pair failed in A and alive in B."
    )
    recovered_gpu_pairs: int = Field(description="Unordered GPU pairs recovered.")
    slow_pairs_changed: int = Field(
        description="Unordered GPU pairs in the slowest decile changed by more than threshold."
    )
    largest_changes: tuple[PairChange, ...] = Field(
        description="The largest change of each node pair, largest first (top ``top``)."
    )
    replan_recommended: bool = Field(description="The verdict (module doc).")

    @property
    def verdict(self) -> str:
        """One line: 're-plan recommended (...)' or 'plan still valid (...)'."""
        if not self.replan_recommended:
            return (
                f"plan still valid (no new failure; no pair of the slowest decile changed "
                f"by more than {self.threshold:.0%})"
            )
        why = []
        if self.new_failed_gpu_pairs:
            why.append(f"{self.new_failed_gpu_pairs} GPU pairs newly failed")
        if self.slow_pairs_changed:
            why.append(
                f"{self.slow_pairs_changed} GPU pairs of the slowest decile changed by more "
                f"than {self.threshold:.0%}"
            )
        return f"re-plan recommended ({'; '.join(why)})"


def _node_order(a: ClusterSpec, b: ClusterSpec, by_name: bool) -> np.ndarray:
    """Index in ``b`` of each node of ``a``."""
    if (a.num_nodes, a.gpus_per_node) != (b.num_nodes, b.gpus_per_node):
        raise SpecError(
            "cluster B",
            f"{b.num_nodes} nodes x {b.gpus_per_node} GPUs",
            f"expected the size of cluster A, {a.num_nodes} nodes x {a.gpus_per_node} GPUs",
        )
    if not by_name:
        return np.arange(a.num_nodes)
    missing = sorted(set(a.node_names) - set(b.node_names))
    if missing:
        raise SpecError(
            "cluster B",
            f"no node {missing[0]!r}",
            f"expected the nodes of cluster A ({len(missing)} missing); "
            "compare by position (--by-position) if the hosts were renamed",
        )
    where = {name: i for i, name in enumerate(b.node_names)}
    return np.array([where[name] for name in a.node_names])


def _unordered(mask: np.ndarray) -> int:
    """Unordered pairs {i, j}, i != j, where mask[i, j] or mask[j, i]."""
    either = mask | mask.T
    return int(np.triu(either, k=1).sum())


def _slowest(matrix: np.ndarray, off: np.ndarray) -> np.ndarray:
    alive = off & (matrix > 0)
    if not alive.any():
        return np.zeros_like(alive)
    return alive & (matrix <= np.quantile(matrix[alive], SLOW_QUANTILE))


def _node_pairs(mask: np.ndarray, a: ClusterSpec) -> tuple[tuple[str, str], ...]:
    n, g = a.num_nodes, a.gpus_per_node
    either = (mask | mask.T).reshape(n, g, n, g).any(axis=(1, 3))
    return tuple(
        (a.node_names[i], a.node_names[j]) for i in range(n) for j in range(i, n) if either[i, j]
    )


def _correlation(x: np.ndarray, y: np.ndarray) -> float | None:
    off = ~np.eye(x.shape[0], dtype=bool)
    both = off & (x > 0) & (y > 0)
    xs, ys = x[both], y[both]
    if xs.size < 2 or xs.std() == 0 or ys.std() == 0:
        return None
    return float(np.corrcoef(xs, ys)[0, 1])


def compare_clusters(
    a: ClusterSpec, b: ClusterSpec, *, threshold: float = 0.2, top: int = 10, by_name: bool = True
) -> DriftReport:
    """How far snapshot ``b`` of a cluster drifted from snapshot ``a``.

    Parameters
    ----------
    a, b : ClusterSpec
        Two measurements of one cluster (same node and GPU counts); ``a`` is the
        one the current plan was made for.
    threshold : float
        Relative change, > 0, above which a pair counts as changed (0.2 = 20 %).
    top : int
        Number of node pairs in :attr:`DriftReport.largest_changes`.
    by_name : bool
        Match the nodes by name (default; the node order of ``b`` may differ);
        False matches them by position (hosts renamed between the measurements).

    Returns
    -------
    DriftReport
        Counts, correlation, failures and the verdict (module doc).

    Raises
    ------
    SpecError
        Different sizes, nodes of ``a`` missing from ``b`` (with ``by_name``),
        or a threshold <= 0.
    """
    if (
        isinstance(threshold, bool)
        or not isinstance(threshold, int | float)
        or not 0 < threshold < math.inf
    ):  # fmt: skip  (nan fails every comparison)
        raise SpecError("threshold", threshold, "expected a finite relative change > 0, e.g. 0.2")
    order = _node_order(a, b, by_name)
    gpus = (order[:, None] * a.gpus_per_node + np.arange(a.gpus_per_node)).ravel()
    before, after = a.matrix, b.matrix[np.ix_(gpus, gpus)]
    node_a, node_b = a.node_matrix(), b.node_matrix()[np.ix_(order, order)]
    off = ~np.eye(a.num_gpus, dtype=bool)
    alive_a, alive_b = off & (before > 0), off & (after > 0)
    both = alive_a & alive_b
    rel = np.zeros_like(before)
    rel[both] = (after[both] - before[both]) / before[both]
    new_failed, recovered = alive_a & ~alive_b, alive_b & ~alive_a
    rel[new_failed] = -1.0
    changed = (both & (np.abs(rel) > threshold)) | new_failed | recovered
    slow = _slowest(before, off) | _slowest(after, off)
    slow_changed = slow & changed & ~recovered
    node_changed = _node_changes(node_a, node_b, threshold)
    return DriftReport(
        cluster_a=a.name,
        cluster_b=b.name,
        threshold=float(threshold),
        gpu_pairs=a.num_gpus * (a.num_gpus - 1) // 2,
        gpu_pairs_changed=_unordered(changed),
        node_pairs=a.num_nodes * (a.num_nodes - 1) // 2,
        node_pairs_changed=_unordered(node_changed),
        correlation=_correlation(node_a, node_b),
        new_failures=_node_pairs(new_failed, a),
        new_failed_gpu_pairs=_unordered(new_failed),
        recovered=_node_pairs(recovered, a),
        recovered_gpu_pairs=_unordered(recovered),
        slow_pairs_changed=_unordered(slow_changed),
        largest_changes=_largest(a, before, after, rel, slow, top),
        replan_recommended=bool(new_failed.any() or slow_changed.any()),
    )


def _node_changes(x: np.ndarray, y: np.ndarray, threshold: float) -> np.ndarray:
    off = ~np.eye(x.shape[0], dtype=bool)
    both = off & (x > 0) & (y > 0)
    rel = np.zeros_like(x)
    rel[both] = np.abs(y[both] - x[both]) / x[both]
    return (both & (rel > threshold)) | (off & ((x > 0) != (y > 0)))


def _largest(
    a: ClusterSpec,
    before: np.ndarray,
    after: np.ndarray,
    rel: np.ndarray,
    slow: np.ndarray,
    top: int,
) -> tuple[PairChange, ...]:
    """The largest change of each node pair, at most ``top`` node pairs, whether above
    the threshold or not: recoveries first, then by |relative change|."""
    off = ~np.eye(a.num_gpus, dtype=bool)
    size = np.where(before > 0, np.abs(rel), np.inf)
    size[(before <= 0) & (after <= 0)] = 0.0
    size[~off] = 0.0
    seen: set[tuple[int, int]] = set()
    out: list[PairChange] = []
    for flat in np.argsort(-size, axis=None, kind="stable"):
        i, j = divmod(int(flat), a.num_gpus)
        if len(out) >= top or size[i, j] <= 0:
            break
        key = (min(a.node_of(i), a.node_of(j)), max(a.node_of(i), a.node_of(j)))
        if key in seen:
            continue
        seen.add(key)
        out.append(
            PairChange(
                src_node=a.node_names[a.node_of(i)],
                dst_node=a.node_names[a.node_of(j)],
                src_gpu=i,
                dst_gpu=j,
                before_bytes_per_s=float(before[i, j]),
                after_bytes_per_s=float(after[i, j]),
                relative_change=None if before[i, j] <= 0 else float(rel[i, j]),
                slowest_decile=bool(slow[i, j]),
            )
        )
    return tuple(out)
