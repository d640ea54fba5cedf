"""Building blocks of the synthetic cluster generators: switch groups, noise, pair picks.

Everything works on node x node matrices of *log* bandwidth (natural log of
bytes/s), so that multiplicative effects (a cross-leaf factor, a degraded pair,
lognormal noise) simply add.  All randomness comes from the ``numpy.random.Generator``
passed in; nothing here seeds anything.

Noise model (docs/design.md, section 5, from the real-cluster statistics it lists):

- a healthy ordered pair (i, j) deviates from its switch-group level by
  ``sym[i, j] + a[i, j] / 2`` where ``sym`` is symmetric (the pair's link quality,
  lognormal) and ``a`` is antisymmetric (direction asymmetry, ``a[j, i] = -a[i, j]``);
- both parts are a mix ``sqrt(rho) * persistent + sqrt(1 - rho) * per-snapshot`` of
  standard normals, so two snapshots of the same cluster correlate with ``rho``;
- ``a`` is soft-clipped with ``clip * tanh(x / clip)`` so that the relative
  direction asymmetry ``|B_ij - B_ji| / mean`` never exceeds ``clip`` (docs/design.md: max
  15 % in a 16-node A100 cluster); one outlier pair may be set apart (31 %).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

#: Standard-normal quadrature grid used to calibrate the soft-clipped direction noise.
_Z = np.linspace(-8.0, 8.0, 8001)
_W = np.exp(-0.5 * _Z**2)
_W /= _W.sum()


# ------------------------------------------------------------------ switch groups
def filled_groups(nodes: int, group_size: int) -> np.ndarray:
    """Group id of each node when groups (leaves, pods) are filled in hostfile order.

    >>> filled_groups(5, 2).tolist()
    [0, 0, 1, 1, 2]
    """
    return np.arange(nodes) // group_size


def uneven_groups(
    rng: np.random.Generator, nodes: int, mean_size: float, concentration: float
) -> np.ndarray:
    """Group ids for ``ceil(nodes / mean_size)`` groups (at least 2, unless there is only
    one node) of uneven sizes.

    Sizes are ``1 + multinomial(nodes - k, dirichlet(concentration))``: every group
    holds at least one node; a small ``concentration`` makes the sizes very uneven
    (the 10-node H100 cluster of xxrjun/nccl-tests-cluster has leaves of 7, 2 and 1).
    """
    count = min(nodes, max(2, math.ceil(nodes / mean_size)))
    shares = rng.dirichlet(np.full(count, concentration))
    sizes = 1 + rng.multinomial(nodes - count, shares)
    return np.repeat(np.arange(count), sizes)


def group_log_factor(groups: np.ndarray, cross_factor: float) -> np.ndarray:
    """``log(cross_factor)`` where two nodes sit in different groups, else 0."""
    cross = groups[:, None] != groups[None, :]
    return np.where(cross, math.log(cross_factor), 0.0)


# ------------------------------------------------------------------ noise fields
def symmetric_normal(rng: np.random.Generator, nodes: int) -> np.ndarray:
    """A symmetric matrix of independent standard normals (one per node pair), 0 diagonal."""
    upper = np.triu(rng.standard_normal((nodes, nodes)), k=1)
    return upper + upper.T


def antisymmetric_normal(rng: np.random.Generator, nodes: int) -> np.ndarray:
    """An antisymmetric matrix of independent standard normals (``z[j, i] = -z[i, j]``)."""
    upper = np.triu(rng.standard_normal((nodes, nodes)), k=1)
    return upper - upper.T


def asymmetry_of(a: np.ndarray | float) -> np.ndarray | float:
    """Relative asymmetry ``|B_ij - B_ji| / mean(B_ij, B_ji)`` of a pair whose two
    directions are ``B * exp(+a/2)`` and ``B * exp(-a/2)``: ``2 tanh(|a| / 2)``."""
    return 2.0 * np.tanh(np.abs(a) / 2.0)


def log_split_of(asymmetry: float) -> float:
    """The ``a`` whose :func:`asymmetry_of` is ``asymmetry`` (inverse; needs < 2)."""
    return 2.0 * math.atanh(asymmetry / 2.0)


@lru_cache(maxsize=64)
def direction_scale(direction_sigma: float, clip: float) -> tuple[float, float]:
    """Scale ``s`` of the soft-clipped direction noise ``a = c tanh(s z / c)``, z ~ N(0, 1).

    ``direction_sigma`` is the standard deviation of each direction's independent
    log-deviation; two such directions differ by ``sqrt(2) * direction_sigma``, so
    their mean relative asymmetry is ``2 direction_sigma / sqrt(pi)`` (1.13 x; 4.0 %
    for docs/design.md's 0.035).  ``s`` is solved so that the *clipped* noise keeps that
    mean.  Returns ``(s, v)`` with ``v`` the variance that ``a / 2`` adds to each
    entry's log (about ``direction_sigma**2 / 2``).
    """
    target = 2.0 * direction_sigma / math.sqrt(math.pi)
    if direction_sigma == 0.0:
        return 0.0, 0.0
    if target >= 0.95 * clip:
        raise ValueError(f"direction_sigma={direction_sigma} is too large for clip={clip}")

    def mean_asym(scale: float) -> float:
        return float((_W * asymmetry_of(clip * np.tanh(scale * _Z / clip))).sum())

    lo, hi = 0.0, 1.0
    while mean_asym(hi) < target:
        hi *= 2.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if mean_asym(mid) < target else (lo, mid)
    scale = 0.5 * (lo + hi)
    var = float((_W * (clip * np.tanh(scale * _Z / clip) / 2.0) ** 2).sum())
    return scale, var


def direction_split(z: np.ndarray, direction_sigma: float, clip: float) -> np.ndarray:
    """Soft-clipped antisymmetric log split ``a`` from standard normals ``z`` (antisymmetric).

    >>> z = np.array([[0.0, 10.0], [-10.0, 0.0]])
    >>> bool(asymmetry_of(direction_split(z, 0.035, 0.15))[0, 1] < 0.15)
    True
    """
    scale, _ = direction_scale(direction_sigma, clip)
    return clip * np.tanh(scale * z / clip)


# ------------------------------------------------------------------ picking pairs
def upper_pairs(nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column indices of the node pairs i < j."""
    return np.triu_indices(nodes, k=1)


def pick_pairs(rng: np.random.Generator, candidates: np.ndarray, count: int) -> np.ndarray:
    """``count`` distinct entries of ``candidates`` (pair indices), without replacement."""
    count = int(min(max(count, 0), candidates.size))
    if count == 0:
        return np.zeros(0, dtype=np.int64)
    return np.sort(rng.choice(candidates, size=count, replace=False))


def set_symmetric(matrix: np.ndarray, rows: np.ndarray, cols: np.ndarray, values) -> None:
    """Write ``values`` at (rows, cols) and (cols, rows), in place."""
    matrix[rows, cols] = values
    matrix[cols, rows] = values


def pick_failed(rng: np.random.Generator, nodes: int, fraction: float) -> np.ndarray:
    """Symmetric boolean mask of failed node pairs, ``round(fraction x pairs)`` of them.

    A node never loses all its pairs (a cluster file with an isolated node is
    rejected by :class:`~pipette_cp.specs.cluster.ClusterSpec`): any node left with
    no live pair gets back the first of its failed pairs.
    """
    rows, cols = upper_pairs(nodes)
    chosen = pick_pairs(rng, np.arange(rows.size), round(fraction * rows.size))
    failed = np.zeros((nodes, nodes), dtype=bool)
    set_symmetric(failed, rows[chosen], cols[chosen], True)
    for node in range(nodes):
        if nodes > 1 and failed[node].sum() == nodes - 1:
            other = (node + 1) % nodes
            failed[node, other] = failed[other, node] = False
    return failed
