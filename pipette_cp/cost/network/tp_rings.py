"""The ring order of a tensor-parallel group, chosen as NCCL chooses it.

NCCL does not run a group's ring in rank order: it searches the links among the
group's GPUs for the ring with the best bottleneck bandwidth (NCCL's topology
search, ``ncclTopoCompute``).  On a DGX-1 with V100 (hybrid cube-mesh NVLink, PCIe
between some pairs) the rank-order ring of 8 GPUs crosses a PCIe pair while an
all-NVLink ring exists, so the group runs at NVLink speed.  :func:`best_ring`
finds that ring for one group's bandwidth sub-matrix; :func:`ring_bandwidths`
gives the bottleneck of many groups of one matrix at once (what the
:class:`~pipette_cp.cost.evaluator.evaluate.Evaluator` and the placement builder charge a
tensor-parallel group).

Data-parallel rings are not reordered here: a DP ring runs over the replicas of
one stage in replica order, the order the placement sets (the placement solvers
order the replicas themselves).

Which GPUs form a group matters where a node's links differ (the cube mesh, PCIe
switches, a failed NVLink): :func:`best_partition` cuts a node's GPUs into the
tensor groups with the fastest rings (the slowest group first), and
:func:`partition_is_complete` says whether no other cut could do better for any
placement (a symmetry of the node maps every cut onto the chosen one).

A ring is directed: its bottleneck is the slowest link ``u -> next(u)``; a failed
pair (bandwidth 0) on the ring makes it 0.  The ring search itself (:func:`best_ring`,
:func:`ring_bandwidths`) is in :mod:`pipette_cp.cost.network.ring_search`, re-exported here.
"""

from __future__ import annotations

from functools import cache, lru_cache
from itertools import combinations, permutations

import numpy as np

from pipette_cp.cost.network import collectives as comm
from pipette_cp.cost.network.ring_search import (
    EXACT_MAX,
    SEARCH_BUDGET,
    Ring,
    best_ring,
    ring_bandwidths,
)
from pipette_cp.errors import InfeasibleError

__all__ = [
    "EXACT_MAX",
    "PARTITION_EXACT_MAX",
    "PARTITION_ROUNDS",
    "SEARCH_BUDGET",
    "Ring",
    "best_partition",
    "best_ring",
    "group_bandwidths",
    "partition_is_complete",
    "partitions",
    "ring_bandwidths",
    "ring_links",
]

#: Nodes of up to this many GPUs have every partition into tensor groups enumerated
#: (8 GPUs: 105 partitions into pairs, 35 into quads); larger ones take a local search.
PARTITION_EXACT_MAX = 8
#: Rounds of the swap search of :func:`best_partition` beyond the exact size.
PARTITION_ROUNDS = 32


def group_bandwidths(
    fabric: comm.Fabric, groups: np.ndarray, what: str = "a tensor-parallel group"
) -> np.ndarray:
    """:func:`ring_bandwidths` over ``fabric``'s matrix, raising
    :class:`~pipette_cp.errors.InfeasibleError` naming ``what`` and the failed pairs
    of its rank-order ring when some group has no ring avoiding failed pairs."""
    groups = np.asarray(groups, dtype=np.int64)
    out = ring_bandwidths(fabric.bandwidth, groups)
    if not out.all():
        bad = groups[out <= 0]
        what = f"{what} (no ring order of its GPUs avoids failed pairs; rank order shown)"
        comm.check_links(fabric, bad, np.roll(bad, -1, axis=1), what)
        raise InfeasibleError(f"{what}: GPUs {bad[0].tolist()} have no ring avoiding failed pairs")
    return out


def ring_links(ring: tuple[int, ...]) -> list[tuple[int, int]]:
    """The directed links ``u -> next(u)`` of a ring (none for one GPU)."""
    return [(a, ring[(i + 1) % len(ring)]) for i, a in enumerate(ring)] if len(ring) > 1 else []


# ------------------------------------------------------------------ tensor groups
@cache
def partitions(k: int, size: int) -> np.ndarray:
    """Every partition of GPUs ``0..k-1`` into groups of ``size``, (count, k // size,
    size): each group ascending, groups by their first GPU, the aligned blocks
    ``[j size, (j+1) size)`` first (read-only).

    >>> partitions(4, 2).tolist()
    [[[0, 1], [2, 3]], [[0, 2], [1, 3]], [[0, 3], [1, 2]]]
    >>> [len(partitions(8, s)) for s in (1, 2, 4, 8)]
    [1, 105, 35, 1]
    """
    if size < 1 or k % size:
        raise ValueError(f"cannot cut {k} GPUs into groups of {size}")

    def cuts(rest: tuple[int, ...]) -> list[tuple[tuple[int, ...], ...]]:
        if not rest:
            return [()]
        first, others = rest[0], rest[1:]
        out = []
        for combo in combinations(others, size - 1):
            left = tuple(x for x in others if x not in combo)
            out += [((first, *combo), *tail) for tail in cuts(left)]
        return out

    array = np.array(cuts(tuple(range(k))), dtype=np.int64).reshape(-1, k // size, size)
    array.flags.writeable = False
    return array


def _partition_keys(bw: np.ndarray, cuts: np.ndarray) -> list[tuple]:
    """Sort key of each partition (larger is better): its groups' ring bandwidths,
    slowest first; being the aligned one; then the rank-to-rank links between its
    groups (the slowest pair of equal ranks of each ordered group pair), slowest first."""
    count, m, size = cuts.shape
    rings = ring_bandwidths(bw, cuts.reshape(-1, size)).reshape(count, m)
    a, b = np.nonzero(~np.eye(m, dtype=bool))
    pairs = bw[cuts[:, a], cuts[:, b]].min(axis=2) if m > 1 else np.zeros((count, 0))
    aligned = np.arange(m * size).reshape(m, size)
    return [
        (tuple(np.sort(rings[i])), bool(np.array_equal(cuts[i], aligned)),
         tuple(np.sort(pairs[i])))
        for i in range(count)
    ]  # fmt: skip


def best_partition(bw: np.ndarray, size: int) -> np.ndarray:
    """The partition of a node's GPUs into groups of ``size`` with the best rings.

    ``bw`` is the node's k x k bandwidth block; the result is (k // size, size) local
    GPU ids, each group ascending.  Compared lexicographically: the groups' best-ring
    bandwidths (:func:`ring_bandwidths`) slowest first, then the aligned blocks
    (kept whenever they are among the best, so a node where they are changes
    nothing), then the links between groups, slowest first.  Every partition is
    compared up to :data:`PARTITION_EXACT_MAX` GPUs; larger nodes start from the
    aligned blocks and swap GPUs between groups while that improves the key.

    >>> import numpy as np
    >>> bw = np.array([[0, 1, 1, 9], [1, 0, 9, 1], [1, 9, 0, 1], [9, 1, 1, 0]])
    >>> best_partition(bw, 2).tolist()  # the aligned pairs (0, 1), (2, 3) are slow
    [[0, 3], [1, 2]]
    """
    m = np.ascontiguousarray(bw, dtype=np.float64)
    return _best_partition(m.tobytes(), m.shape[0], size).copy()


@lru_cache(maxsize=256)
def _best_partition(matrix: bytes, k: int, size: int) -> np.ndarray:
    m = np.frombuffer(matrix, dtype=np.float64).reshape(k, k)
    if size in (1, k) or k <= PARTITION_EXACT_MAX:
        cuts = partitions(k, size)
        keys = _partition_keys(m, cuts)
        return cuts[max(range(len(cuts)), key=keys.__getitem__)]
    best = np.arange(k).reshape(-1, size)
    key = _partition_keys(m, best[None])[0]
    for _ in range(PARTITION_ROUNDS):
        trials = []
        for g, h in combinations(range(len(best)), 2):
            for i in range(size):
                for j in range(size):
                    trial = best.copy()
                    trial[g, i], trial[h, j] = best[h, j], best[g, i]
                    trial.sort(axis=1)
                    trials.append(trial[np.argsort(trial[:, 0])])
        keys = _partition_keys(m, np.stack(trials))
        top = max(range(len(trials)), key=keys.__getitem__)
        if keys[top] <= key:
            break
        best, key = trials[top], keys[top]
    best.flags.writeable = False
    return best


def partition_is_complete(bw: np.ndarray, gpus: np.ndarray, groups: np.ndarray) -> bool:
    """Whether the tensor groups ``groups`` (GPU ids, ascending rows) of the GPUs
    ``gpus`` of one node match every other grouping: for each partition of ``gpus``
    into groups of that size, some permutation of the node's GPUs keeps every entry
    of the GPU x GPU matrix ``bw`` (inside the node, and to and from every other GPU)
    and maps the chosen groups onto that partition, each group in rank order.  Then
    a placement on any groups of the node has a twin on the chosen ones with the
    same links, so the same time: a proof over the chosen groups holds for all.

    True for one group or groups of one GPU (a single partition) and for nodes whose
    GPUs are all alike; otherwise decided by enumerating the node's symmetries up to
    :data:`PARTITION_EXACT_MAX` GPUs (False beyond).
    """
    gpus, groups = np.asarray(gpus, dtype=np.int64), np.asarray(groups, dtype=np.int64)
    k, size = len(gpus), groups.shape[1]
    if size in (1, k):
        return True
    inside = np.ascontiguousarray(bw[np.ix_(gpus, gpus)])
    outside = np.setdiff1d(np.arange(bw.shape[0]), gpus)
    edges = np.hstack((bw[np.ix_(gpus, outside)], bw[np.ix_(outside, gpus)].T))
    _, label = np.unique(edges, axis=0, return_inverse=True)
    off = ~np.eye(k, dtype=bool)
    if (label == label[0]).all() and np.ptp(inside[off]) == 0:
        return True  # every permutation of the node keeps every link
    if k > PARTITION_EXACT_MAX:
        return False
    local = np.searchsorted(gpus, groups) if (np.diff(gpus) > 0).all() else None
    if local is None:
        return False
    return _covers(inside.tobytes(), k, label.ravel().tobytes(), local.tobytes(), size)


@lru_cache(maxsize=256)
def _covers(inside: bytes, k: int, label: bytes, local: bytes, size: int) -> bool:
    m = np.frombuffer(inside, dtype=np.float64).reshape(k, k)
    labels = np.frombuffer(label, dtype=np.int64)
    groups = np.frombuffer(local, dtype=np.int64).reshape(-1, size)
    perms = np.array(list(permutations(range(k))), dtype=np.int64)
    keep = (labels[perms] == labels).all(axis=1)
    perms = perms[keep]
    same = (m[perms[:, :, None], perms[:, None, :]] == m).all(axis=(1, 2))
    perms = perms[same]  # the symmetries of the node
    images = perms[:, groups]  # (symmetries, groups, size)
    ordered = (np.diff(images, axis=2) > 0).all(axis=(1, 2))
    seen = {tuple(sorted(map(tuple, image))) for image in images[ordered].tolist()}
    return len(seen) == len(partitions(k, size))
