"""Choose which replicas form the expert groups and context-parallel rings.

An expert group (with ``etp = tp``) and a context-parallel ring are blocks of
consecutive replicas of a stage (:meth:`~pipette_cp.specs.plan.Plan.expert_groups`,
:meth:`~pipette_cp.specs.plan.Plan.cp_groups`).  Renumbering the replicas, the same
permutation on every stage, keeps every unit on its GPUs and every pipeline hop on its
link, and changes only which units share a group (and the order of the data-parallel
rings).  :func:`regroup_replicas` searches these renumberings by pairwise swaps, each
scored with the full evaluator (the all-to-alls and rings on the measured matrix),
first improvement, from the master's numbering and then from random ones while time is
left (a local search: no optimality claim).  It runs where the masters price these
groups only as a bound (:mod:`~pipette_cp.solvers.placement.families.group_tables`:
slot places, uneven groups, the flex dispatcher), on the master's placement.

:func:`regroup_within` runs it within a work budget for the deterministic solves
(:mod:`pipette_cp.solvers.work_meter`): the regrouping reads the wall clock, so under the
work meter it is given no deadline and an evaluator that counts its evaluations instead;
past the budget it stops the search (:class:`_Spent`), and the best renumbering evaluated
so far is the answer (the one the regrouping itself would keep: it keeps the fastest
order it evaluated).
"""

from __future__ import annotations

import math
import time

import numpy as np

from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.errors import PipetteError
from pipette_cp.solvers import work_meter as work
from pipette_cp.specs import Plan

#: Swap descents at most (the first from the plan's own numbering).
MAX_RESTARTS = 200


def _renumbered(plan: Plan, units: np.ndarray, order: np.ndarray) -> Plan:
    placement = units[:, order, :].reshape(-1, plan.tp).tolist()
    return plan.model_copy(update={"placement": tuple(map(tuple, placement))})


def _descend(
    evaluator: Evaluator, plan: Plan, units: np.ndarray, order: np.ndarray, best_t: float,
    until: float, rng: np.random.Generator,
) -> float:  # fmt: skip
    """Pairwise swaps of ``order`` (in place), first improvement, until none helps or the
    time is up; the time of the final order."""
    pairs = [(i, j) for i in range(len(order)) for j in range(i + 1, len(order))]
    improved = True
    while improved and time.perf_counter() < until:
        improved = False
        for k in rng.permutation(len(pairs)):
            if time.perf_counter() >= until:
                break
            i, j = pairs[k]
            order[[i, j]] = order[[j, i]]
            try:
                t = evaluator.iteration_time(_renumbered(plan, units, order))
            except PipetteError:  # e.g. a data-parallel ring over a failed pair
                t = float("inf")
            if t < best_t * (1 - 1e-9):
                best_t, improved = t, True
            else:
                order[[i, j]] = order[[j, i]]
    return best_t


def regroup_replicas(
    evaluator: Evaluator, plan: Plan, until: float, seed: int = 0
) -> tuple[Plan, float]:
    """``plan`` with its replicas renumbered to the fastest grouping found before
    ``until`` (``time.perf_counter()``): a swap descent from the plan's own numbering,
    then from random numberings (restarts) while time is left; and its iteration time.
    ``plan`` itself when nothing helps (or it has one replica)."""
    units = np.asarray(plan.placement, dtype=np.int64).reshape(plan.pp, plan.replicas, plan.tp)
    identity = np.arange(plan.replicas)
    start_t = evaluator.iteration_time(plan)
    if plan.replicas < 2:
        return plan, start_t
    rng = np.random.default_rng(seed)
    best_order, best_t = identity.copy(), start_t
    order = identity.copy()
    for restart in range(MAX_RESTARTS):
        if restart:
            if time.perf_counter() >= until:
                break
            order = rng.permutation(plan.replicas)
            try:
                t = evaluator.iteration_time(_renumbered(plan, units, order))
            except PipetteError:
                continue
        else:
            t = start_t
        t = _descend(evaluator, plan, units, order, t, until, rng)
        if t < best_t * (1 - 1e-9):
            best_order, best_t = order.copy(), t
    if (best_order == identity).all():
        return plan, start_t
    return _renumbered(plan, units, best_order), best_t


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
