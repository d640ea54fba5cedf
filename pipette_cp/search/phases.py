"""The search's per-layout phases over a :class:`~pipette_cp.search.executors.workers.Runner`.

Bounding, scoring and the greedy sweep hand the layouts out in chunks, a few chunks ahead of the one the
search reads, and read the results in the layouts' order, so every decision (a budget
stop, the bound passing the best score) falls where the sequential search puts it; a
worker then only computes a little ahead.  Solving hands out one layout per worker, the
most promising first, each pruned against the incumbent when it is handed out and given
its share of the time left; results are taken as they finish.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import replace
from functools import partial
from typing import Any

from pipette_cp.checker import check_plan
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.errors import PipetteError, SolverError
from pipette_cp.search.executors.workers import (
    HANG_GRACE_S,
    Bounded,
    Runner,
    Scored,
    bound_layouts,
    score_skeletons,
    solve_skeleton,
    sweep_layouts,
)
from pipette_cp.search.rerank import plan_time
from pipette_cp.search.sweep import Candidate, merge_sweep
from pipette_cp.solvers import SolveOptions
from pipette_cp.solvers.extensions import family_violations
from pipette_cp.specs import Instance, Plan

#: Scoring stops at its share of the budget once one skeleton fits, or once this many
#: default placements have crossed a failed link.
MIN_SCORED = 32
#: Layouts per chunk handed to a worker in the bounding and scoring phases.
CHUNK = 32
#: Least time a solve is started with, per GPU of the cluster (its fixed costs: 4,096
#: GPUs took about 3 s before the first master solve), s.
MIN_SOLVE_S_PER_GPU = 1e-3

#: Seconds past the solves' budget a solve still running may take before it is
#: dropped (its own limit should have stopped it: one that overruns, on a loaded
#: machine, must not hold the whole command past ``--time-limit``).
ABANDON_AFTER_S = 2.0

#: A solve's share of the time left: 1 / this many of the worker-seconds left (fewer
#: when fewer candidates remain).  6, not 8: at 60 s on gpt-sc21-530b-g3-4096 (with
#: the solves until 0.93 of the budget) 8 gave +1.07 % of the best known plan, 6 and 4
#: +0.67 %; the other three 4,096-GPU instances were as good or better with 6.
SHARE_SPREAD = 6
#: How many waiting candidates the solve phase looks past one whose placement degrees a
#: solve in flight already places.
LOOKAHEAD = 8

Progress = Callable[[str, int, int], None]


def in_order(
    runner: Runner, fn: Callable[[Sequence[int]], list], indices: Sequence[int],
    keep_going: Callable[[], bool], chunk: int = CHUNK, ahead: int = 2,
) -> Generator[tuple[int, Any], None, None]:  # fmt: skip
    """``(position, fn's result)`` for the layouts at ``indices``, in order, ``chunk``
    layouts per piece of work and ``ahead`` pieces per worker in flight, handed out
    while ``keep_going()`` (asked before each) holds; stops at the first piece not
    handed out.  Closed early, it cancels the pieces not yet started (the workers are
    the next phase's).  A worker that dies takes the pieces in flight with it: the
    workers are restarted and those pieces handed out again, each once; a piece lost
    twice is a :class:`~pipette_cp.errors.SolverError` naming its layouts."""
    size = 1 if runner.jobs == 1 else chunk
    window = 1 if runner.jobs == 1 else ahead * runner.jobs
    queue: deque[tuple[int, Future]] = deque()
    start = 0
    redone: set[int] = set()

    def piece(at: int) -> list[int]:
        return list(indices[at : at + size])

    try:
        while True:
            while start < len(indices) and len(queue) < window and keep_going():
                queue.append((start, runner.submit(fn, piece(start))))
                start += size
            if not queue:
                return
            first, future = queue.popleft()
            try:
                results = future.result()
            except runner.lost:  # every piece in flight went with the worker
                if first in redone:
                    what = getattr(fn, "__name__", "the search's work")
                    raise SolverError(f"a worker died twice on the layouts at positions "
                                      f"{piece(first)} ({what})") from None  # fmt: skip
                lost = [first, *(at for at, _ in queue)]
                redone.update(lost)
                runner.restart()
                queue = deque((at, runner.submit(fn, piece(at))) for at in lost)
                continue
            for k, result in enumerate(results):
                yield first + k, result
    finally:
        for _, future in queue:
            future.cancel()


def score_all(
    runner: Runner,
    layouts: list[Plan],
    survivors: list[tuple[float, int]],
    stats: Any,
    notify: Progress,
    until: float,
    weight: Callable[[Plan], float],
    clock: Callable[[], float] = time.perf_counter,
    charge: float = 0.0,
) -> list[Candidate]:
    """Score skeletons in bound order until the bound passes the best fitting score
    (or the scoring share of the budget is spent: the rest are left unscored).

    Skeletons are ordered by the time of their even split (whether or not it fits:
    the memory bound says some split does) on Megatron's placement; when that crosses
    a failed link, on the cluster with failed links repaired (at the slowest working
    bandwidth).  Estimates order the solves only; pruning uses fitting scores.  Scores
    and bounds are in the objective's units (``weight`` x s).  ``clock``: the time
    (or work, with ``charge`` reference s per skeleton scored: the work clock of the
    deterministic search, :mod:`~pipette_cp.search.deterministic`)."""
    best = math.inf
    scored: list[Candidate] = []
    stop = False
    results = in_order(runner, score_skeletons, [k for _, k in survivors], lambda: not stop)
    for i, result in results:
        bound, plan = survivors[i][0], layouts[survivors[i][1]]
        notify("score", i + 1, len(survivors))
        if bound >= best:
            stats.pruned_bound += len(survivors) - i
            break
        crossed = stats.crossed_failed_links >= MIN_SCORED  # no default may ever fit
        if clock() + i * charge > until and (math.isfinite(best) or crossed):
            stats.skipped_budget += len(survivors) - i
            stats.notes.append(f"scoring stopped by the budget after {i} skeletons")
            break
        stats.crossed_failed_links += result.crossed
        unfit = not result.crossed and result.score_s == math.inf  # as it stands
        if unfit and result.deficit_bytes < stats.smallest_deficit_bytes:
            stats.smallest_deficit_bytes = result.deficit_bytes
            stats.deficit_layout = plan.layout()
        stats.scored += 1
        if math.isfinite(result.score_s):  # a real plan: even split on Megatron's order
            known = stats.best_by_gpus.get(plan.num_gpus, math.inf)
            stats.best_by_gpus[plan.num_gpus] = min(result.score_s, known)
        best = min(best, result.score_s * weight(plan))
        scored.append(Candidate(result.estimate_s * weight(plan), bound, plan))
    stop = True
    results.close()
    return sorted(scored)


def sweep_all(
    runner: Runner, layouts: list[Plan], candidates: list[Candidate], options: SolveOptions,
    until: float, weight: Callable[[Plan], float],
) -> tuple[list[Plan], list[Candidate]]:  # fmt: skip
    """The greedy sweep (:mod:`~pipette_cp.search.sweep`) over the candidates in order
    until ``until``, on the workers (chunks read in order: the sequential sweep's result)."""
    index = {id(p): k for k, p in enumerate(layouts)}
    indices = [index[id(c.plan)] for c in candidates]
    work = partial(sweep_layouts, options=options)
    # one layout per piece, one piece per worker: a greedy plan of a large model takes a
    # second, and what runs past ``until`` delays the solves
    running = in_order(runner, work, indices, lambda: time.perf_counter() <= until, 1, 1)
    plans = [plan for _, plan in running]
    return merge_sweep(candidates, plans, weight)


def solve_all(
    instance: Instance, evaluator: Evaluator, runner: Runner, candidates: list[Candidate],
    stats: Any, notify: Progress, start: float, budget_s: float, options: SolveOptions,
    max_solves: int | None, weight: Callable[[Plan], float], best: float = math.inf,
    solved: list[Plan] | None = None, improved: Callable[[Plan], None] | None = None,
) -> list[Plan]:  # fmt: skip
    """Run the method on candidates, most promising first, within the budget.

    Candidates that share degrees with a solved one (another micro-batch, recompute
    or optimizer setting) start from its placement and get half a share: the
    placement mostly carries over, the split is re-solved.  With ``jobs`` workers a
    share is ``jobs`` times the sequential one (as many solves run at once): the
    workers solve the layouts one worker would, each with more time, which is what
    reaches the plans a long sequential search finds (at 0.6 of the budget, 2 workers
    on 512- and 1,024-GPU instances came within 0.08 % of one worker's full-budget
    plan, or matched it; with the sequential share they missed by up to 1.4 %).
    A candidate whose degrees a solve in flight already places waits (for at most
    :data:`LOOKAHEAD` later ones) until that solve gives it its warm start, so two
    workers do not search the same placement at once (:func:`next_candidate`).
    ``solved``: appended to as plans come in (an interrupted call leaves them there);
    ``improved``: called with every plan that beats the incumbent."""
    solved = [] if solved is None else solved
    placed: dict[tuple[int, int, int], Plan] = {}
    jobs = runner.jobs
    pending: dict[Future, tuple[int, Candidate, Plan, SolveOptions, float]] = {}
    retried: set[int] = set()
    suspects: deque[tuple[int, Candidate, Plan, SolveOptions, float]] = deque()
    alone = False  # a suspect runs by itself
    waiting = list(range(len(candidates)))  # not handed out yet, most promising first
    taken = 0

    def hand_out(k: int, cand: Candidate, skeleton: Plan, opts: SolveOptions) -> None:
        future = runner.submit(solve_skeleton, skeleton, opts)
        pending[future] = (k, cand, skeleton, opts, time.perf_counter() + opts.time_limit_s)

    while waiting or pending or suspects:
        if suspects and time.perf_counter() > start + budget_s + ABANDON_AFTER_S:
            stats.skipped_budget += len(suspects)  # the budget is spent: no more retries
            suspects.clear()
        if suspects and not pending:  # after a crash: the solves in flight, one at a time
            k, cand, skeleton, opts, _ = suspects.popleft()
            hand_out(k, cand, skeleton, opts)
            alone = True
        elif not pending:
            alone = False
        while not alone and waiting and len(pending) < jobs:
            busy = {entry[1].plan.placement_shape for entry in pending.values()}
            k = next_candidate(waiting, candidates, busy)
            cand = candidates[k]
            taken += 1
            notify("solve", taken, len(candidates))
            if cand.bound_s >= best:
                stats.pruned_bound += 1
                continue
            left = budget_s - (time.perf_counter() - start)
            # a solve has fixed costs (its models' tables) that grow with the cluster: with
            # less time than those left, the plans in hand (or the fallback) are the answer
            too_short = left < MIN_SOLVE_S_PER_GPU * instance.cluster.num_gpus
            if left <= 0 or too_short or (max_solves is not None and stats.solved >= max_solves):
                stats.skipped_budget += 1
                continue
            remaining = len(waiting) + 1
            share = max(jobs * left / max(jobs, min(remaining, SHARE_SPREAD)), 0.5)
            skeleton, degrees = cand.plan, cand.plan.placement_shape
            if degrees in placed:
                skeleton = skeleton.model_copy(update={"placement": placed[degrees].placement})
                share = max(share / 2, 0.5)
            threads = solve_threads(options.workers, jobs, len(pending), waiting, runner)
            hand_out(k, cand, skeleton,
                     replace(options, time_limit_s=min(share, left), workers=threads))  # fmt: skip
        if not pending:
            break
        hang_at = min(d for *_, d in pending.values()) + HANG_GRACE_S
        end = start + budget_s + ABANDON_AFTER_S  # the solves' budget, whatever runs over
        timeout = max(0.0, min(hang_at, end) - time.perf_counter())
        done, _ = wait(pending, timeout=timeout, return_when=FIRST_COMPLETED)
        if not done and end < hang_at:  # past the budget: what is still running is dropped
            stats.skipped_budget += len(pending)
            stats.notes.append(f"{len(pending)} solve(s) still running when the budget ended: "
                               "dropped")  # fmt: skip
            pending.clear()
            runner.restart()
            continue
        if not done:  # a solve far past its limit: restart the workers, retry them once
            _retry(runner, pending, retried, suspects, stats, "hung")
            continue
        for future in done:
            k, cand, skeleton, opts, _ = pending.pop(future)
            try:
                plan = future.result()
                evaluation = evaluator.evaluate(plan)
            except runner.lost:  # a worker died: every solve in flight went with it
                pending[future] = (k, cand, skeleton, opts, 0.0)
                _retry(runner, pending, retried, suspects, stats, "died")
                break
            except PipetteError:  # infeasible, a layout the method cannot express, timed out
                stats.method_failures += 1
                continue
            best = accept(instance, plan, evaluation, stats, options, weight, best, improved,
                          placed, solved)  # fmt: skip
    return solved


def next_candidate(
    waiting: list[int], candidates: list[Candidate], busy: set[tuple[int, int, int]]
) -> int:
    """Take the first of ``waiting`` (indices into ``candidates``) whose placement degrees
    are not in ``busy`` (those of the solves in flight), looking at most
    :data:`LOOKAHEAD` ahead; if every one there is busy, the first.  A deferred candidate
    then starts from the finished solve's placement with half a share, instead of
    searching the same placement next to it (4,096 GPUs, 60 s: the two best layouts of
    gpt-sc21-530b-g3-4096 differ in recomputation only).  With one worker nothing is in
    flight: the sequential order."""
    for pos, k in enumerate(waiting[:LOOKAHEAD]):
        if candidates[k].plan.placement_shape not in busy:
            return waiting.pop(pos)
    return waiting.pop(0)


def solve_threads(
    workers: int, jobs: int, in_flight: int, waiting: list[int], runner: Runner
) -> int:
    """CP-SAT workers of a solve handed out now: ``workers``, or, for the last candidate
    while fewer than ``jobs`` solves run on this machine's worker processes, also the
    cores no other solve will take (they would idle).  Only there: at equal wall time
    (10 s, :mod:`~pipette_cp.experiments.solving.cpsat_workers`, two runs) a second CP-SAT worker
    found a 0.9-3.4 % better plan where the CP-SAT search dominates the solve (dp128-pp2
    on gpt-sc21-18b-g3-256, dp256-pp2 on gpt-sc21-39b-g3-1024), the same one on
    gpt3-175b-g1-1024, and a 0.1-0.6 % worse one where the solve's Python (cuts, split)
    dominates (dp32-pp16-vpp4 on gpt-sc21-530b-g3-4096), so a core is never taken from
    another layout's solve.  Ray actors may sit on other machines, each holding one
    core: there ``workers``."""
    if waiting or not runner.shares_cores:
        return workers
    return max(workers, jobs - in_flight)


def accept(
    instance: Instance, plan: Plan, evaluation: Any, stats: Any, options: SolveOptions,
    weight: Callable[[Plan], float], best: float, improved: Callable[[Plan], None] | None,
    placed: dict[tuple[int, int, int], Plan], solved: list[Plan],
) -> float:  # fmt: skip
    """Count a finished solve; keep its plan (in ``solved``, and in ``placed`` as the warm
    start of its degrees) if it fits, passes the checker and the user families; call
    ``improved`` when it beats ``best``.  Returns the incumbent after it."""
    stats.solved += 1
    stats.with_gap += plan.solve_info is not None and plan.solve_info.gap is not None
    if (
        not evaluation.fits
        or check_plan(instance, plan)
        or family_violations(options.constraints, instance, plan)
    ):
        stats.method_failures += 1
        return best
    evaluated = plan.model_copy(update={"evaluation": evaluation})
    if evaluation.iteration_time_s * weight(plan) < best:
        best = evaluation.iteration_time_s * weight(plan)
        if improved is not None:
            improved(evaluated)
    degrees = plan.placement_shape
    if degrees not in placed or plan_time(placed[degrees]) > evaluation.iteration_time_s:
        placed[degrees] = evaluated
    solved.append(evaluated)
    return best


def _retry(runner: Runner, pending: dict, retried: set[int], suspects: deque, stats: Any,
           why: str) -> None:  # fmt: skip
    """Restart the workers after a crash (or hang).  With several solves in flight the
    culprit is unknown: each runs again alone.  A solve that crashes alone is retried
    once; a second time it is skipped."""
    lost = list(pending.values())
    pending.clear()
    runner.restart()
    if len(lost) > 1:
        names = ", ".join(cand.plan.layout() for _, cand, *_ in lost)
        stats.notes.append(f"a worker {why} with {names} in flight: each runs again alone")
        suspects.extend(lost)
        return
    k, cand, *_ = lost[0]
    if k in retried:
        stats.method_failures += 1
        stats.notes.append(f"a worker {why} twice on {cand.plan.layout()}: skipped")
        return
    retried.add(k)
    stats.notes.append(f"a worker {why} on {cand.plan.layout()}: retried")
    suspects.append(lost[0])


__all__ = [
    "Bounded",
    "Scored",
    "accept",
    "bound_layouts",
    "in_order",
    "score_all",
    "score_skeletons",
    "solve_all",
]
