"""Heuristics for the layer split: a feasible start, greedy balancing, Megatron-friendly ties.

They warm-start the exact models of :mod:`pipette_cp.solvers.split` (hint and
first cuts), so an exact solve is never worse than the even split.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pipette_cp.checker.checks import check_memory_limit
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.errors import InfeasibleError
from pipette_cp.solvers.cuts import Cut
from pipette_cp.solvers.split.cost import SplitCost
from pipette_cp.specs import Instance, Plan
from pipette_cp.specs.layouts import even_split

#: Evaluator calls the polish of a split of unequal layers may spend (a count, not a
#: clock, so that the result does not depend on the machine).
POLISH_EVALUATIONS = 200


def feasible_start(cost: SplitCost) -> np.ndarray:
    """The even split (:func:`~pipette_cp.specs.layouts.even_split`) if it fits, else
    the memory-greedy split: the even stage totals clipped to each stage's capacity,
    the rest added one layer at a time to the least loaded stage with room (water
    filling, so no stage takes more than it must), chunks of a stage as even as
    possible.  Call :meth:`SplitCost.require_feasible` first."""
    even = np.array(even_split(cost.num_layers, cost.pp, cost.vpp))
    if cost.allowed(even):
        return even
    caps = cost.stage_capacity()
    totals = np.minimum(cost.stage_layers(even).astype(int), caps)
    for _ in range(cost.num_layers - int(totals.sum())):
        s = int(np.argmin(np.where(totals < caps, totals, np.iinfo(totals.dtype).max)))
        totals[s] += 1
    chunks = np.array(
        [[k // cost.vpp + (c < k % cost.vpp) for k in totals] for c in range(cost.vpp)]
    )
    return chunks.ravel()


@dataclass(frozen=True)
class SearchTrail:
    """Result of :func:`local_search`: best split, its time, and every cut computed."""

    split: np.ndarray
    time_s: float
    cuts: tuple[Cut, ...]


def local_search(
    cost: SplitCost,
    start: np.ndarray,
    rng: np.random.Generator,
    *,
    deadline_s: float,
    candidates: int = 8,
) -> SearchTrail:
    """Greedy balancing: move one layer at a time along the cut's gradient.

    At the current split the supporting cut's gradient ``g_v`` is the marginal
    time of a layer on virtual stage ``v``; the ``candidates`` moves ``v -> w``
    with the most negative ``g_w - g_v`` that keep both stages in memory are
    tried exactly and the first improving one is taken; stop when none improves
    or at ``deadline_s`` (a :func:`time.perf_counter` reading).  Every cut is
    kept: they seed the exact models.
    """
    x = np.array(start, dtype=np.int64)
    best = cost.iteration_time_s(x)
    cuts: list[Cut] = []
    n = cost.num_chunks
    while time.perf_counter() < deadline_s:
        cut = cost.cut(x, rng)
        cuts.append(cut)
        g = cut.gradient
        delta = g[None, :] - g[:, None]  # move from v (row) to w (column)
        delta[np.arange(n), np.arange(n)] = np.inf
        delta[x <= 1, :] = np.inf
        improved, tried = False, 0
        for flat in np.argsort(delta, axis=None):
            v, w = divmod(int(flat), n)
            if tried == candidates or not delta[v, w] < 0:
                break
            y = x.copy()
            y[v] -= 1
            y[w] += 1
            if not cost.allowed(y):
                continue
            tried += 1
            t = cost.iteration_time_s(y)
            if t < best * (1 - 1e-12):
                x, best, improved = y, t, True
                break
        if not improved:
            break
    return SearchTrail(x, best, tuple(cuts))


def prefer_simple(
    cost: SplitCost, split: np.ndarray, time_s: float, tie: float = 1e-9
) -> tuple[np.ndarray, float]:
    """An equally fast split (within ``tie``, relative) that Megatron's plain flags express.

    Optima are rarely unique (stages with equal links and GPUs are interchangeable).
    Tried in order: the even split, then "first / last uneven": every middle stage
    holding the most common middle total of ``split``, chunks equal within each
    stage, the first stage's total ascending (see
    :func:`pipette_cp.solvers.split.megatron_split_args`).  Returns ``(split,
    time_s)`` unchanged when none ties.
    """
    pp, vpp, layers = cost.pp, cost.vpp, cost.num_layers
    candidates = [np.array(even_split(layers, pp, vpp))]
    totals = cost.stage_layers(split).astype(int)
    middle = totals[1:-1]
    q = int(np.bincount(middle).argmax()) if middle.size else 0
    if q % vpp == 0:
        for first in range(vpp, layers + 1, vpp):
            last = layers - first - (pp - 2) * q
            if last < vpp:
                break
            if last % vpp == 0 and pp > 1:
                stage = np.array([first] + [q] * (pp - 2) + [last]) // vpp
                candidates.append(np.tile(stage, vpp))
    for candidate in candidates:
        if candidate.min() < 1 or not cost.allowed(candidate):
            continue
        value = cost.iteration_time_s(candidate)
        if value <= time_s * (1 + tie):
            return candidate, value
    return split, time_s


def polish_unequal_layers(
    instance: Instance,
    plan: Plan,
    cost: SplitCost,
    candidates: tuple[np.ndarray, ...],
    admits: Callable[[np.ndarray], bool] = lambda split: True,
) -> tuple[np.ndarray, float]:
    """The fastest split of ``candidates`` and the even split under the evaluator itself
    (:meth:`~pipette_cp.cost.evaluator.evaluate.Evaluator.iteration_time`) among those
    that pass the checker's memory check, keep the chunk balance and satisfy ``admits``
    (the user's constraint families), then improved by
    moving one layer across a boundary of neighbouring chunks while that helps (at most
    :data:`POLISH_EVALUATIONS` evaluations).  For layers of unequal cost, where the
    split models' affine forms are approximations.

    Raises
    ------
    InfeasibleError
        None of the candidates fits in memory.
    """
    evaluator = Evaluator(instance, validate=False)
    spent = 0

    def score(split: np.ndarray) -> float:
        nonlocal spent
        spent += 1
        trial = plan.model_copy(
            update={"layer_split": tuple(int(n) for n in split), "evaluation": None}
        )
        if split.min() < 1 or not cost.balanced(split) or not admits(split):
            return math.inf
        if check_memory_limit(instance, trial):
            return math.inf
        return evaluator.iteration_time(trial)

    even = np.array(even_split(cost.num_layers, cost.pp, cost.vpp))
    pool = [np.asarray(c, dtype=int) for c in (*candidates, even)]
    best_s, index = min((score(c), i) for i, c in enumerate(pool))
    best = pool[index]
    if not math.isfinite(best_s):
        raise InfeasibleError(f"no layer split of {plan.layout()} found that fits in memory and "
                              "the constraint families (layers of unequal cost: even, greedy "
                              "and solved splits tried)")  # fmt: skip
    improved = True
    while improved and spent < POLISH_EVALUATIONS:
        improved = False
        for v in range(cost.num_chunks - 1):
            for step in (1, -1):  # one layer from chunk v + 1 to v, or back
                trial = best.copy()
                trial[v], trial[v + 1] = trial[v] + step, trial[v + 1] - step
                value = score(trial)
                if value < best_s * (1 - 1e-12):
                    best, best_s, improved = trial, value, True
    return best, best_s
