"""The deterministic search's phases (``search`` with ``SearchOptions(deterministic=True)``).

The budget is work, not wall time: ``time_limit_s`` reference seconds of
:mod:`pipette_cp.solvers.work_meter` (a reference second: about a second of work on the
reference 2-core machine), spent as the wall-clock search spends its seconds
(:mod:`~pipette_cp.search.loop`'s shares):

* bounding: :data:`BOUND_S` per layout, so the first ``BOUND_SHARE x budget /
  BOUND_S`` layouts are bounded;
* scoring: :data:`SCORE_S` per skeleton scored, on top of the bounding;
* greedy sweep: what each greedy plan meters (its local search, plus a fixed cost per
  GPU; :func:`~pipette_cp.search.executors.workers.sweep_metered`), in candidate order;
* solves: what each solve meters (CP-SAT's deterministic time, the heuristics' steps,
  a fixed cost per GPU; :func:`~pipette_cp.search.executors.workers.solve_metered`).

Every decision is taken on the results in the candidates' order, never in the order
they finish (:func:`solve_ordered`): a candidate is pruned against the incumbent of
the candidates before it, skipped once the solves before it have spent the budget,
and warm-started from the best plan of its degrees among those before it.  Workers
run ahead on candidates whose fate is not known yet; a result that turns out to be
pruned or over the budget is dropped.  So any ``jobs`` gives the plans of one job.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import replace
from functools import partial
from typing import Any

from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.errors import PipetteError
from pipette_cp.search.executors.workers import (
    HANG_GRACE_S,
    SOLVE_TICKS_PER_GPU,
    Metered,
    Runner,
    solve_metered,
    sweep_metered,
)
from pipette_cp.search.phases import accept, in_order
from pipette_cp.search.sweep import Candidate, merge_sweep
from pipette_cp.solvers import SolveOptions
from pipette_cp.solvers import work_meter as work
from pipette_cp.specs import Instance, Plan

#: Work charged per layout bounded and per skeleton scored, reference s (measured on
#: the reference machine: 0.13-0.41 ms and 0.6-1.6 ms from 16 to 1,024 GPUs).
BOUND_S = 2.5e-4
SCORE_S = 1.0e-3
#: Solves a budget is shared among at most (the wall-clock search's 8 per worker, for one).
SHARES = 8
#: Least work a solve is started with, reference s.
MIN_SHARE_S = 0.5
#: A deterministic solve taken for hung: this many times its share (wall s), plus grace.
HANG_FACTOR = 20.0

Progress = Callable[[str, int, int], None]


class Spent:
    """The search's work clock: reference seconds spent so far (``now``)."""

    def __init__(self) -> None:
        self.s = 0.0

    def now(self) -> float:
        return self.s

    def spend(self, seconds: float) -> None:
        self.s += seconds


def bound_count(budget_s: float, share: float) -> int:
    """Layouts bounded within ``share`` of ``budget_s`` (at least one chunk's worth)."""
    return max(int(share * budget_s / BOUND_S), 32)


def sweep_ordered(
    runner: Runner, layouts: list[Plan], candidates: list[Candidate], options: SolveOptions,
    until: float, weight: Callable[[Plan], float], clock: Spent,
) -> tuple[list[Plan], list[Candidate]]:  # fmt: skip
    """The greedy sweep over the candidates in order while ``clock`` is before ``until``
    (each greedy plan charged its metered work; the first always swept)."""
    index = {id(p): k for k, p in enumerate(layouts)}
    indices = [index[id(c.plan)] for c in candidates]
    stop = False
    running = in_order(runner, partial(sweep_metered, options=options), indices,
                       lambda: not stop, 1, 1)  # fmt: skip
    plans: list[Plan | None] = []
    for k, result in running:
        if k and clock.now() > until:
            break
        clock.spend(result.spent_s)
        plans.append(result.plan)
    stop = True
    running.close()
    return merge_sweep(candidates, plans, weight)


def solve_ordered(
    instance: Instance, evaluator: Evaluator, runner: Runner, candidates: list[Candidate],
    stats: Any, notify: Progress, budget_s: float, options: SolveOptions,
    max_solves: int | None, weight: Callable[[Plan], float], best: float = math.inf,
    solved: list[Plan] | None = None, improved: Callable[[Plan], None] | None = None,
) -> list[Plan]:  # fmt: skip
    """The method on the candidates in order within ``budget_s`` reference seconds of
    work (see the module docstring): the plans of a sequential run, for any ``jobs``.

    Each solve gets ``budget_s / min(candidates, SHARES)`` (at least
    :data:`MIN_SHARE_S`; half where it starts from the placement of a plan solved
    before it with the same degrees) and is charged what it metered."""
    solved = [] if solved is None else solved
    share = max(budget_s / max(min(len(candidates), SHARES), 1), MIN_SHARE_S)
    least = SOLVE_TICKS_PER_GPU * instance.cluster.num_gpus / work.TICKS_PER_S
    placed: dict[tuple[int, int, int], Plan] = {}
    state = {"spent": 0.0}
    flight: dict[int, Future] = {}
    handed = 0

    def doomed(k: int) -> bool:  # pruned or over the budget, on what is known so far
        enough = max_solves is not None and stats.solved >= max_solves
        left = budget_s - state["spent"]
        return candidates[k].bound_s >= best or enough or left <= 0 or left < least

    def skeleton_of(k: int) -> tuple[Plan, SolveOptions]:
        plan, degrees, give = candidates[k].plan, candidates[k].plan.placement_shape, share
        if degrees in placed:
            plan = plan.model_copy(update={"placement": placed[degrees].placement})
            give = max(share / 2, MIN_SHARE_S)
        return plan, replace(options, time_limit_s=give, work_s=give)

    def hand_out() -> None:
        nonlocal handed
        while handed < len(candidates) and len(flight) < runner.jobs:
            k = handed
            shape = candidates[k].plan.placement_shape
            if any(candidates[j].plan.placement_shape == shape for j in flight):
                return  # its warm start waits for the solve before it
            handed += 1
            if not doomed(k):  # else its fate is known: pruned or skipped when read
                flight[k] = runner.submit(solve_metered, *skeleton_of(k))

    for k, cand in enumerate(candidates):
        hand_out()
        notify("solve", k + 1, len(candidates))
        future = flight.pop(k, None)
        if cand.bound_s >= best:
            stats.pruned_bound += 1
            continue
        if doomed(k):
            stats.skipped_budget += 1
            continue
        if future is None:  # not handed out: every solve before it has been read
            future = runner.submit(solve_metered, *skeleton_of(k))
        result = _result(runner, future, k, flight, skeleton_of, share, stats)
        if result is None:
            continue
        state["spent"] += result.spent_s
        plan = result.plan
        try:  # a plan crossing a failed pair (a baseline's fixed order): as the clock's search
            evaluation = None if plan is None else evaluator.evaluate(plan)
        except PipetteError:
            evaluation = None
        if plan is None or evaluation is None:
            stats.method_failures += 1
            continue
        best = accept(instance, plan, evaluation, stats, options, weight, best, improved,
                      placed, solved)  # fmt: skip
    return solved


def _result(
    runner: Runner, future: Future, k: int, flight: dict[int, Future],
    skeleton_of: Callable[[int], tuple[Plan, SolveOptions]], share: float, stats: Any,
) -> Metered | None:  # fmt: skip
    """The result of candidate ``k``; after a crash or a hang the workers restart and
    every solve in flight runs again (the same work: the same result); twice: None."""
    for attempt in range(2):
        done, _ = wait([future], timeout=HANG_FACTOR * share + HANG_GRACE_S)
        why = "hung" if not done else None
        if done:
            try:
                return future.result()
            except runner.lost:
                why = "died"
        name = skeleton_of(k)[0].layout()
        runner.restart()
        again = deque(sorted(flight))
        for j in again:
            flight[j] = runner.submit(solve_metered, *skeleton_of(j))
        if attempt:
            stats.method_failures += 1
            stats.notes.append(f"a worker {why} twice on {name}: skipped")
            return None
        stats.notes.append(f"a worker {why} on {name}: retried")
        future = runner.submit(solve_metered, *skeleton_of(k))
    return None
