"""The interface between the placement formulation and a solver.

:class:`~pipette_cp.solvers.placement.model.PlacementModel` writes every
constraint family once through :class:`Backend`;
:class:`~pipette_cp.solvers.placement.cpsat.CpSatBackend` and
:class:`~pipette_cp.solvers.placement.milp.MilpBackend` implement it, each with
its own scaling of times (in one place each).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

Terms = Sequence[tuple[float, Any]]

#: Cut gradients of time inputs are multiples of ``1 / CUT_GRID`` (CP-SAT multiplies cut
#: rows by it to make them integer).  Fine enough that a gradient rounded down loses
#: under 1e-6 of a typical time (ZeRO-2's step gather has a gradient of params / layer).
CUT_GRID = 2**16


@dataclass(frozen=True)
class MasterResult:
    """One solve of a master: status in {optimal, feasible, infeasible, unknown}."""

    status: str
    objective_s: float | None
    bound_s: float | None
    wall_time_s: float
    #: values of the watched variables at every improving solution (CP-SAT), oldest first
    solutions: tuple[tuple[int, ...], ...] = ()


class Backend(Protocol):
    """What a solver must offer the formulation (variables are opaque handles).

    Time values are in seconds here; each backend scales them its own way, in
    one place.  ``watch``: variables whose values :meth:`solve` records at every
    improving solution, when the solver can (extra Kelley cuts).  ``add_time_bound``: ``var >= const + sum coef * lit`` (coef in s
    per unit of the 0/1 or integer ``lit``), only when ``enforce`` is true.
    ``add_linear``: integer ``sum coef * var (sense) rhs`` over 0/1 variables.
    ``add_cut``: ``t >= intercept + sum g * time_var + sum g_s * bool_var``.
    """

    def new_bool(self, name: str) -> Any: ...

    def new_time(self, name: str, lb_s: float, ub_s: float) -> Any: ...

    def add_linear(self, terms: Terms, sense: str, rhs: int, name: str) -> None: ...

    def add_time_bound(
        self, var: Any, terms: Terms, const_s: float, enforce: Any | None, name: str
    ) -> None: ...

    def add_cut(
        self, t: Any, intercept_s: float, time_terms: Terms, bool_terms: Terms, name: str
    ) -> None: ...

    def minimise(self, t: Any) -> None: ...

    def hint(self, values: dict[Any, int]) -> None: ...

    def solve(self, time_limit_s: float, workers: int, seed: int) -> MasterResult: ...

    def watch(self, variables: list[Any]) -> None: ...

    def value(self, var: Any) -> float: ...

    def export(self, path: str) -> None: ...
