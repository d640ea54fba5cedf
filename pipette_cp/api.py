"""The library entry point mirroring ``pipette-cp solve``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict, TypeVar, cast

from pipette_cp.io.cluster_file import read_cluster_file
from pipette_cp.io.instance_file import DEFAULT_INSTANCE, load_instance
from pipette_cp.search import search
from pipette_cp.search.loop import Incumbent, Progress, SearchResult
from pipette_cp.search.robust import RobustResult, robust_search
from pipette_cp.solvers.extensions import ConstraintFamily
from pipette_cp.solvers.milp_engine import DEFAULT_ENGINE
from pipette_cp.specs import ClusterSpec, Instance, Plan, SearchSpace


class _SearchOptions(TypedDict):
    """The keyword arguments :func:`solve`, :func:`solve_with_stats` and
    :func:`solve_robust` pass on to the search, unchanged."""

    method: str
    top_k: int
    time_limit_s: float | None
    seed: int
    space: SearchSpace | None
    progress: Progress | None
    constraints: Sequence[ConstraintFamily]
    milp_solver: str


_Result = TypeVar("_Result", SearchResult, RobustResult)


def solve(
    instance: Instance | str | Path = DEFAULT_INSTANCE,
    *,
    method: str = "cpsat",
    top_k: int = 5,
    time_limit_s: float | None = None,
    seed: int = 0,
    space: SearchSpace | None = None,
    progress: Progress | None = None,
    constraints: Sequence[ConstraintFamily] = (),
    milp_solver: str = DEFAULT_ENGINE,
    jobs: int = 1,
    executor: str = "local",
    ray_address: str | None = None,
    deterministic: bool = False,
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
    options = _options(locals())
    return solve_with_stats(
        instance,
        **options,
        jobs=jobs,
        executor=executor,
        ray_address=ray_address,
        deterministic=deterministic,
    ).plans


def solve_with_stats(
    instance: Instance | str | Path = DEFAULT_INSTANCE,
    *,
    method: str = "cpsat",
    top_k: int = 5,
    time_limit_s: float | None = None,
    seed: int = 0,
    space: SearchSpace | None = None,
    progress: Progress | None = None,
    constraints: Sequence[ConstraintFamily] = (),
    milp_solver: str = DEFAULT_ENGINE,
    jobs: int = 1,
    executor: str = "local",
    ray_address: str | None = None,
    on_best: Incumbent | None = None,
    deterministic: bool = False,
) -> SearchResult:
    """:func:`solve`, also returning what the search did; ``on_best(plan, gap)`` is
    called with every new incumbent (in the candidates' order with ``deterministic``)."""
    options = _options(locals())
    name, inst = _resolve(instance)
    found = search(inst, **options, jobs=jobs, executor=executor, ray_address=ray_address,
                   on_best=on_best, deterministic=deterministic)  # fmt: skip
    return _named(name, found)


def solve_robust(
    instance: Instance | str | Path,
    snapshots: Sequence[ClusterSpec | str | Path],
    *,
    quantile: float = 1.0,
    method: str = "cpsat",
    top_k: int = 5,
    time_limit_s: float | None = None,
    seed: int = 0,
    space: SearchSpace | None = None,
    progress: Progress | None = None,
    constraints: Sequence[ConstraintFamily] = (),
    milp_solver: str = DEFAULT_ENGINE,
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
    options = _options(locals())
    name, inst = _resolve(instance)
    clusters = [s if isinstance(s, ClusterSpec) else read_cluster_file(s) for s in snapshots]
    return _named(name, robust_search(inst, clusters, quantile=quantile, **options))


def _options(arguments: Mapping[str, Any]) -> _SearchOptions:
    """The :class:`_SearchOptions` among a public function's arguments (its ``locals()``
    before anything else is assigned)."""
    return cast(_SearchOptions, {name: arguments[name] for name in _SearchOptions.__annotations__})


def _named(name: str, result: _Result) -> _Result:
    """``result`` with every plan recording ``name`` as its instance."""
    result.plans = [p.model_copy(update={"instance": name}) for p in result.plans]
    return result


def _resolve(instance: Instance | str | Path) -> tuple[str, Instance]:
    """The name plans record (the bundled name or path given) and the instance."""
    if isinstance(instance, Instance):
        return instance.name, instance
    return str(instance), load_instance(instance)
