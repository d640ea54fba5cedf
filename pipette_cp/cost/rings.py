"""The ring order of a tensor-parallel group, chosen as NCCL chooses it.

NCCL does not run a group's ring in rank order: it searches the links among the
group's GPUs for the ring with the best bottleneck bandwidth (NCCL's topology
search, ``ncclTopoCompute``).  On a DGX-1 with V100 (hybrid cube-mesh NVLink, PCIe
between some pairs) the rank-order ring of 8 GPUs crosses a PCIe pair while an
all-NVLink ring exists, so the group runs at NVLink speed.  :func:`best_ring`
finds that ring for one group's bandwidth sub-matrix; :func:`ring_bandwidths`
gives the bottleneck of many groups of one matrix at once (what the
:class:`~pipette_cp.cost.evaluate.Evaluator` and the placement builder charge a
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
pair (bandwidth 0) on the ring makes it 0.
"""

from __future__ import annotations

import math
from functools import cache, lru_cache
from itertools import combinations, permutations

import numpy as np

from pipette_cp.cost import comm
from pipette_cp.errors import InfeasibleError
from pipette_cp.specs.hierarchy import LinkView

Ring = tuple[tuple[int, ...], float]

#: Groups of up to this many GPUs are solved exactly (all (k-1)! cyclic orders).
EXACT_MAX = 8
#: DFS steps one Hamiltonian-cycle search of the heuristic may take.
SEARCH_BUDGET = 10_000
_CACHE_MAX = 1 << 16
_CACHE: dict[bytes, Ring] = {}
#: Nodes of up to this many GPUs have every partition into tensor groups enumerated
#: (8 GPUs: 105 partitions into pairs, 35 into quads); larger ones take a local search.
PARTITION_EXACT_MAX = 8
#: Rounds of the swap search of :func:`best_partition` beyond the exact size.
PARTITION_ROUNDS = 32


def best_ring(bw: np.ndarray) -> Ring:
    """The cyclic order of ``0..k-1`` with the best bottleneck over ``bw`` and that
    bottleneck, bytes/s (the diagonal is ignored; 0 when every ring crosses a
    failed pair; ``inf`` for one GPU, which has no link).

    ``bw`` is the k x k directed bandwidth sub-matrix of one group.  Exact for
    k <= :data:`EXACT_MAX`; larger groups take a bottleneck-threshold search
    (never worse than rank order).  Rank order is returned whenever it is among
    the best (in particular when every link is equal, as inside a uniform NVLink
    node).  Results are cached by the matrix's bytes.

    >>> import numpy as np
    >>> bw = np.array([[0, 9, 1, 9], [9, 0, 9, 1], [1, 9, 0, 9], [9, 1, 9, 0]])
    >>> best_ring(bw)  # rank order is 9 all round
    ((0, 1, 2, 3), 9.0)
    >>> swapped = bw[[0, 2, 1, 3]][:, [0, 2, 1, 3]]  # ranks 1 and 2 swapped
    >>> best_ring(swapped)  # rank order would cross the slow pairs 0-1, 2-3
    ((0, 2, 1, 3), 9.0)
    """
    m = np.ascontiguousarray(bw, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] == 0:
        raise ValueError(f"expected a non-empty square matrix, got shape {m.shape}")
    key = m.tobytes()
    found = _CACHE.get(key)
    if found is None:
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.clear()
        found = _CACHE[key] = _solve(m)
    return found


def ring_bandwidths(bandwidth: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """The best ring's bottleneck (:func:`best_ring`) of every row of ``groups`` (GPU
    ids, one group per row) over the GPU x GPU matrix ``bandwidth``, bytes/s.

    A group whose rank-order ring already reaches an upper bound (the slowest of its
    GPUs' fastest outgoing and incoming links) takes it without a search: one
    vectorised pass covers every group of a uniform node.  The others are solved
    once per distinct GPU tuple (cached with the matrix, which must not change).
    """
    groups = np.asarray(groups, dtype=np.int64)
    count, k = groups.shape
    if k == 1:
        return np.full(count, math.inf)
    bound, flat_bw, solved = _matrix_state(bandwidth)
    flat = groups.ravel()
    succ = flat[_successors(count, k)]
    if isinstance(bandwidth, LinkView):
        links = bandwidth.fabric.bandwidth(flat, succ)
    else:
        links = flat_bw[flat * bandwidth.shape[1] + succ]
    out = links.reshape(count, k).min(axis=1)
    if (links >= bound[flat]).all():  # every rank-order link as fast as its GPU's bound
        return out
    for i in np.flatnonzero(out < bound[groups].min(axis=1)):
        key = groups[i].tobytes()
        if (value := solved.get(key)) is None:
            if len(solved) >= _CACHE_MAX:
                solved.clear()
            value = solved[key] = best_ring(bandwidth[np.ix_(groups[i], groups[i])])[1]
        out[i] = value
    return out


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


# ------------------------------------------------------------------ internals
_State = tuple[np.ndarray, np.ndarray, dict[bytes, float]]
#: Per matrix (by identity, holding it so that its id is not reused): every GPU's
#: fastest outgoing-or-incoming bound, the matrix flattened, and the bottleneck of the
#: groups solved so far.
_MATRICES: dict[int, tuple[np.ndarray, _State]] = {}


def _matrix_state(bandwidth: np.ndarray) -> _State:
    found = _MATRICES.get(id(bandwidth))
    if found is not None and found[0] is bandwidth:
        return found[1]
    if len(_MATRICES) >= 4:
        _MATRICES.pop(next(iter(_MATRICES)))
    if isinstance(bandwidth, LinkView):  # no matrix: a per-GPU upper bound, no flat copy
        state: _State = (bandwidth.fabric.gpu_bounds(), np.zeros(0), {})
        _MATRICES[id(bandwidth)] = (bandwidth, state)
        return state
    # the diagonal (0) never exceeds a link, so whole rows and columns bound the rings
    bound = np.minimum(bandwidth.max(axis=1), bandwidth.max(axis=0))
    state = (bound, np.ascontiguousarray(bandwidth).ravel(), {})
    _MATRICES[id(bandwidth)] = (bandwidth, state)
    return state


def _bottleneck(m: np.ndarray, ring: tuple[int, ...]) -> float:
    order = np.asarray(ring)
    return float(m[order, np.roll(order, -1)].min())


def _upper_bound(sub: np.ndarray) -> np.ndarray:
    """No ring beats the slowest of its GPUs' fastest outgoing (or incoming) link:
    per group of ``sub`` (..., k, k), the diagonal left out."""
    k = sub.shape[-1]
    off = np.where(np.eye(k, dtype=bool), -np.inf, sub)
    return np.minimum(off.max(axis=-1).min(axis=-1), off.max(axis=-2).min(axis=-1))


def _solve(m: np.ndarray) -> Ring:
    k = m.shape[0]
    rank = tuple(range(k))
    if k == 1:
        return rank, math.inf
    rank_bw = _bottleneck(m, rank)
    if k == 2 or rank_bw >= float(_upper_bound(m)):  # rank order is among the best
        return rank, rank_bw
    if k <= EXACT_MAX:
        orders, links = _cyclic_orders(k)
        values = m.ravel().take(links).min(axis=0)
        best = int(np.argmax(values))  # the first best: rank order on a tie
        return tuple(int(g) for g in orders[best]), float(values[best])
    return _threshold_search(m, rank, rank_bw)


@lru_cache(maxsize=64)
def _successors(count: int, k: int) -> np.ndarray:
    """Flat position of every rank's successor in its group's rank-order ring."""
    pos = np.arange(count * k).reshape(count, k)
    out = np.concatenate((pos[:, 1:], pos[:, :1]), axis=1).ravel()
    out.flags.writeable = False
    return out


@cache
def _cyclic_orders(k: int) -> tuple[np.ndarray, np.ndarray]:
    """Every cyclic order of ``0..k-1`` starting at 0, rank order first, ((k-1)!, k),
    and its links ``u -> next(u)`` as flat indices of a k x k matrix, (k, (k-1)!)."""
    rest = np.array(list(permutations(range(1, k))), dtype=np.intp).reshape(-1, k - 1)
    orders = np.hstack((np.zeros((len(rest), 1), dtype=np.intp), rest))
    links = np.ascontiguousarray((orders * k + np.roll(orders, -1, axis=1)).T)
    for a in (orders, links):
        a.flags.writeable = False
    return orders, links


def _threshold_search(m: np.ndarray, rank: tuple[int, ...], rank_bw: float) -> Ring:
    """Binary search over the distinct link bandwidths above rank order's bottleneck for
    the largest threshold whose links admit a Hamiltonian cycle (a budgeted DFS)."""
    off = ~np.eye(m.shape[0], dtype=bool)
    levels = np.unique(m[off])
    levels = levels[(levels > rank_bw) & (levels <= float(_upper_bound(m)))]
    best: Ring = (rank, rank_bw)
    lo, hi = 0, len(levels) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        cycle = _hamiltonian_cycle((m >= levels[mid]) & off)
        if cycle is None:
            hi = mid - 1
            continue
        best = (cycle, _bottleneck(m, cycle))
        lo = int(np.searchsorted(levels, best[1], side="right"))
    return best


def _hamiltonian_cycle(adj: np.ndarray, budget: int = SEARCH_BUDGET) -> tuple[int, ...] | None:
    """A directed Hamiltonian cycle of ``adj`` from GPU 0 (a DFS visiting the successor
    with the fewest onward choices first), or None if none is found in ``budget`` steps."""
    import networkx as nx  # only the rare large groups need it

    k = len(adj)
    if not (adj.any(axis=0).all() and adj.any(axis=1).all()):
        return None
    if not nx.is_strongly_connected(
        nx.from_numpy_array(adj.astype(np.int8), create_using=nx.DiGraph)
    ):
        return None
    succ = [np.flatnonzero(adj[u]).tolist() for u in range(k)]
    visited = [False] * k
    visited[0] = True
    path = [0]

    def choices(u: int) -> list[int]:
        free = [v for v in succ[u] if not visited[v]]
        return sorted(free, key=lambda v: sum(not visited[w] for w in succ[v]))

    stack = [iter(choices(0))]
    for _ in range(budget):
        if not stack:
            return None
        v = next(stack[-1], None)
        if v is None:
            stack.pop()
            visited[path.pop()] = False
            continue
        if visited[v]:
            continue
        if len(path) == k - 1:
            if adj[v, 0]:
                return (*path, v)
            continue
        visited[v] = True
        path.append(v)
        stack.append(iter(choices(v)))
    return None
