"""Robust planning over bandwidth snapshots of one cluster (docs/design.md, section 5, G6).

A measured bandwidth matrix is a snapshot: about half of the pair-to-pair variation
changes between measurements and slow links come and go, so a plan tuned to one
snapshot can be slow on the next.  :func:`robust_search` looks for the plan whose
``quantile`` of the predicted iteration time over the snapshots is smallest
(``quantile=1``: the worst snapshot).  It is a heuristic in three steps, not an exact
min-max model:

1. **Planning matrix** (:func:`planning_cluster`): the element-wise quantile of the
   snapshots' matrices from the slow side, ``np.quantile(stack, 1 - q, axis=0)``, so a
   link is planned at a value it beats in a fraction ``q`` of the snapshots
   (``q = 1``: its minimum; a pair failed in any snapshot is failed).  The normal
   :func:`~pipette_cp.search.loop.search` optimises that matrix with its per-link
   costs.  For ``q = 1`` its objective is an upper bound of the true worst case
   (every link at its worst at once), not the worst case itself.
2. **Candidates**: the top ``candidates`` plans of that search, the top plans of a
   plain search on the ``reference`` snapshot, any ``extra_plans``, and the best
   few of these solved again on the planning matrix from their own placement
   (``polish``; exact methods never return worse than such a hint).
3. **Exact re-ranking**: every candidate is evaluated on every snapshot
   (:class:`~pipette_cp.cost.evaluator.evaluate.Evaluator`); a plan that crosses a link failed
   in a snapshot, or fails the checker there, takes ``inf`` on it.  Plans are ranked
   by the q-quantile of their times over the snapshots (the ``ceil(q S)``-th
   smallest of ``S``, an actual snapshot).  The ranking is exact for the
   candidates, but the best robust plan may lie outside them.

Every returned plan fits in memory and passes :func:`~pipette_cp.checker.check_plan`
on every snapshot where its time is finite, and carries its evaluation on its
quantile snapshot.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from pipette_cp.checker import check_plan
from pipette_cp.cost.evaluator.evaluate import Evaluator, Predictor
from pipette_cp.errors import InfeasibleError, PipetteError, SpecError
from pipette_cp.search.loop import Progress, SearchStats, default_time_limit_s, search
from pipette_cp.search.options import DEFAULT_OPTIONS, SearchOptions
from pipette_cp.search.snapshots import (
    check_quantile,
    check_snapshots,
    planning_cluster,
    planning_matrix,
    quantile_index,
    with_cluster,
)
from pipette_cp.solvers import SolveOptions, get_method
from pipette_cp.specs import ClusterSpec, Evaluation, Instance, Plan
from pipette_cp.specs.knobs import plan_key

__all__ = [
    "BUDGET_SHARES", "RobustResult", "check_quantile", "check_snapshots", "planning_cluster",
    "planning_matrix", "quantile_index", "robust_search", "score_plans", "snapshot_times",
    "with_cluster",
]  # fmt: skip

#: Shares of the budget: the search on the planning matrix, the plain search on the
#: reference snapshot, and re-solving the best candidates on the planning matrix
#: (scoring on the snapshots is fast).
BUDGET_SHARES = (0.45, 0.35, 0.20)


@dataclass
class RobustResult:
    """Plans ranked by their quantile time over the snapshots, best first.

    Attributes
    ----------
    plans : list[Plan]
        Best first; each carries its evaluation on its quantile snapshot
        (``critical[i]``), so ``plans[i].evaluation.iteration_time_s == scores_s[i]``.
    times_s : list[list[float]]
        ``times_s[i][j]``: plan ``i`` on snapshot ``j``, s (``inf``: it crosses a link
        failed there).
    scores_s : list[float]
        The quantile of ``times_s[i]`` that ranks the plans.
    critical : list[int]
        Index of the snapshot whose time is plan ``i``'s score.
    quantile : float
        The q of the ranking and of the planning matrix (1.0 = worst case).
    snapshot_names : list[str]
        Names of the snapshots, in the order given.
    planning : ClusterSpec
        The planning matrix's cluster (its ``source`` says q and how many snapshots).
    candidates : int
        Distinct plans scored on every snapshot.
    stats : SearchStats
        What the search on the planning matrix did (notes include the other steps).
    """

    plans: list[Plan]
    times_s: list[list[float]]
    scores_s: list[float]
    critical: list[int]
    quantile: float
    snapshot_names: list[str]
    planning: ClusterSpec
    candidates: int
    stats: SearchStats = field(default_factory=SearchStats)


class _Scorer:
    """Evaluate plans on every snapshot (one evaluator per snapshot)."""

    def __init__(
        self, instance: Instance, snapshots: Sequence[ClusterSpec], predictor: Predictor
    ) -> None:
        self.instances = [with_cluster(instance, s) for s in snapshots]
        self.evaluators = [Evaluator(inst) for inst in self.instances]
        self.predictor: Predictor = predictor

    def __call__(self, plan: Plan) -> list[Evaluation | None]:
        """``plan``'s evaluation on each snapshot; None where it crosses a failed link,
        misses memory or fails the checker."""
        out: list[Evaluation | None] = []
        for inst, ev in zip(self.instances, self.evaluators, strict=True):
            try:
                evaluation = ev.evaluate(plan, self.predictor)
            except InfeasibleError:  # crosses a link failed in this snapshot
                out.append(None)
                continue
            ok = evaluation.fits and not check_plan(inst, plan)
            out.append(evaluation if ok else None)
        return out


def snapshot_times(
    instance: Instance,
    snapshots: Sequence[ClusterSpec],
    plans: Sequence[Plan],
    predictor: Predictor = "simulator",
) -> list[list[float]]:
    """``out[i][j]``: iteration time of ``plans[i]`` on ``snapshots[j]``, s (``inf`` where
    it crosses a failed link, misses memory or fails the checker)."""
    check_snapshots(snapshots)
    score = _Scorer(instance, snapshots, predictor)
    return [[e.iteration_time_s if e else math.inf for e in score(p)] for p in plans]


def score_plans(
    instance: Instance,
    snapshots: Sequence[ClusterSpec],
    plans: Sequence[Plan],
    quantile: float = 1.0,
    predictor: Predictor = "simulator",
    progress: Progress | None = None,
) -> RobustResult:
    """Evaluate ``plans`` on every snapshot and rank them by their q-quantile time.

    Plans that do not fit, or whose quantile is ``inf``, are dropped.  ``planning``
    of the result is the :func:`planning_cluster`; ``stats`` is empty.

    Raises
    ------
    InfeasibleError
        When no plan has a finite quantile time.
    """
    q = check_quantile(quantile)
    check_snapshots(snapshots)
    notify = progress or (lambda phase, done, total: None)
    score = _Scorer(instance, snapshots, predictor)
    distinct: dict[tuple, Plan] = {}
    for plan in plans:  # the first of equal plans (the one with its search's solve info)
        distinct.setdefault(plan_key(plan), plan)
    unique = list(distinct.values())
    rows = []
    for i, plan in enumerate(unique):
        notify("robust", i + 1, len(unique))
        evals = score(plan)
        times = [e.iteration_time_s if e is not None else math.inf for e in evals]
        crit = int(np.argsort(times, kind="stable")[quantile_index(len(times), q)])
        if math.isfinite(times[crit]):
            finite = [t for t in times if math.isfinite(t)]
            rows.append((times[crit], sum(finite) / len(finite), i, plan, times, crit, evals))
    if not rows:
        raise InfeasibleError(
            f"none of {len(unique)} candidate plans runs on a {q:g} share of the "
            f"{len(snapshots)} snapshots (each crosses a failed link or misses memory)"
        )
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    return RobustResult(
        plans=[r[3].model_copy(update={"evaluation": r[6][r[5]]}) for r in rows],
        times_s=[r[4] for r in rows],
        scores_s=[r[0] for r in rows],
        critical=[r[5] for r in rows],
        quantile=q,
        snapshot_names=[s.name for s in snapshots],
        planning=planning_cluster(snapshots, q),
        candidates=len(unique),
    )


def robust_search(
    instance: Instance,
    snapshots: Sequence[ClusterSpec],
    options: SearchOptions = DEFAULT_OPTIONS,
    *,
    quantile: float = 1.0,
    candidates: int = 10,
    reference: int | None = 0,
    extra_plans: Sequence[Plan] = (),
    polish: int = 3,
    predictor: Predictor = "simulator",
) -> RobustResult:
    """The ``options.top_k`` plans with the smallest q-quantile time over ``snapshots``.

    Parameters
    ----------
    instance
        Model, training and search space; its cluster is replaced by the snapshots.
    snapshots
        Measurements of one cluster (same nodes and GPUs), e.g. a G6 timeline.
    options
        As :func:`~pipette_cp.search.loop.search` (``constraints`` also bind the
        re-solves; ``extra_plans`` are taken as given); ``top_k``: plans returned;
        ``time_limit_s``: the total budget, s (default: the search's own default),
        shared as :data:`BUDGET_SHARES` (the reference's share goes to the planning
        matrix when there is no reference).  Not ``deterministic`` (the steps are
        budgeted by wall time) nor ``on_best``.
    quantile
        q in (0, 1]: the share of the snapshots the plan is protected against
        (1 = the worst snapshot).
    candidates
        Plans kept from each search (K, at least ``top_k``).
    reference
        Index of the snapshot whose plain search adds its top ``candidates`` plans
        (None: no such search).
    extra_plans
        More candidates (e.g. the plan in use), scored like the others.
    polish
        The best this many candidates are solved again on the planning matrix with
        ``method``, from their own placement (exact methods never return worse than
        that hint), and the results join the candidates.
    predictor
        Model scoring the plans on the snapshots (the search re-ranks with the simulator).

    Raises
    ------
    SpecError
        Snapshots of different clusters, a bad quantile or reference index, a
        planning matrix that isolates a node, or ``deterministic`` / ``on_best`` options.
    InfeasibleError
        Nothing fits, or no candidate runs on a q share of the snapshots.
    """
    start = time.perf_counter()
    q = check_quantile(quantile)
    check_snapshots(snapshots)
    if reference is not None and not -len(snapshots) <= reference < len(snapshots):
        raise SpecError("reference", reference, f"expected a snapshot index < {len(snapshots)}")
    for name in ("deterministic", "on_best"):
        if getattr(options, name):
            raise SpecError(name, getattr(options, name), "the robust search is budgeted by "
                            "wall time and ranks its candidates at the end")  # fmt: skip
    planning = planning_cluster(snapshots, q)
    limit_s = options.time_limit_s
    budget = limit_s if limit_s is not None else default_time_limit_s(instance)
    plan_share, ref_share, _ = BUDGET_SHARES
    if reference is None:
        plan_share += ref_share
    keep = max(candidates, options.top_k)
    stats, pool, error = SearchStats(), list[Plan](), None
    runs = [(planning, "the planning matrix")]
    if reference is not None:
        runs.append((snapshots[reference], f"snapshot {reference}"))
    for cluster, what in runs:
        end = plan_share if cluster is planning else plan_share + ref_share
        limit = max(start + end * budget - time.perf_counter(), 1.0)
        try:
            found = search(with_cluster(instance, cluster),
                           replace(options, top_k=keep, time_limit_s=limit))  # fmt: skip
        except InfeasibleError as exc:  # e.g. every placement crosses a failed link
            error = error or exc
            stats.notes.append(f"search on {what}: {exc}")
            continue
        pool += found.plans
        if cluster is planning:
            stats = found.stats
    pool += list(extra_plans)
    if not pool:
        assert error is not None  # a search without plans raises
        raise error
    progress = options.progress
    result = score_plans(instance, snapshots, pool, q, predictor, progress)
    if polish > 0:
        left = max(start + budget - time.perf_counter(), 0.5 * polish)
        again = replace(options.solve_options(), time_limit_s=left)
        pool += _polish(with_cluster(instance, planning), result.plans[:polish], options.method,
                        again)  # fmt: skip
        result = score_plans(instance, snapshots, pool, q, predictor, progress)
    stats.notes.append(
        f"robust: {result.candidates} candidates scored on {len(snapshots)} snapshots "
        f"(q={q:g}, {predictor}) in {time.perf_counter() - start:.1f} s"
    )
    top_k = options.top_k
    result.plans, result.times_s = result.plans[:top_k], result.times_s[:top_k]
    result.scores_s, result.critical = result.scores_s[:top_k], result.critical[:top_k]
    result.planning, result.stats = planning, stats
    stats.wall_time_s = time.perf_counter() - start
    return result


def _polish(
    planning: Instance, plans: Sequence[Plan], method: str, options: SolveOptions
) -> list[Plan]:
    """``plans`` solved again on the planning instance, each from its own placement,
    sharing ``options.time_limit_s``."""
    solve, start, out = get_method(method), time.perf_counter(), []
    for i, plan in enumerate(plans):
        left = options.time_limit_s - (time.perf_counter() - start)
        share = replace(options, time_limit_s=max(left / (len(plans) - i), 0.5))
        try:
            out.append(solve(planning, plan.model_copy(update={"evaluation": None}), share))
        except PipetteError:  # a heuristic may fail where the hint was fine: keep the hint
            continue
    return out
