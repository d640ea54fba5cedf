"""Large clusters: critical-unit local search, then large-neighbourhood search (LNS).

The full master grows with (units x places)^2; beyond a few dozen nodes it is
too large to prove.  The search here keeps the exact objective:

1. :func:`local_search` moves or swaps the units at the ends of each class's
   slowest flow (the flows that set a hop, ring or embedding time), scoring
   every move with the model (first: fewer flows on failed links; then: the
   iteration time); it also repairs starts that use failed links.
2. :func:`lns` repeatedly frees the units of a few places (those holding
   critical units, plus random ones), fixes every other unit and solves the
   restricted master exactly with Kelley's loop
   (:func:`~pipette_cp.solvers.placement_kelley.kelley`), starting from the
   incumbent, so a step never makes it worse.  The neighbourhood grows after
   fast proofs and shrinks after time-outs.

The bound reported for such solves is the analytic one
(:func:`~pipette_cp.solvers.placement_kelley.lower_x`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from pipette_cp.errors import PipetteError
from pipette_cp.solvers.placement_backend import Backend
from pipette_cp.solvers.placement_data import PlacementData
from pipette_cp.solvers.placement_kelley import OPTIMALITY_GAP, CutPool, kelley


def _edge_arrays(data: PlacementData) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per family: (class index, u, v) of every communicating unit pair, as arrays."""
    out = {}
    for family, edges in data.edges().items():
        table = np.array(edges, dtype=np.int64).reshape(-1, 3)
        out[family] = (table[:, 0], table[:, 1], table[:, 2])
    return out


def failed_flows(data: PlacementData, assign: np.ndarray) -> np.ndarray:
    """Units at either end of a flow over a failed pair (with repetition)."""
    bad_dir = ~np.isfinite(data.inv_bw)
    bad_any = bad_dir | bad_dir.T
    out: list[np.ndarray] = []
    for family, (_, u, v) in _edge_arrays(data).items():
        if len(u):
            p, q = assign[u], assign[v]
            bad = (bad_dir if family == "ring" else bad_any)[p, q] & (p != q)
            out.extend((u[bad], v[bad]))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def critical_units(data: PlacementData, assign: np.ndarray) -> np.ndarray:
    """Units at the ends of each class's slowest flow (and of failed flows)."""
    bad = failed_flows(data, assign)
    if len(bad):
        return np.unique(bad)
    costs = {"hop": (data.hop_cost(), data.hop_cost().T), "emb": (data.emb_cost(),)}
    out: list[int] = []
    for family, (idx, u, v) in _edge_arrays(data).items():
        if not len(u):
            continue
        p, q = assign[u], assign[v]
        mats = costs.get(family, (data.inv_bw,))
        for mat in mats:
            cost = mat[p, q] if family != "ring" else data.ring_bytes[idx] * mat[p, q]
            for i in np.unique(idx):
                sel = np.flatnonzero(idx == i)
                k = sel[np.argmax(cost[sel])]
                out.extend((u[k], v[k]))
    return np.unique(np.array(out, dtype=np.int64))


def _score(data: PlacementData, assign: np.ndarray) -> tuple[int, float]:
    bad = len(failed_flows(data, assign))
    return (bad, float("inf")) if bad else (0, data.value(assign))


def local_search(
    data: PlacementData,
    assign: np.ndarray,
    deadline: float,
    rng: np.random.Generator,
    repair_only: bool = False,
) -> tuple[np.ndarray, float]:
    """Best-improvement moves of critical units (swap with any unit, or move to a
    free slot) until none improves, the deadline passes, or (``repair_only``) no
    flow uses a failed link any more.  Returns the assignment and its value (inf
    if it still uses a failed link)."""
    assign = np.array(assign, dtype=np.int64)
    score = _score(data, assign)
    used = np.bincount(assign, minlength=data.num_places)
    stages = np.arange(data.num_units) // data.plan.dp
    while time.perf_counter() < deadline:
        if repair_only and score[0] == 0:
            break
        improved = False
        for u in rng.permutation(critical_units(data, assign)):
            best_move, best_score = None, score
            su, pu = stages[u], assign[u]
            spare = np.flatnonzero((used < data.capacity) & data.allowed[su])
            partners = np.flatnonzero((assign != pu) & data.allowed[stages, pu])
            partners = partners[data.allowed[su, assign[partners]]]
            for kind, targets in (("move", spare), ("swap", partners)):
                for w in targets:
                    trial = assign.copy()
                    if kind == "move":
                        trial[u] = w
                    else:
                        trial[u], trial[w] = assign[w], pu
                    s = _score(data, trial)
                    if s < best_score:
                        best_move, best_score = trial, s
                if time.perf_counter() > deadline:
                    break
            if best_move is not None and best_score < score:
                assign, score, improved = best_move, best_score, True
                used = np.bincount(assign, minlength=data.num_places)
            if time.perf_counter() > deadline:
                break
        if not improved:
            break
    return assign, score[1]


def lns(
    data: PlacementData,
    assign: np.ndarray,
    pool: CutPool,
    make_backend: Callable[[], Backend],
    *,
    deadline: float,
    seed: int = 0,
    workers: int = 1,
    size: int = 8,
    bound_s: float = 0.0,
) -> tuple[np.ndarray, float, int]:
    """Improve ``assign`` by exact re-solves of small neighbourhoods until the deadline,
    or until it meets the proven ``bound_s``.

    Returns the best assignment, its value and the number of neighbourhoods solved."""
    rng = np.random.default_rng(seed)
    best, value = np.asarray(assign), data.value(assign)
    steps = 0
    while deadline - time.perf_counter() > 0.5 and np.isfinite(value):
        if value - bound_s <= OPTIMALITY_GAP * value:
            break
        critical = rng.permutation(np.unique(best[critical_units(data, best)]))
        places = {int(p) for p in critical[: max(size - 2, 1)]}
        empty = set(np.flatnonzero(np.bincount(best, minlength=data.num_places) < data.capacity))
        others = [int(p) for p in rng.permutation(data.num_places) if p not in places]
        # a few free places, if any, so units can move off their nodes
        for p in [p for p in others if p in empty][:2] + others:
            if len(places) >= max(size, 2):
                break
            places.add(p)
        chosen = np.array(sorted(places))
        domains = []
        for u in range(data.num_units):
            if best[u] in places:
                ok = chosen[data.allowed[data.stage_of(u), chosen]]
                domains.append(ok)
            else:
                domains.append(np.array([best[u]]))
        left = deadline - time.perf_counter()
        sub = time.perf_counter() + min(left, max(1.0, 0.15 * left))
        try:
            res = kelley(data, make_backend, domains=domains, start=best, pool=pool,
                         deadline=sub, workers=workers, seed=seed + steps, symmetry=False)  # fmt: skip
        except PipetteError:
            size = max(2, size - 1)
            continue
        steps += 1
        if res.value_s < value * (1 - 1e-12):
            best, value = res.assign, res.value_s
        size = min(size + 2, data.num_places) if res.status == "optimal" else max(2, size - 2)
    return best, value, steps
