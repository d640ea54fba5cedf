"""CP-SAT backend of the placement master (:mod:`pipette_cp.solvers.placement.model`).

Integer scaling, all of it here: every time is an integer number of
:data:`TIME_QUANTUM_S` (1 ns), rounded *down* wherever it bounds a cost from
below, so the integer model is a relaxation of the real one and its bound
stays valid; Kelley cuts are multiplied by :data:`CUT_SCALE` so that their
snapped gradients (multiples of ``1 / CUT_SCALE``) become integers.  Pipette's
own CP-SAT model multiplied float message sizes into an integer model and
lost them (docs/design.md, section 2, flaw 5): here every conversion goes through
:func:`to_quanta`.
"""

from __future__ import annotations

import math
from typing import Any

from ortools.sat.python import cp_model

from pipette_cp.solvers import work_meter as work
from pipette_cp.solvers.placement.backend import CUT_GRID, MasterResult, Terms
from pipette_cp.solvers.work_meter import limit

#: One integer time unit of the CP-SAT model, s.
TIME_QUANTUM_S = 1e-9
#: Cut rows are multiplied by this; cut gradients are multiples of its inverse.
CUT_SCALE = CUT_GRID

_STATUS = {
    cp_model.OPTIMAL: "optimal",
    cp_model.FEASIBLE: "feasible",
    cp_model.INFEASIBLE: "infeasible",
    cp_model.UNKNOWN: "unknown",
    cp_model.MODEL_INVALID: "invalid",
}


def to_quanta(seconds: float, up: bool = False) -> int:
    """``seconds`` as an integer count of quanta, rounded down (or up).

    >>> to_quanta(2.5e-9), to_quanta(2.5e-9, up=True)
    (2, 3)
    """
    q = seconds / TIME_QUANTUM_S
    return math.ceil(q - 1e-9) if up else math.floor(q + 1e-9)


class _Recorder(cp_model.CpSolverSolutionCallback):
    """Records the watched variables at every solution (at most ``keep``, newest kept)."""

    def __init__(self, variables: list[Any], keep: int = 16) -> None:
        super().__init__()
        self.variables, self.keep = variables, keep
        self.values: list[tuple[int, ...]] = []

    def on_solution_callback(self) -> None:
        self.values.append(tuple(int(self.value(v)) for v in self.variables))
        del self.values[: -self.keep]


class CpSatBackend:
    """:class:`~pipette_cp.solvers.placement.model.Backend` over ``cp_model.CpModel``."""

    name = "cpsat"

    def __init__(self) -> None:
        self.model = cp_model.CpModel()
        self.solver: cp_model.CpSolver | None = None
        self.watched: list[Any] = []

    def watch(self, variables: list[Any]) -> None:
        self.watched = list(variables)

    def new_bool(self, name: str) -> Any:
        return self.model.new_bool_var(name)

    def new_time(self, name: str, lb_s: float, ub_s: float) -> Any:
        lo = max(to_quanta(lb_s), 0)
        return self.model.new_int_var(lo, max(to_quanta(ub_s, up=True), lo), name)

    def add_linear(self, terms: Terms, sense: str, rhs: int, name: str) -> None:
        del name
        expr = cp_model.LinearExpr.weighted_sum([x for _, x in terms], [int(c) for c, _ in terms])
        if sense == "==":
            self.model.add(expr == rhs)
        elif sense == "<=":
            self.model.add(expr <= rhs)
        else:
            self.model.add(expr >= rhs)

    def add_time_bound(
        self, var: Any, terms: Terms, const_s: float, enforce: Any | None, name: str
    ) -> None:
        del name
        coefs = [to_quanta(c) for c, _ in terms]
        kept = [(c, x) for c, (_, x) in zip(coefs, terms, strict=True) if c]
        expr = cp_model.LinearExpr.weighted_sum([x for _, x in kept], [c for c, _ in kept])
        ct = self.model.add(var >= expr + to_quanta(const_s))
        if enforce is not None:
            ct.only_enforce_if(enforce)

    def add_cut(
        self, t: Any, intercept_s: float, time_terms: Terms, bool_terms: Terms, name: str
    ) -> None:
        del name
        variables = [x for _, x in time_terms] + [x for _, x in bool_terms]
        coefs = [round(g * CUT_SCALE) for g, _ in time_terms]
        coefs += [to_quanta(g * CUT_SCALE) for g, _ in bool_terms]
        rhs = math.floor(intercept_s * CUT_SCALE / TIME_QUANTUM_S)
        self.model.add(CUT_SCALE * t >= cp_model.LinearExpr.weighted_sum(variables, coefs) + rhs)

    def minimise(self, t: Any) -> None:
        self.model.minimize(t)

    def hint(self, values: dict[Any, int]) -> None:
        self.model.clear_hints()
        for var, value in values.items():
            self.model.add_hint(var, value)

    def solve(self, time_limit_s: float, workers: int, seed: int) -> MasterResult:
        solver = cp_model.CpSolver()
        solver.parameters.catch_sigint_signal = False  # Ctrl-C stops the search, not one solve
        limit(solver, max(time_limit_s, 0.01), max(workers, 1), seed)
        recorder = _Recorder(self.watched)
        status = _STATUS.get(solver.solve(self.model, recorder), "unknown")
        work.spend_cpsat(solver.deterministic_time)
        self.solver = solver
        found = status in ("optimal", "feasible")
        return MasterResult(
            status=status,
            objective_s=solver.objective_value * TIME_QUANTUM_S if found else None,
            bound_s=solver.best_objective_bound * TIME_QUANTUM_S if found else None,
            wall_time_s=solver.deterministic_time if work.active() else solver.wall_time,
            solutions=tuple(recorder.values),
        )

    def value(self, var: Any) -> float:
        assert self.solver is not None, "solve first"
        return float(self.solver.value(var))

    def export(self, path: str) -> None:
        """Write the model (``.pb.txt`` for text, else binary) for debugging."""
        self.model.export_to_file(path)
