"""The outer loop: enumerate layouts, prune with bounds, solve the survivors, re-rank.

1. :func:`~pipette_cp.search.space.enumerate_layouts` gives every skeleton.
2. Skeletons no split can fit in memory are dropped (:func:`memory_check`).
3. The rest are scored as they stand (even split, Megatron placement) in order
   of their lower bound (:func:`time_lower_bound`); once the bound passes the best
   fitting score, no later skeleton can win and scoring stops.
4. The chosen method (split + placement) runs on the skeletons in order of
   their score, each within its share of the time budget; skeletons whose bound
   is not below the best solved plan are skipped.
5. The best ``top_k`` by the analytic model are re-ranked by the simulator
   (:func:`~pipette_cp.search.rerank.rerank`).

Every returned plan fits in memory per the model and passes the checker.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.errors import InfeasibleError, SolverTimeoutError, SpecError
from pipette_cp.search.capacity import capacity_error, knob_hints
from pipette_cp.search.deterministic import (
    BOUND_S,
    SCORE_S,
    Spent,
    bound_count,
    solve_ordered,
    sweep_ordered,
)
from pipette_cp.search.executors.runners import make_runner
from pipette_cp.search.executors.workers import Runner, bound_layouts, check_jobs
from pipette_cp.search.fallback import fallback
from pipette_cp.search.options import DEFAULT_OPTIONS, Incumbent, Progress, SearchOptions
from pipette_cp.search.phases import in_order, score_all, solve_all, sweep_all
from pipette_cp.search.rerank import plan_time, rerank
from pipette_cp.search.selection import (
    all_gpus_reference,
    lift,
    objective_weight,
    preferred_skeletons,
    restrict,
)
from pipette_cp.search.space import check_degrees, enumerate_layouts, gpu_counts
from pipette_cp.search.sweep import SWEPT_METHODS
from pipette_cp.solvers import work_meter as work
from pipette_cp.solvers.milp_engine import require_engine
from pipette_cp.solvers.registry import MILP_METHODS
from pipette_cp.specs import Instance, Plan, SearchSpace

__all__ = [
    "Incumbent", "Progress", "SearchOptions", "SearchResult", "SearchStats",
    "default_time_limit_s", "round_robin", "search",
]  # fmt: skip


#: Methods that cannot run deterministically, and why.
NOT_DETERMINISTIC = {
    m: "not deterministic: its MILP engines stop by wall time only; use cpsat or split-cpsat"
    for m in MILP_METHODS
}

#: Share of the budget the solves may use; the rest covers re-ranking and reporting
#: (on 4,096 GPUs re-ranking took 1-3 s of a 60 s budget).
SOLVE_SHARE = 0.9
#: Share of the budget after which scoring skeletons stops (once one fits, or once
#: MIN_SCORED default placements have crossed a failed link).
SCORE_SHARE = 0.4
#: Share of the budget for the greedy sweep before the exact solves (cpsat, milp).
SWEEP_SHARE = 0.2
#: Share of the budget after which bounding the layouts stops (the rest are not tried).
BOUND_SHARE = 0.3
#: Work the all-GPU reference plans may meter in a deterministic search, reference s.
REFERENCE_WORK_S = 8.0


def default_time_limit_s(instance: Instance) -> float:
    """The default budget: 0.12 s per GPU, at least 8 s and at most 540 s (64 GPUs: 8 s,
    512: 61 s, 1024: 123 s, 4096: 492 s), so the whole search ends in about that time."""
    return float(min(540.0, max(8.0, 0.12 * instance.cluster.num_gpus)))


@dataclass
class SearchStats:
    """What the search did (for the report)."""

    layouts: int = 0
    invalid: int = 0
    pruned_memory: int = 0
    scored: int = 0
    pruned_bound: int = 0
    solved: int = 0
    #: solved layouts whose placement carries a valid bound (SolveInfo.gap not None)
    with_gap: int = 0
    skipped_budget: int = 0
    method_failures: int = 0
    crossed_failed_links: int = 0
    wall_time_s: float = 0.0
    smallest_deficit_bytes: float = math.inf
    deficit_layout: str = ""
    notes: list[str] = field(default_factory=list)
    #: per GPU total: the least time lower bound of a layout that may fit, s
    bound_by_gpus: dict[int, float] = field(default_factory=dict)
    #: per GPU total: the fastest fitting plan found, s
    best_by_gpus: dict[int, float] = field(default_factory=dict)
    #: no plan beats this (objective units; None: some layouts were left unbounded)
    lower_bound: float | None = None
    #: stopped by Ctrl-C: the plans are the best found until then
    interrupted: bool = False


@dataclass
class SearchResult:
    """Ranked plans (best first) and statistics."""

    plans: list[Plan]
    stats: SearchStats


def round_robin(layouts: list[Plan], everything: int) -> list[Plan]:
    """``layouts`` (all-GPU ones first, kept) reordered so that the i-th knob variant of
    every (degrees, micro-batch) comes before the (i+1)-th of any (stable otherwise)."""
    seen: dict[tuple, int] = {}
    keys = []
    for p in layouts:
        group = (p.dp, p.pp, p.tp, p.cp, p.ep, p.etp, p.micro_batch_size)
        seen[group] = seen.get(group, -1) + 1
        keys.append((p.num_gpus != everything, seen[group]))
    order = sorted(range(len(layouts)), key=keys.__getitem__)
    return [layouts[i] for i in order]


def search(instance: Instance, options: SearchOptions = DEFAULT_OPTIONS) -> SearchResult:
    """The ``options.top_k`` fastest plans that fit, best first (see the module docstring;
    :class:`~pipette_cp.search.options.SearchOptions` for the options).

    ``jobs``: worker processes for the layouts' bounds, scores and solves
    (:mod:`~pipette_cp.search.executors.workers`; 1: all in this process), on ``executor``
    ``"local"`` or ``"ray"`` (actors on the cluster at ``ray_address``, else a local
    Ray; :mod:`~pipette_cp.search.executors.ray_actors`).  ``on_best``: called
    with every new incumbent and its gap.  Ctrl-C (KeyboardInterrupt) during the sweep or
    the solves returns the plans found so far (``stats.interrupted``); before any plan
    exists it propagates.

    ``constraints``: user constraint families (:mod:`pipette_cp.solvers.extensions`);
    the exact methods add them to their models, and plans that violate one are dropped.
    ``deterministic``: ``time_limit_s`` is a budget of work, reference seconds of
    :mod:`pipette_cp.solvers.work_meter`, spent as :mod:`~pipette_cp.search.deterministic` says: the
    same plans for the same instance, seed, budget and method on any machine and for
    any ``jobs`` (not with the MILP methods: their engines stop by wall time only).
    ``milp_solver``: the engine of the ``milp`` methods' masters
    (:class:`~pipette_cp.solvers.SolveOptions`); one PuLP cannot start is a SpecError here.

    Raises
    ------
    InfeasibleError
        When no layout fits in memory: the model's whole-model deficit when even
        maximal sharding does not fit (:mod:`~pipette_cp.search.capacity`), else the
        smallest deficit of a layout and what would make one fit.
    """
    start = time.perf_counter()
    method, deterministic = options.method, options.deterministic
    check_jobs(options.jobs, options.executor)
    if deterministic and method in NOT_DETERMINISTIC:
        raise SpecError("method", method, NOT_DETERMINISTIC[method] + " with deterministic=True")
    if method in MILP_METHODS:  # before any work: every solve would fail
        require_engine(options.milp_solver)
    space = options.space or instance.search_space
    if space != instance.search_space:  # the evaluator and checker read the instance's
        instance = instance.model_copy(update={"search_space": space})
    if space.exclude_nodes:  # every method sees only the nodes left; plans mapped back
        sub, kept = restrict(instance)
        found = search(sub, replace(options, space=None))  # the sub-instance's space
        return SearchResult([lift(p, kept) for p in found.plans], found.stats)
    check_degrees(instance, space)  # a space with no (dp, pp, tp) is bad input, not "nothing fits"
    too_big = capacity_error(instance, space)
    if too_big:  # no layout can fit: say so before enumerating them
        raise InfeasibleError(too_big)
    time_limit_s = options.time_limit_s
    if time_limit_s is None:
        time_limit_s = default_time_limit_s(instance)
    # every GPU first, then most model parallelism (experts split over ep count too):
    # when the budget stops the bounding early, the layouts most likely to fit a large
    # model on all GPUs have been bounded
    # and round-robin over (degrees, micro-batch): every one is bounded once before the
    # knob variants of any (the variants multiply with experts and context parallelism)
    everything = max(gpu_counts(instance, space))
    layouts = sorted(
        enumerate_layouts(instance, space),
        key=lambda p: (p.num_gpus != everything, -p.tp * p.pp * p.ep, -p.num_gpus),
    )
    layouts = round_robin(layouts, everything)
    layouts = preferred_skeletons(instance, layouts)
    runner = make_runner(instance, layouts, options)
    # the workers' start-up (a Ray cluster, its actors) comes off the budget first
    ready = time.perf_counter()
    if not deterministic:  # a work budget owes nothing to the clock
        time_limit_s = max(time_limit_s - (ready - start), 0.0)
    interrupted = False
    try:
        result = _run(instance, space, options, time_limit_s, runner, layouts, ready)
        result.stats.wall_time_s = time.perf_counter() - start
        if deterministic:
            result.stats.notes.append(
                f"deterministic: {time_limit_s:g} reference s of work took "
                f"{result.stats.wall_time_s:.1f} s here"
            )
        return result
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        runner.close(abort=interrupted)


def _run(
    instance: Instance, space: SearchSpace, search_options: SearchOptions, time_limit_s: float,
    runner: Runner, layouts: list[Plan], start: float,
) -> SearchResult:  # fmt: skip
    """The phases of :func:`search` over ``layouts`` in order (``time_limit_s``: what is
    left of the budget)."""
    method, top_k = search_options.method, search_options.top_k
    max_solves, on_best = search_options.max_solves, search_options.on_best
    notify = search_options.progress or _quiet
    options = search_options.solve_options()
    stats = SearchStats(layouts=len(layouts))
    weight = objective_weight(space)
    evaluator = Evaluator(instance, validate=False)
    survivors: list[tuple[float, int]] = []  # (bound, index into layouts)
    det = Spent() if options.deterministic else None  # the work clock (reference s)
    clock = det.now if det else time.perf_counter
    t0 = 0.0 if det else start  # the budget's origin on its clock
    bound_until = t0 + BOUND_SHARE * time_limit_s
    handed = 0

    def bounding() -> bool:  # the first chunk always; then while the share lasts
        nonlocal handed
        handed += 1
        return handed == 1 or det is not None or time.perf_counter() <= bound_until

    done = 0
    count = bound_count(time_limit_s, BOUND_SHARE) if det else len(layouts)
    for i, result in in_order(runner, bound_layouts, range(min(count, len(layouts))), bounding):
        notify("bounds", i + 1, len(layouts))
        done = i + 1
        plan = layouts[i]
        if result.status == "invalid":
            stats.invalid += 1
        elif result.status == "never fits":
            stats.pruned_memory += 1
            if result.deficit_bytes < stats.smallest_deficit_bytes:
                stats.smallest_deficit_bytes = result.deficit_bytes
                stats.deficit_layout = plan.layout()
        else:
            total = plan.num_gpus
            bound = result.bound_s
            stats.bound_by_gpus[total] = min(bound, stats.bound_by_gpus.get(total, math.inf))
            survivors.append((bound * weight(plan), i))
    if det:
        det.spend(done * BOUND_S)
    if done < len(layouts):
        stats.skipped_budget += len(layouts) - done
        stats.notes.append(f"bounding stopped by the budget after {done} of {len(layouts)} layouts")
    if not survivors and stats.skipped_budget:
        raise SolverTimeoutError(
            f"the time limit of {time_limit_s:g} s ran out while bounding the layouts: none of "
            f"the {len(layouts) - stats.skipped_budget} bounded of {len(layouts)} fits; give a "
            f"longer --time-limit"
        )
    if not survivors:
        raise InfeasibleError(_nothing_fits(instance, space, stats))
    survivors.sort(key=lambda item: item[0])
    if not stats.skipped_budget:  # every layout bounded: none beats the least bound
        stats.lower_bound = survivors[0][0]

    def improved(plan: Plan) -> None:
        if on_best is not None:
            cost = plan_time(plan) * weight(plan)
            low = stats.lower_bound
            on_best(plan, None if low is None else max(cost - low, 0.0) / cost)

    score_until = t0 + SCORE_SHARE * time_limit_s
    candidates = score_all(runner, layouts, survivors, stats, notify, score_until, weight,
                           clock, SCORE_S if det else 0.0)  # fmt: skip
    if det:
        det.spend(stats.scored * SCORE_S)
    pool: list[Plan] = []
    solved: list[Plan] = []
    try:
        if method in SWEPT_METHODS:
            notify("sweep", 0, len(candidates))
            until = clock() + SWEEP_SHARE * time_limit_s
            if det:
                pool, candidates = sweep_ordered(runner, layouts, candidates, options, until,
                                                 weight, det)  # fmt: skip
            else:
                pool, candidates = sweep_all(runner, layouts, candidates, options, until, weight)
            stats.notes.append(f"greedy sweep: {len(pool)} plans")
            if pool:
                improved(min(pool, key=lambda p: plan_time(p) * weight(p)))
        incumbent = min((plan_time(p) * weight(p) for p in pool), default=math.inf)
        if det:
            solve_ordered(instance, evaluator, runner, candidates, stats, notify,
                          SOLVE_SHARE * time_limit_s - det.now(), options, max_solves, weight,
                          incumbent, solved=solved, improved=improved)  # fmt: skip
        else:
            solve_all(instance, evaluator, runner, candidates, stats, notify, start,
                      SOLVE_SHARE * time_limit_s, options, max_solves, weight, incumbent,
                      solved=solved, improved=improved)  # fmt: skip
    except KeyboardInterrupt:
        if not pool and not solved:
            raise
        stats.interrupted = True
        stats.notes.append("interrupted: the best plans found until then")
        runner.close(abort=True)
        by_layout: dict[str, Plan] = {}
        for plan in sorted(pool + solved, key=lambda p: plan_time(p) * weight(p)):
            by_layout.setdefault(plan.layout(), plan)  # the analytic best of each layout
        ranked = list(by_layout.values())[:top_k]
        stats.wall_time_s = time.perf_counter() - start
        return SearchResult(ranked, stats)
    plans = pool + solved
    end = math.inf if det else t0 + time_limit_s  # the heuristics after: bounded work
    if not plans:  # every solve failed or ran out of time: the scored skeletons remain
        plans = fallback(evaluator, candidates, options, method, top_k, end)
        stats.notes.append(f"{method} returned no plan in time: Megatron's defaults returned")
    if not plans and stats.solved == 0 and stats.skipped_budget:
        raise InfeasibleError(
            f"no plan within the time limit of {time_limit_s:g} s: it ran out before any of "
            f"the {len(survivors)} layouts that may fit was solved; give a longer --time-limit"
        )
    if not plans and not stats.crossed_failed_links:
        raise InfeasibleError(_nothing_fits(instance, space, stats))
    if not plans:
        raise InfeasibleError(
            f"nothing fits or avoids the failed links: {len(survivors)} layouts pass the memory "
            f"lower bound, but {method} found no plan on the {stats.method_failures} it tried, "
            f"nor does Megatron's default on any scored one; "
            + ", ".join(knob_hints(space))
            + ", or try another --method or a longer --time-limit"
        )
    with work.deterministic(det is not None, REFERENCE_WORK_S):  # greedy's repairs metered
        plans += all_gpus_reference(
            instance, evaluator, plans, candidates, options, stats.best_by_gpus, end
        )
    for plan in plans:
        total, seconds = plan.num_gpus, plan_time(plan)
        stats.best_by_gpus[total] = min(seconds, stats.best_by_gpus.get(total, math.inf))
    ranked = rerank(evaluator, plans, top_k, notify, until=end, weight=weight)
    if stats.lower_bound is not None:
        ranked = [_with_search_gap(p, plan_time(p) * weight(p), stats.lower_bound) for p in ranked]
    stats.wall_time_s = time.perf_counter() - start
    return SearchResult(ranked, stats)


def _with_search_gap(plan: Plan, cost: float, low: float) -> Plan:
    """``plan`` with its gap to the search's lower bound in its solver report."""
    if plan.solve_info is None or cost <= 0:
        return plan
    info = plan.solve_info.model_copy(update={"search_gap": max(cost - low, 0.0) / cost})
    return plan.model_copy(update={"solve_info": info})


def _quiet(phase: str, done: int, total: int) -> None:
    """No progress report."""


def _nothing_fits(instance: Instance, space: SearchSpace, stats: SearchStats) -> str:
    """One line: the model's deficit if no layout can fit, else the smallest deficit
    of a layout and what would make one fit."""
    too_big = capacity_error(instance, space)
    if too_big:
        return too_big
    if not math.isfinite(stats.smallest_deficit_bytes):
        return (
            f"no valid layout of {instance.model.name} on {instance.cluster.num_gpus} GPUs in the "
            f"search space ({stats.layouts} layouts, {stats.invalid} invalid); widen the search space"
        )
    return (
        f"nothing fits in memory: the closest layout ({stats.deficit_layout}) needs "
        f"{stats.smallest_deficit_bytes / 1e9:.2f} GB more per GPU; " + ", ".join(knob_hints(space))
    )
