"""The replica regrouping (:mod:`~pipette_cp.solvers.placement.regroup`) within a work
budget, for the deterministic solves (:mod:`pipette_cp.solvers.work`).

The regrouping reads the wall clock; under the work meter it is given no deadline and
an evaluator that counts its evaluations instead: past the budget it stops the search
(:class:`_Spent`), and the best renumbering evaluated so far is the answer (the one
the regrouping itself would keep: it keeps the fastest order it evaluated).
"""

from __future__ import annotations

import math

from pipette_cp.cost.evaluate import Evaluator
from pipette_cp.solvers import work
from pipette_cp.solvers.placement.regroup import regroup_replicas
from pipette_cp.specs import Plan


class _Spent(Exception):
    """The regrouping's work budget is spent."""


class _Counting:
    """An evaluator that charges every evaluation to the meter, keeps the fastest plan
    evaluated and stops the search once ``limit`` evaluations are spent."""

    def __init__(self, evaluator: Evaluator, limit: int) -> None:
        self.inner, self.limit, self.calls = evaluator, limit, 0
        self.instance = evaluator.instance
        self.best: tuple[float, Plan] | None = None

    def iteration_time(self, plan: Plan) -> float:
        if self.calls >= self.limit:
            raise _Spent
        self.calls += 1
        work.spend(work.EVALUATION_TICKS)
        t = self.inner.iteration_time(plan)
        if self.best is None or t < self.best[0] * (1 - 1e-9):
            self.best = (t, plan)
        return t


def regroup_within(scorer: Evaluator, plan: Plan, end: float, seed: int) -> tuple[Plan, float]:
    """:func:`regroup_replicas` of ``plan`` until ``end`` (:func:`work.now`): as it is
    outside the meter; under it, within the evaluations the time to ``end`` pays for."""
    if not work.active():
        return regroup_replicas(scorer, plan, end, seed)
    evaluations = max(int((end - work.now()) * work.TICKS_PER_S) // work.EVALUATION_TICKS, 1)
    counting = _Counting(scorer, evaluations)
    try:
        return regroup_replicas(counting, plan, math.inf, seed)  # type: ignore[arg-type]
    except _Spent:
        assert counting.best is not None  # the first evaluation is the plan's own
        best_t, best = counting.best
        return best, best_t
