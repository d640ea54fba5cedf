"""Kelley's cutting-plane loop over the placement master, and the analytic bound.

The iteration time is a convex, non-decreasing, piecewise-linear function
``f(x)`` of the placement-dependent inputs ``x``
(:mod:`pipette_cp.solvers.placement.data`), so the master minimises ``t``
subject to cuts ``t >= f(x_k) + g_k (x - x_k)`` (:func:`supporting_cut`, Kelley
1960) at the inputs ``x_k`` of the placements found so far.  Every cut
under-estimates ``f``, so the master's optimum is a lower bound; a placement
whose true ``f`` meets that bound is optimal.  Each round re-solves the master
warm-started with the best placement so far (never worse than its hint).

The analytic bounds on the inputs (:func:`lower_x`, :func:`two_level_floor_x`,
:func:`worst_x`) come from the problem's families
(:mod:`~pipette_cp.solvers.placement.families`): the per-class bound of their flow
classes is computed here, and each family adds its own (``lower``, ``floor``, ``worst``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from pipette_cp.errors import InfeasibleError, SolverTimeoutError
from pipette_cp.solvers import work_meter as work
from pipette_cp.solvers.cuts import supporting_cut
from pipette_cp.solvers.placement.backend import CUT_GRID, Backend
from pipette_cp.solvers.placement.data import PlacementData
from pipette_cp.solvers.placement.family import FlowClass
from pipette_cp.solvers.placement.model import PlacementModel

#: Relative gap under which a placement counts as optimal (the master works in
#: 1 ns quanta, so closer is rounding noise).
OPTIMALITY_GAP = 1e-6
#: Slopes this close to a grid point of :data:`CUT_GRID` (in grid units) are that point:
#: finite differences carry ~1e-9 s/s of rounding, and rounding a slope up costs the
#: cut only the raise times the input's largest value over all placements.
SNAP_WINDOW = 1e-2
#: Recorded solutions of a master solve that also get a cut.
MORE_CUTS = 8
#: Largest number of places for which the ring connectivity bound is computed.
RING_BOUND_PLACES = 1024


@dataclass
class CutPool:
    """Snapped cuts ``(intercept_s, gradient)``, shared by every master of one problem."""

    data: PlacementData
    upper_s: float
    #: on the work clock: a cut being built past it raises SolverTimeoutError
    deadline: float = math.inf
    cuts: list[tuple[float, np.ndarray]] = field(default_factory=list)
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    _worst: np.ndarray | None = field(default=None, repr=False)

    def add_at(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        """Add (and return) the snapped supporting cut of ``f`` at ``x``."""
        work.spend(work.POOL_CUT_TICKS)
        try:
            cut = supporting_cut(self.data.total_time_s, x, rng=self.rng,
                                 expired=lambda: work.now() > self.deadline)  # fmt: skip
            intercept, g = cut.intercept, cut.gradient.copy()
        except ValueError:  # no agreeing quotients near x: the flat cut at the floor,
            # valid because f is non-decreasing and every placement's inputs lie above it
            intercept, g = self.data.total_time_s(lower_x(self.data)), np.zeros(x.shape)
        if self._worst is None:  # inputs no placement exceeds
            self._worst = worst_x(self.data)
        # time inputs of any placement (and of any improving plan)
        ub = np.minimum(np.full(g.shape, 2.0 * self.upper_s), np.maximum(self._worst, x))
        booleans = self.data.xi.booleans
        ub[booleans] = 1.0
        # f is non-decreasing: a negative gradient is finite-difference noise
        intercept += float(np.minimum(g, 0.0) @ ub)
        g = np.maximum(g, 0.0)
        timed = np.ones(g.shape, dtype=bool)
        timed[booleans] = False
        scaled = g[timed] * CUT_GRID
        near = np.round(scaled)
        # a slope within rounding of a grid point is that point (rounded up: paid for
        # below, over every placement's inputs); else the grid point under it
        close = np.abs(scaled - near) < SNAP_WINDOW
        snapped = np.where(close, near, np.floor(scaled)) / CUT_GRID
        raise_by = np.maximum(snapped - g[timed], 0.0)
        intercept -= float(raise_by @ ub[timed])  # stays below f wherever x <= ub
        g[timed] = snapped
        self.cuts.append((intercept, g))
        return intercept, g


def class_costs(data: PlacementData) -> list[FlowClass]:
    """``(position in x, pair cost matrix, stage of u, stage of v, key)`` of every flow
    class of every family (classes of one key have one cost matrix)."""
    return [c for family in data.families for c in family.classes(data)]


def ring_bound(cost: np.ndarray, capacity: np.ndarray, size: int) -> float:
    """Least possible slowest link of a ring of ``size`` units over places with ``cost``.

    The ring's places either are one place holding all of it (its own cost on the
    diagonal) or must be connected by its links; joining pairs cheapest first
    (Kruskal, each pair at its cheaper direction), no ring can be cheaper than the
    pair at which some group of places first holds ``size`` units."""
    n = len(capacity)
    single = np.where(capacity >= size, np.diagonal(cost), np.inf)
    best = float(single.min(initial=np.inf))
    both = np.minimum(cost, cost.T)
    i, j = np.triu_indices(n, k=1)
    values = both[i, j]
    keep = np.isfinite(values) & (values < best)
    i, j, values = i[keep], j[keep], values[keep]
    parent, held = np.arange(n), capacity.astype(np.int64).copy()

    def root(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    # the cheapest pairs first, in bands of values (a ring usually closes long before
    # every pair is sorted); a band takes every pair up to its top value, ties included,
    # so no pair is skipped and the answer (the least value whose pairs connect enough
    # capacity) is the full sort's
    low, count = -np.inf, 4 * n
    while True:
        rest = values > low
        if not rest.any():
            break
        pending = values[rest]
        top = np.partition(pending, count - 1)[count - 1] if count < len(pending) else np.inf
        chunk = np.flatnonzero(rest & (values <= top))
        chunk = chunk[np.argsort(values[chunk], kind="stable")]
        low, count = top, 4 * count
        for a, b, v in zip(i[chunk], j[chunk], values[chunk], strict=True):
            ra, rb = root(int(a)), root(int(b))
            if ra != rb:
                parent[rb] = ra
                held[ra] += held[rb]
                if held[ra] >= size:
                    return float(v)
    return best if np.isfinite(best) else 0.0


def lower_x(data: PlacementData, upper: np.ndarray | None = None) -> np.ndarray:
    """Inputs no placement can beat, one class at a time (so ``f`` of it bounds
    every placement, ``f`` being non-decreasing).

    Each class (a boundary's hops, a stage's ring, the embedding pairs) has ``dp``
    flows from distinct units; each unit's cheapest flow is at least the cheapest
    pair from its place, and ``dp`` units fill at least the ``dp`` cheapest places
    (counted with their capacity): the class maximum is at least the ``dp``-th
    smallest of those row minima (and of the column minima).  Pairs costlier than
    ``upper`` (a class's largest value in any improving placement) are left out.  Each
    family then raises its other inputs (its ``lower``: a DP ring leaves a node unless
    a node holds two units)."""
    d = data
    x = np.zeros(d.xi.size)
    masks = [row.tobytes() for row in d.allowed]
    for i, cost, a, b, key in class_costs(d):
        top = None if upper is None else float(upper[i])
        # a class's value depends on its costs, its stages' places and its cap only
        memo_key = ("lower", key, masks[a], masks[b], a == b, top)
        if memo_key not in d.memo:
            d.memo[memo_key] = _class_lower(d, cost, a, b, top)
        x[i] = d.memo[memo_key]
    for family in d.families:
        family.lower(d, x)
    return x


def _class_lower(d: PlacementData, cost: np.ndarray, a: int, b: int, top: float | None) -> float:
    """:func:`lower_x` of one class with flows from stage ``a`` to ``b`` over ``cost``."""
    dp = d.plan.replicas
    rows, cols = np.flatnonzero(d.allowed[a]), np.flatnonzero(d.allowed[b])
    c = cost[np.ix_(rows, cols)].copy()
    c[(rows[:, None] == cols[None, :]) & (d.capacity[rows] < 2)[:, None]] = np.inf
    if top is not None:
        c[c > top] = np.inf
    value = 0.0
    for mins, places in ((c.min(axis=1), rows), (c.min(axis=0), cols)):
        ranked = np.sort(np.repeat(mins, d.capacity[places]))
        least = float(ranked[min(dp, len(ranked)) - 1])
        value = max(value, least if np.isfinite(least) else 0.0)
    if a == b and len(rows) <= RING_BOUND_PLACES:  # a DP ring: it must connect its places
        value = max(value, ring_bound(c, d.capacity[rows], dp))
    return value


def two_level_floor_x(data: PlacementData) -> np.ndarray:
    """:func:`lower_x` with each family's inputs lowered to what any algorithm the
    Evaluator's ``best`` may choose could take (each stage's DP ring input to NCCL's
    two-level all-reduce at best,
    :meth:`~pipette_cp.solvers.placement.families.dp_rings.DataParallelRings.floor`),
    so ``f`` of it bounds every placement under that Evaluator."""
    x = lower_x(data)
    for family in data.families:
        family.floor(data, x)
    return x


def worst_x(data: PlacementData) -> np.ndarray:
    """Inputs no placement exceeds: each class at its dearest usable pair, raised by its
    family (a whole node's flows sharing its NICs, the groups' slowest flows); every
    indicator at 1.  ``f`` of it bounds every placement from above."""
    x = np.ones(data.xi.size)
    for i, cost, *_ in class_costs(data):
        x[i] = float(cost[np.isfinite(cost)].max(initial=0.0))
    for family in data.families:
        family.worst(data, x)
    return x


def upper_x(pool: CutPool, lower: np.ndarray, upper_s: float) -> np.ndarray:
    """Largest value of each input in any placement no slower than ``upper_s``.

    Every cut ``t >= a + g x`` with the other inputs at their lower bounds gives
    ``x_i <= lower_i + (upper_s - a - g lower) / g_i`` (reduced-cost fixing); an
    indicator whose coefficient exceeds the slack must be 0."""
    ux = np.full(lower.shape, np.inf)
    booleans = pool.data.xi.booleans
    ux[booleans] = 1.0
    margin = 1e-9 * upper_s + 1e-12
    for a, g in pool.cuts:
        slack = upper_s - a - float(g @ lower) + margin
        with np.errstate(divide="ignore", invalid="ignore"):
            cap = np.where(g > 0, lower + slack / g, np.inf)
        ux = np.minimum(ux, cap)
    ux[booleans] = np.where(ux[booleans] >= 1.0, 1.0, 0.0)
    return np.maximum(ux, lower)


def bounds(pool: CutPool, upper_s: float, rounds: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper inputs for placements no slower than ``upper_s``, tightened in turn."""
    lx = lower_x(pool.data)
    ux = upper_x(pool, lx, upper_s)
    for _ in range(rounds):
        lx = np.maximum(lx, lower_x(pool.data, ux))
        ux = upper_x(pool, lx, upper_s)
    return lx, ux


@dataclass
class KelleyResult:
    """Best assignment, its value, the proven bound, status and rounds."""

    assign: np.ndarray
    value_s: float
    bound_s: float
    status: str
    rounds: int
    wall_time_s: float


def kelley(
    data: PlacementData,
    make_backend: Callable[[], Backend],
    *,
    domains: list[np.ndarray],
    start: np.ndarray | None,
    pool: CutPool,
    deadline: float,
    workers: int = 1,
    seed: int = 0,
    symmetry: bool = True,
    bound_s: float = 0.0,
) -> KelleyResult:
    """Cutting-plane loop on the master restricted to ``domains``, from ``start``.

    Returns the best assignment found (``start`` if nothing better) and a bound
    valid for the restricted problem.  Raises :class:`InfeasibleError` when the
    master is infeasible and no start is given, :class:`SolverTimeoutError`
    when the time runs out before any placement is known.
    """
    started = work.now()
    best = None if start is None else np.asarray(start)
    ub = np.inf if best is None else data.value(best)
    if best is not None and np.isfinite(ub):
        pool.add_at(data.x_of(best))
    upper = ub if np.isfinite(ub) else pool.upper_s
    lx, ux = bounds(pool, upper)
    bound_s = max(bound_s, data.total_time_s(lx)) if np.isfinite(ub) else bound_s
    model = PlacementModel(data, make_backend(), domains, lx, ux, upper * (1 + 1e-9) + 1e-6,
                           symmetry=symmetry)  # fmt: skip
    for k, (a, g) in enumerate(pool.cuts):
        model.add_cut(a, g, f"cut_{k}")
    lb, status, rounds = bound_s, "unknown", 0
    while True:
        left = deadline - work.now()
        if left <= 0.05 or work.exhausted():
            break
        if best is not None and np.isfinite(ub):
            model.set_hint(model.canonical(best) if symmetry else best)
        res = model.b.solve(left, workers, seed)
        work.spend(work.ROUND_TICKS)  # the round's own work: cuts, hints, values
        rounds += 1
        if res.status in ("infeasible", "invalid"):
            if best is None:
                raise InfeasibleError("no placement avoids the failed links and fits in memory")
            lb, status = max(lb, ub), "optimal"  # nothing below the incumbent
            break
        if res.status == "unknown":
            break
        lb = max(lb, res.bound_s or 0.0)
        assign = model.extract()
        found = [assign, *model.recorded(res.solutions[-MORE_CUTS:])]
        for other in found:
            value = data.value(other)
            if value < ub:
                best, ub = other, value
        if ub - lb <= OPTIMALITY_GAP * ub:
            status = "optimal"
            break
        if res.status != "optimal":
            status = "feasible"
            break
        seen = set()
        for other in found:  # cuts where the master under-estimates its own solutions
            key = other.tobytes()
            if key not in seen:
                seen.add(key)
                a, g = pool.add_at(data.x_of(other))
                model.add_cut(a, g, f"cut_{len(pool.cuts)}")
    if best is None:
        raise SolverTimeoutError("the placement master found no placement within the time limit")
    if status == "unknown":
        status = "optimal" if ub - lb <= OPTIMALITY_GAP * ub else "feasible"
    return KelleyResult(best, ub, min(lb, ub), status, rounds, work.now() - started)
