"""How a search runs, as one frozen object: :class:`SearchOptions`.

:func:`~pipette_cp.search.loop.search`, :func:`~pipette_cp.search.robust.robust_search`,
the runners (:func:`~pipette_cp.search.executors.runners.make_runner`) and the
``pipette-cp solve`` command take it whole; the library's keyword functions
(:func:`pipette_cp.api.solve` and its siblings) build it once from their keywords
(:class:`SearchKeywords`, the same names).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import TypedDict

from pipette_cp.solvers import SolveOptions
from pipette_cp.solvers.extensions import ConstraintFamily
from pipette_cp.solvers.milp_engine import DEFAULT_ENGINE
from pipette_cp.specs import Plan, SearchSpace

#: ``progress(phase, done, total)``; phases: "bounds", "score", "solve", "rerank".
Progress = Callable[[str, int, int], None]
#: ``on_best(plan, gap)``: a new incumbent (evaluated) and its gap to the search's lower
#: bound (None while some layout is unbounded).
Incumbent = Callable[[Plan, float | None], None]


@dataclass(frozen=True)
class SearchOptions:
    """Everything about a search but the instance.

    Attributes
    ----------
    method
        Split/placement method from :data:`pipette_cp.solvers.METHODS` (``cpsat``,
        ``milp``, ``greedy``, ``pipette-sa``, ``amp``, ``megatron-default``, ...).
    top_k
        Plans returned, best first.
    time_limit_s
        Total budget, s (None: :func:`~pipette_cp.search.loop.default_time_limit_s`); with
        ``deterministic``, reference seconds of work.
    seed
        Random seed of the methods.
    space
        Replaces the instance's search space (None: the instance's).
    constraints
        User constraint families (:mod:`pipette_cp.solvers.extensions`): the exact
        methods add them to their models, and plans that violate one are dropped.
    milp_solver
        Engine of the ``milp`` methods' masters (:mod:`pipette_cp.solvers.milp_engine`).
    jobs, executor, ray_address
        Workers for the layouts' bounds, scores and solves: processes here (``local``)
        or Ray actors (``ray``, on the cluster at ``ray_address`` or a local one).
    deterministic
        Budget by work, not wall time (:mod:`pipette_cp.search.deterministic`).
    progress, on_best
        Called with each phase's progress, and with every new incumbent and its gap.
    max_solves
        At most this many layouts solved (None: as the budget allows).
    """

    method: str = "cpsat"
    top_k: int = 5
    time_limit_s: float | None = None
    seed: int = 0
    space: SearchSpace | None = None
    constraints: Sequence[ConstraintFamily] = ()
    milp_solver: str = DEFAULT_ENGINE
    jobs: int = 1
    executor: str = "local"
    ray_address: str | None = None
    deterministic: bool = False
    progress: Progress | None = None
    on_best: Incumbent | None = None
    max_solves: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "constraints", tuple(self.constraints))

    def solve_options(self) -> SolveOptions:
        """What every solve of the search shares (its time limit is set per solve)."""
        return SolveOptions(seed=self.seed, constraints=tuple(self.constraints),
                            milp_solver=self.milp_solver, deterministic=self.deterministic)  # fmt: skip


#: Every option at its default.
DEFAULT_OPTIONS = SearchOptions()


class SearchKeywords(TypedDict, total=False):
    """:class:`SearchOptions` as keyword arguments (the library's functions take them)."""

    method: str
    top_k: int
    time_limit_s: float | None
    seed: int
    space: SearchSpace | None
    constraints: Sequence[ConstraintFamily]
    milp_solver: str
    jobs: int
    executor: str
    ray_address: str | None
    deterministic: bool
    progress: Progress | None
    on_best: Incumbent | None
    max_solves: int | None


#: The option names, in :class:`SearchOptions`' order.
OPTION_NAMES = tuple(f.name for f in fields(SearchOptions))
