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
        Wall-clock budget of the method (heuristics honour it too).
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
    """

    time_limit_s: float = 10.0
    seed: int = 0
    workers: int = 1
    constraints: tuple[ConstraintFamily, ...] = ()
    milp_solver: str = DEFAULT_ENGINE

    def __post_init__(self) -> None:
        check_engine(self.milp_solver)


#: A method takes an instance and a *skeleton* plan (degrees and knobs fixed; its
#: ``layer_split`` and ``placement`` are a starting point that may be ignored) and
#: returns a complete plan whose ``solve_info`` reports how it was found.
Method = Callable[[Instance, Plan, SolveOptions], Plan]
