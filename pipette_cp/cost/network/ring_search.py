"""NCCL's ring search over a group's GPUs: the ring order with the best bottleneck.

:func:`best_ring` solves one group's k x k bandwidth sub-matrix (exactly up to
:data:`EXACT_MAX` GPUs, over every cyclic order; beyond, a bottleneck-threshold search
for a Hamiltonian cycle), cached by the matrix's bytes; :func:`ring_bandwidths` gives
the best bottleneck of many groups of one GPU x GPU matrix at once, skipping the search
wherever rank order already reaches its bound.  :mod:`pipette_cp.cost.network.tp_rings` builds the
tensor-parallel groups and their partitions of a node on these (and re-exports them).
"""

from __future__ import annotations

import math
from functools import cache, lru_cache
from itertools import permutations

import numpy as np

from pipette_cp.specs.hierarchy import LinkView

Ring = tuple[tuple[int, ...], float]

#: Groups of up to this many GPUs are solved exactly (all (k-1)! cyclic orders).
EXACT_MAX = 8
#: DFS steps one Hamiltonian-cycle search of the heuristic may take.
SEARCH_BUDGET = 10_000
_CACHE_MAX = 1 << 16
_CACHE: dict[bytes, Ring] = {}


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
