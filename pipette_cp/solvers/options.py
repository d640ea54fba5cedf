"""The common signature and options of every split/placement method."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipette_cp.solvers.extensions import ConstraintFamily
from pipette_cp.solvers.milp_engine import DEFAULT_ENGINE, check_engine
from pipette_cp.specs import Instance, Plan


@dataclass(frozen=True)
class SolveOptions:
    """Knobs shared by every method.

    Attributes
    ----------
    time_limit_s:
        Wall-clock budget of the method (heuristics honour it too); with
        ``deterministic``, reference seconds of work (:mod:`pipette_cp.solvers.work_meter`).
    seed:
        Seed of every random choice; same seed, same plan.
    workers:
        Parallel search workers for the exact solvers.
    constraints:
        User constraint families (:mod:`pipette_cp.solvers.extensions`) the exact
        solvers add to their models; other methods ignore them.
    milp_solver:
        Engine of the MILP masters (split and placement) of the ``milp`` methods:
        ``highs`` (default), ``cbc``, ``gurobi``, ``cplex`` or ``xpress``
        (:mod:`pipette_cp.solvers.milp_engine`); an unknown name is a SpecError here,
        an engine PuLP cannot start one when a ``milp`` method runs.
    deterministic:
        Budget by work, not wall time: the solvers read the work meter of
        :mod:`pipette_cp.solvers.work_meter` (the caller meters the call), CP-SAT stops at
        ``max_deterministic_time`` with a fixed seed and worker count, and the same
        call gives the same plan on any machine.  Not for the MILP engines (their
        only stop is wall time).
    work_s:
        With ``deterministic``: the method's whole work budget (reference s), of
        which the split and the placement take fixed shares (:data:`SPLIT_WORK_SHARE`,
        :data:`PLACEMENT_WORK_SHARE`) whatever ``time_limit_s`` a caller derived
        from the wall clock; None: ``time_limit_s`` is the part's own budget.
    """

    time_limit_s: float = 10.0
    seed: int = 0
    workers: int = 1
    constraints: tuple[ConstraintFamily, ...] = ()
    milp_solver: str = DEFAULT_ENGINE
    deterministic: bool = False
    work_s: float | None = None

    def work_limit_s(self, share: float) -> float:
        """A part's work budget under ``deterministic``: ``share`` of ``work_s``, or
        ``time_limit_s`` when no whole budget is given."""
        return self.time_limit_s if self.work_s is None else share * self.work_s

    def __post_init__(self) -> None:
        check_engine(self.milp_solver)


#: Shares of :attr:`SolveOptions.work_s` of the exact methods' parts (the wall-clock
#: split of :mod:`pipette_cp.solvers.methods`: split 0.4, placement the rest but the
#: re-split's 0.1).
SPLIT_WORK_SHARE = 0.4
PLACEMENT_WORK_SHARE = 0.5


#: A method takes an instance and a *skeleton* plan (degrees and knobs fixed; its
#: ``layer_split`` and ``placement`` are a starting point that may be ignored) and
#: returns a complete plan whose ``solve_info`` reports how it was found.
Method = Callable[[Instance, Plan, SolveOptions], Plan]
