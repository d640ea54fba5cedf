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

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from pipette_cp.checker import check_plan
from pipette_cp.cost.evaluate import Evaluator, validate_layout
from pipette_cp.errors import InfeasibleError, LayoutError, PipetteError, SolverTimeoutError
from pipette_cp.search.bounds import memory_check, time_lower_bound
from pipette_cp.search.capacity import capacity_error, knob_hints
from pipette_cp.search.fallback import fallback
from pipette_cp.search.rerank import plan_time, rerank
from pipette_cp.search.selection import (
    Weight,
    all_gpus_reference,
    lift,
    objective_weight,
    preferred_skeletons,
    restrict,
)
from pipette_cp.search.space import check_degrees, enumerate_layouts, gpu_counts
from pipette_cp.search.sweep import SWEPT_METHODS, Candidate, sweep
from pipette_cp.solvers import SolveOptions, get_method
from pipette_cp.solvers.extensions import ConstraintFamily, family_violations
from pipette_cp.specs import Instance, Plan, SearchSpace

#: ``progress(phase, done, total)``; phases: "bounds", "score", "solve", "rerank".
Progress = Callable[[str, int, int], None]


#: Share of the budget the solves may use; the rest covers re-ranking and reporting.
SOLVE_SHARE = 0.85
#: Share of the budget after which scoring skeletons stops (once one fits, or once
#: MIN_SCORED default placements have crossed a failed link).
SCORE_SHARE = 0.4
MIN_SCORED = 32
#: Share of the budget for the greedy sweep before the exact solves (cpsat, milp).
SWEEP_SHARE = 0.2
#: Share of the budget after which bounding the layouts stops (the rest are not tried).
BOUND_SHARE = 0.3
#: Least time a solve is started with, per GPU of the cluster (its fixed costs: 4,096
#: GPUs took about 3 s before the first master solve), s.
MIN_SOLVE_S_PER_GPU = 1e-3


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


def search(
    instance: Instance,
    *,
    method: str = "cpsat",
    top_k: int = 5,
    time_limit_s: float | None = None,
    seed: int = 0,
    space: SearchSpace | None = None,
    max_solves: int | None = None,
    progress: Progress | None = None,
    constraints: Sequence[ConstraintFamily] = (),
) -> SearchResult:
    """The ``top_k`` fastest plans that fit, best first (see the module docstring).

    ``constraints``: user constraint families (:mod:`pipette_cp.solvers.extensions`);
    the exact methods add them to their models, and plans that violate one are dropped.

    Raises
    ------
    InfeasibleError
        When no layout fits in memory: the model's whole-model deficit when even
        maximal sharding does not fit (:mod:`~pipette_cp.search.capacity`), else the
        smallest deficit of a layout and what would make one fit.
    """
    start = time.perf_counter()
    space = space or instance.search_space
    if space != instance.search_space:  # the evaluator and checker read the instance's
        instance = instance.model_copy(update={"search_space": space})
    if space.exclude_nodes:  # every method sees only the nodes left; plans mapped back
        sub, kept = restrict(instance)
        found = search(sub, method=method, top_k=top_k, time_limit_s=time_limit_s, seed=seed,
                       max_solves=max_solves, progress=progress, constraints=constraints)  # fmt: skip
        return SearchResult([lift(p, kept) for p in found.plans], found.stats)
    check_degrees(instance, space)  # a space with no (dp, pp, tp) is bad input, not "nothing fits"
    too_big = capacity_error(instance, space)
    if too_big:  # no layout can fit: say so before enumerating them
        raise InfeasibleError(too_big)
    if time_limit_s is None:
        time_limit_s = default_time_limit_s(instance)
    solve = get_method(method)
    notify = progress or (lambda phase, done, total: None)
    stats = SearchStats()
    weight = objective_weight(space)
    evaluator = Evaluator(instance, validate=False)
    survivors: list[tuple[float, Plan]] = []
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
    stats.layouts = len(layouts)
    bound_until = start + BOUND_SHARE * time_limit_s
    for i, plan in enumerate(layouts):
        notify("bounds", i + 1, len(layouts))
        if i and time.perf_counter() > bound_until:  # keep the budget for the solves
            stats.skipped_budget += len(layouts) - i
            stats.notes.append(
                f"bounding stopped by the budget after {i} of {len(layouts)} layouts"
            )
            break
        try:
            validate_layout(instance, plan)
        except LayoutError:
            stats.invalid += 1
            continue
        check = memory_check(instance, plan)
        if not check.feasible:
            stats.pruned_memory += 1
            if check.deficit_bytes < stats.smallest_deficit_bytes:
                stats.smallest_deficit_bytes, stats.deficit_layout = (
                    check.deficit_bytes,
                    plan.layout(),
                )
            continue
        bound = time_lower_bound(instance, plan)
        total = plan.num_gpus
        stats.bound_by_gpus[total] = min(bound, stats.bound_by_gpus.get(total, math.inf))
        survivors.append((bound * weight(plan), plan))
    if not survivors and stats.skipped_budget:
        raise SolverTimeoutError(
            f"the time limit of {time_limit_s:g} s ran out while bounding the layouts: none of "
            f"the {len(layouts) - stats.skipped_budget} bounded of {len(layouts)} fits; give a "
            f"longer --time-limit"
        )
    if not survivors:
        raise InfeasibleError(_nothing_fits(instance, space, stats))
    survivors.sort(key=lambda item: item[0])
    score_until = start + SCORE_SHARE * time_limit_s
    candidates = _score(evaluator, survivors, stats, notify, score_until, weight)
    options = SolveOptions(seed=seed, constraints=tuple(constraints))
    pool: list[Plan] = []
    if method in SWEPT_METHODS:
        notify("sweep", 0, len(candidates))
        until = time.perf_counter() + SWEEP_SHARE * time_limit_s
        pool, candidates = sweep(instance, evaluator, candidates, options, until, weight)
        stats.notes.append(f"greedy sweep: {len(pool)} plans")
    plans = pool + _solve_all(
        instance,
        evaluator,
        candidates,
        solve,
        stats,
        notify,
        start,
        SOLVE_SHARE * time_limit_s,
        options,
        max_solves,
        weight,
        min((plan_time(p) * weight(p) for p in pool), default=math.inf),
    )
    end = start + time_limit_s
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
    plans += all_gpus_reference(
        instance, evaluator, plans, candidates, options, stats.best_by_gpus, end
    )
    for plan in plans:
        total, seconds = plan.num_gpus, plan_time(plan)
        stats.best_by_gpus[total] = min(seconds, stats.best_by_gpus.get(total, math.inf))
    ranked = rerank(evaluator, plans, top_k, notify, until=end, weight=weight)
    stats.wall_time_s = time.perf_counter() - start
    return SearchResult(ranked, stats)


def _score(
    evaluator: Evaluator,
    survivors: list,
    stats: SearchStats,
    notify: Progress,
    until: float,
    weight: Weight,
) -> list[Candidate]:
    """Score skeletons in bound order until the bound passes the best fitting score
    (or the scoring share of the budget is spent: the rest are left unscored).

    Skeletons are ordered by the time of their even split (whether or not it fits:
    the memory bound says some split does) on Megatron's placement; when that crosses
    a failed link, on the cluster with failed links repaired (at the slowest working
    bandwidth).  Estimates order the solves only; pruning uses fitting scores.  Scores
    and bounds are in the objective's units (``weight`` x s)."""
    best = math.inf
    repaired: Evaluator | None = None
    scored: list[Candidate] = []
    for i, (bound, plan) in enumerate(survivors):
        notify("score", i + 1, len(survivors))
        if bound >= best:
            stats.pruned_bound += len(survivors) - i
            break
        crossed = stats.crossed_failed_links >= MIN_SCORED  # no default may ever fit
        if time.perf_counter() > until and (math.isfinite(best) or crossed):
            stats.skipped_budget += len(survivors) - i
            stats.notes.append(f"scoring stopped by the budget after {i} skeletons")
            break
        estimate = math.inf
        try:
            evaluation = evaluator.evaluate(plan)
            score = evaluation.iteration_time_s if evaluation.fits else math.inf
            deficit = -evaluation.memory_margin_bytes
            if not evaluation.fits and deficit < stats.smallest_deficit_bytes:
                stats.smallest_deficit_bytes, stats.deficit_layout = deficit, plan.layout()
            estimate = evaluation.iteration_time_s  # memory_check says some split fits
        except InfeasibleError:  # the default placement crosses a failed link
            score = math.inf
            stats.crossed_failed_links += 1
            repaired = repaired or Evaluator(_repaired(evaluator.instance), validate=False)
            with contextlib.suppress(PipetteError):
                evaluation = repaired.evaluate(plan)
                estimate = evaluation.iteration_time_s
        stats.scored += 1
        if math.isfinite(score):  # a real plan: even split on Megatron's order, fits
            known = stats.best_by_gpus.get(plan.num_gpus, math.inf)
            stats.best_by_gpus[plan.num_gpus] = min(score, known)
        best = min(best, score * weight(plan))
        scored.append(Candidate(estimate * weight(plan), bound, plan))
    return sorted(scored)


def _repaired(instance: Instance) -> Instance:
    """``instance`` with every failed GPU pair at the slowest working bandwidth."""
    bw = instance.cluster.bandwidth_bytes_per_s
    off = ~np.eye(len(bw), dtype=bool)
    working = bw[off & (bw > 0)]
    fixed = np.where(off & (bw <= 0), float(working.min()) if working.size else 1.0, bw)
    cluster = instance.cluster.model_copy(update={"bandwidth_bytes_per_s": fixed})
    return instance.model_copy(update={"cluster": cluster})


def _solve_all(
    instance: Instance,
    evaluator: Evaluator,
    candidates: list[Candidate],
    solve: Callable,
    stats: SearchStats,
    notify: Progress,
    start: float,
    budget_s: float,
    options: SolveOptions,
    max_solves: int | None,
    weight: Weight,
    best: float = math.inf,
) -> list[Plan]:
    """Run the method on candidates, most promising first, within the budget.

    Candidates that share degrees with a solved one (another micro-batch, recompute
    or optimizer setting) start from its placement and get half a share: the
    placement mostly carries over, the split is re-solved."""
    solved: list[Plan] = []
    placed: dict[tuple[int, int, int], Plan] = {}
    for i, cand in enumerate(candidates):
        notify("solve", i + 1, len(candidates))
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
        share = max(left / max(1, min(len(candidates) - i, 8)), 0.5)
        skeleton, degrees = cand.plan, cand.plan.placement_shape
        if degrees in placed:
            skeleton = skeleton.model_copy(update={"placement": placed[degrees].placement})
            share = max(share / 2, 0.5)
        try:
            plan = solve(instance, skeleton, replace(options, time_limit_s=min(share, left)))
            evaluation = evaluator.evaluate(plan)
        except PipetteError:  # infeasible, a layout the method cannot express, timed out
            stats.method_failures += 1
            continue
        stats.solved += 1
        stats.with_gap += plan.solve_info is not None and plan.solve_info.gap is not None
        if (
            not evaluation.fits
            or check_plan(instance, plan)
            or family_violations(options.constraints, instance, plan)
        ):
            stats.method_failures += 1
            continue
        best = min(best, evaluation.iteration_time_s * weight(plan))
        if degrees not in placed or plan_time(placed[degrees]) > evaluation.iteration_time_s:
            placed[degrees] = plan.model_copy(update={"evaluation": evaluation})
        solved.append(plan.model_copy(update={"evaluation": evaluation}))
    return solved


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
