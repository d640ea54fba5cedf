"""Critical-unit local search over placements, scored by the placement model.

:func:`local_search` moves or swaps the units at the ends of each class's
slowest flow (the flows that set a hop, ring or embedding time), scoring every
move with :meth:`~pipette_cp.solvers.placement.data.PlacementData.value`
(first: fewer flows on failed links; then: the iteration time); it also repairs
starts that use failed links.  It needs no solver: the greedy baseline and the
exact methods' seeds use it, and :mod:`~pipette_cp.solvers.placement.lns` picks
its neighbourhoods with :func:`critical_units`.
"""

from __future__ import annotations

import numpy as np

from pipette_cp.solvers import work_meter as work
from pipette_cp.solvers.placement.data import Family, PlacementData


def _edge_arrays(data: PlacementData) -> list[tuple[Family, np.ndarray, np.ndarray, np.ndarray]]:
    """Per family with flows: it and (class index, u, v) of its unit pairs, as arrays."""
    key = ("edge arrays",)
    if key not in data.memo:
        out = []
        for family, edges in data.flows():
            table = np.array(edges, dtype=np.int64).reshape(-1, 3)
            out.append((family, table[:, 0], table[:, 1], table[:, 2]))
        data.memo[key] = out
    return data.memo[key]


def failed_flows(data: PlacementData, assign: np.ndarray) -> np.ndarray:
    """Units at either end of a flow over a failed pair (with repetition)."""
    bad_dir = ~np.isfinite(data.inv_bw)
    bad_any = bad_dir | bad_dir.T
    out: list[np.ndarray] = []
    for family, _, u, v in _edge_arrays(data):
        if len(u):
            p, q = assign[u], assign[v]
            bad = (bad_dir if family.one_way else bad_any)[p, q] & (p != q)
            out.extend((u[bad], v[bad]))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def critical_units(data: PlacementData, assign: np.ndarray) -> np.ndarray:
    """Units at the ends of each class's slowest flow (and of failed flows)."""
    bad = failed_flows(data, assign)
    if len(bad):
        return np.unique(bad)
    out: list[int] = []
    for family, idx, u, v in _edge_arrays(data):
        if not len(u):
            continue
        p, q = assign[u], assign[v]
        flows = family.flow_costs(data, idx, p, q)
        for cost in (data.inv_bw[p, q],) if flows is None else flows:
            for i in np.unique(idx):
                sel = np.flatnonzero(idx == i)
                k = sel[np.argmax(cost[sel])]
                out.extend((u[k], v[k]))
    return np.unique(np.array(out, dtype=np.int64))


def _score(data: PlacementData, assign: np.ndarray) -> tuple[int, float]:
    work.spend(work.TRIAL_TICKS + work.TRIAL_TICKS_PER_UNIT * data.num_units)
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
    free slot) until none improves, the deadline passes (:func:`pipette_cp.solvers.work_meter.now`:
    under the work meter, a trial's work; and at the meter's cap), or (``repair_only``)
    no flow uses a failed link any more.  Returns the assignment and its value (inf
    if it still uses a failed link)."""
    assign = np.array(assign, dtype=np.int64)
    score = _score(data, assign)
    used = np.bincount(assign, minlength=data.num_places)
    stages = np.arange(data.num_units) // data.plan.replicas
    while work.now() < deadline and not work.exhausted():
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
                if work.now() > deadline or work.exhausted():
                    break
            if best_move is not None and best_score < score:
                assign, score, improved = best_move, best_score, True
                used = np.bincount(assign, minlength=data.num_places)
            if work.now() > deadline or work.exhausted():
                break
        if not improved:
            break
    return assign, score[1]
