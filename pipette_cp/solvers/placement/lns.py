"""Large clusters: large-neighbourhood search (LNS) over the placement master.

The full master grows with (units x places)^2; beyond a few dozen nodes it is
too large to prove.  :func:`lns` keeps the exact objective: it repeatedly frees
the units of a few places (those holding critical units,
:func:`~pipette_cp.solvers.placement.local_search.critical_units`, plus random
ones), fixes every other unit and solves the restricted master exactly with
Kelley's loop (:func:`~pipette_cp.solvers.placement.kelley.kelley`), starting
from the incumbent, so a step never makes it worse.  The neighbourhood grows
after fast proofs and shrinks after time-outs.

The bound reported for such solves is the analytic one
(:func:`~pipette_cp.solvers.placement.kelley.lower_x`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pipette_cp.errors import PipetteError
from pipette_cp.solvers import work_meter as work
from pipette_cp.solvers.placement.backend import Backend
from pipette_cp.solvers.placement.data import PlacementData
from pipette_cp.solvers.placement.kelley import OPTIMALITY_GAP, CutPool, kelley
from pipette_cp.solvers.placement.local_search import critical_units


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
    while deadline - work.now() > 0.5 and np.isfinite(value) and not work.exhausted():
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
        left = deadline - work.now()
        sub = work.now() + min(left, max(1.0, 0.15 * left))
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
