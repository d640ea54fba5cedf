"""The library entry point mirroring ``pipette-cp solve``.

The functions take the search's options as keywords (:class:`~pipette_cp.search.options.SearchKeywords`:
``method``, ``top_k``, ``time_limit_s``, ``seed``, ``space``, ``constraints``,
``milp_solver``, ``jobs``, ``executor``, ``ray_address``, ``deterministic``, ``progress``,
``on_best``, ``max_solves``) and build one :class:`~pipette_cp.search.options.SearchOptions`
from them, which the search takes whole (:func:`solve_with_options`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar, Unpack

from pipette_cp.io.cluster_file import read_cluster_file
from pipette_cp.io.instance_file import DEFAULT_INSTANCE, load_instance
from pipette_cp.search import search
from pipette_cp.search.loop import SearchResult
from pipette_cp.search.options import SearchKeywords, SearchOptions
from pipette_cp.search.robust import RobustResult, robust_search
from pipette_cp.specs import ClusterSpec, Instance, Plan

_Result = TypeVar("_Result", SearchResult, RobustResult)


def solve(
    instance: Instance | str | Path = DEFAULT_INSTANCE, **options: Unpack[SearchKeywords]
) -> list[Plan]:
    """The fastest plans that fit in memory, best first.

    Parameters
    ----------
    instance
        An :class:`~pipette_cp.specs.Instance`, a bundled instance name or a path.
    method
        Split/placement method from :data:`pipette_cp.solvers.METHODS`
        (``cpsat``, ``milp``, ``greedy``, ``pipette-sa``, ``amp``, ``megatron-default``, ...).
    top_k, time_limit_s, seed, space
        Number of plans returned, total wall-clock budget (default: 0.12 s per GPU,
        8-540 s, see :func:`pipette_cp.search.loop.default_time_limit_s`), random seed,
        and an optional override of the instance's search space.
    constraints
        User constraint families added to the CP-SAT and MILP models
        (:mod:`pipette_cp.solvers.extensions`).
    milp_solver
        Engine of the ``milp`` methods' masters: ``highs`` (default), ``cbc``, or
        ``gurobi``, ``cplex``, ``xpress`` where PuLP can start them
        (:mod:`pipette_cp.solvers.milp_engine`); another name, or one that cannot
        start, is a :class:`~pipette_cp.errors.SpecError` before any work.
    jobs, executor, ray_address
        Workers for the layouts' bounds, scores and solves: processes here
        (``"local"``) or Ray actors (``"ray"``, on the cluster at ``ray_address`` or a
        local one); see :mod:`pipette_cp.search.executors.workers`.
    deterministic
        Budget by work, not wall time: ``time_limit_s`` is then reference seconds of
        work (:mod:`pipette_cp.search.deterministic`), and the same arguments give the same
        plans on any machine, for any ``jobs``; not with the ``milp`` methods (a
        :class:`~pipette_cp.errors.SpecError`).
    progress, on_best, max_solves
        Called with each phase's progress ``(phase, done, total)``; called with every new
        incumbent and its gap ``(plan, gap)``; at most this many layouts solved
        (:class:`~pipette_cp.search.options.SearchOptions`).

    Examples
    --------
    >>> from pipette_cp import solve
    >>> plans = solve("gpt3-1.3b-nominal-8", method="megatron-default", top_k=2, time_limit_s=20)
    >>> best = plans[0]
    >>> best.evaluation.fits, best.num_gpus
    (True, 8)
    >>> best.evaluation.iteration_time_s <= plans[-1].evaluation.iteration_time_s
    True
    """
    return solve_with_options(instance, SearchOptions(**options)).plans


def solve_with_stats(
    instance: Instance | str | Path = DEFAULT_INSTANCE, **options: Unpack[SearchKeywords]
) -> SearchResult:
    """:func:`solve`, also returning what the search did; ``on_best(plan, gap)`` is
    called with every new incumbent (in the candidates' order with ``deterministic``)."""
    return solve_with_options(instance, SearchOptions(**options))


def solve_with_options(instance: Instance | str | Path, options: SearchOptions) -> SearchResult:
    """:func:`solve_with_stats` with the options as one
    :class:`~pipette_cp.search.options.SearchOptions` (what ``pipette-cp solve`` builds)."""
    name, inst = _resolve(instance)
    return _named(name, search(inst, options))


def solve_robust(
    instance: Instance | str | Path,
    snapshots: Sequence[ClusterSpec | str | Path],
    *,
    quantile: float = 1.0,
    **options: Unpack[SearchKeywords],
) -> RobustResult:
    """Plans with the smallest ``quantile`` of the iteration time over bandwidth
    ``snapshots`` (clusters or cluster files of one cluster), as ``pipette-cp solve
    --snapshots``; see :func:`pipette_cp.search.robust.robust_search`.

    Examples
    --------
    >>> from pipette_cp.api import solve_robust
    >>> from pipette_cp.clusters.generators.registry import generate_timeline
    >>> snaps = generate_timeline("failslow", nodes=2, seed=0, snapshots=2)
    >>> result = solve_robust("gpt3-1.3b-nominal-8", snaps, method="greedy", time_limit_s=5)
    >>> result.scores_s[0] == max(result.times_s[0])
    True
    """
    search_options = SearchOptions(**options)
    name, inst = _resolve(instance)
    clusters = [s if isinstance(s, ClusterSpec) else read_cluster_file(s) for s in snapshots]
    return _named(name, robust_search(inst, clusters, search_options, quantile=quantile))


def _named(name: str, result: _Result) -> _Result:
    """``result`` with every plan recording ``name`` as its instance."""
    result.plans = [p.model_copy(update={"instance": name}) for p in result.plans]
    return result


def _resolve(instance: Instance | str | Path) -> tuple[str, Instance]:
    """The name plans record (the bundled name or path given) and the instance."""
    if isinstance(instance, Instance):
        return instance.name, instance
    return str(instance), load_instance(instance)
