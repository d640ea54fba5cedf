"""MILP backend of the placement master (PuLP on the engine of ``milp_solver``).

The same formulation as CP-SAT (:mod:`pipette_cp.solvers.placement.model`);
continuous time variables in :data:`TIME_UNIT_S` (microseconds keep the
coefficients near 1 for the LP), enforcement by big-M with the tightest ``M``
the bounds allow: ``var >= const + sum c x`` if ``e`` becomes
``var >= const + sum c x - M (1 - e)`` with ``M = const + sum max(c, 0) - lb(var)``.
Solves go through :func:`~pipette_cp.solvers.milp_engine.solve_milp` (HiGHS by
default); the bound of a solve stopped by the time limit is the engine's best bound
(HiGHS's ``mip_dual_bound``, the last "Lower bound:" of CBC's log).
"""

from __future__ import annotations

from itertools import count
from typing import Any

import pulp

from pipette_cp.solvers.milp_engine import (
    DEFAULT_ENGINE,
    MIN_START_S,
    pulp_solver_name,
    solve_milp,
)
from pipette_cp.solvers.placement.backend import MasterResult, Terms

#: Time unit of the MILP model, s.
TIME_UNIT_S = 1e-6


def available_solver(engine: str = DEFAULT_ENGINE) -> str:
    """Name of the PuLP solver that runs ``engine`` (a SpecError if none can)."""
    return pulp_solver_name(engine)


class MilpBackend:
    """:class:`~pipette_cp.solvers.placement.model.Backend` over a ``pulp.LpProblem``,
    solved by ``engine`` (a ``milp_solver`` name, :mod:`pipette_cp.solvers.milp_engine`)."""

    name = "milp"

    def __init__(self, engine: str = DEFAULT_ENGINE) -> None:
        self.problem = pulp.LpProblem("placement", pulp.LpMinimize)
        self._ids = count()
        self._lb: dict[str, float] = {}
        self.engine = engine
        self._solver = pulp_solver_name(engine)  # a SpecError when it cannot run
        self._start: dict[Any, int] = {}

    def _name(self, name: str) -> str:
        return f"{name}_{next(self._ids)}"

    def new_bool(self, name: str) -> Any:
        return self.problem.add_variable(self._name(name), 0, 1, cat="Binary")

    def new_time(self, name: str, lb_s: float, ub_s: float) -> Any:
        var = self.problem.add_variable(
            self._name(name), lb_s / TIME_UNIT_S, max(ub_s, lb_s) / TIME_UNIT_S
        )
        self._lb[var.name] = lb_s / TIME_UNIT_S
        return var

    def add_linear(self, terms: Terms, sense: str, rhs: int, name: str) -> None:
        expr = pulp.LpAffineExpression([(x, c) for c, x in terms])
        op = {"==": pulp.LpConstraintEQ, "<=": pulp.LpConstraintLE, ">=": pulp.LpConstraintGE}
        self.problem += pulp.LpConstraint(expr, op[sense], self._name(name), rhs)

    def add_time_bound(
        self, var: Any, terms: Terms, const_s: float, enforce: Any | None, name: str
    ) -> None:
        pairs = [(x, -c / TIME_UNIT_S) for c, x in terms if c]
        const = const_s / TIME_UNIT_S
        if enforce is not None:
            big = const + sum(max(-c, 0.0) for _, c in pairs) - self._lb.get(var.name, 0.0)
            if big <= 0:
                return  # already implied by the variable's lower bound
            pairs.append((enforce, -big))
            const -= big
        expr = pulp.LpAffineExpression([(var, 1.0), *pairs])
        self.problem += pulp.LpConstraint(expr, pulp.LpConstraintGE, self._name(name), const)

    def add_cut(
        self, t: Any, intercept_s: float, time_terms: Terms, bool_terms: Terms, name: str
    ) -> None:
        pairs = [(t, 1.0)] + [(x, -g) for g, x in time_terms]
        pairs += [(x, -g / TIME_UNIT_S) for g, x in bool_terms]
        expr = pulp.LpAffineExpression(pairs)
        self.problem += pulp.LpConstraint(
            expr, pulp.LpConstraintGE, self._name(name), intercept_s / TIME_UNIT_S
        )

    def minimise(self, t: Any) -> None:
        self.problem.setObjective(pulp.LpAffineExpression([(t, 1.0)]))

    def watch(self, variables: list[Any]) -> None:
        """The engines report only their final solution through PuLP: nothing to watch."""
        del variables

    def hint(self, values: dict[Any, int]) -> None:
        self._start = dict(values)

    def solve(self, time_limit_s: float, workers: int, seed: int) -> MasterResult:
        if time_limit_s < MIN_START_S[self.engine]:  # the engine would not answer in time
            return MasterResult("unknown", None, None, 0.0)
        res = solve_milp(self.problem, self.engine, time_limit_s=time_limit_s, threads=workers,
                         seed=seed, start=self._start, solver_name=self._solver)  # fmt: skip
        return MasterResult(
            status=res.status,
            objective_s=None if res.objective is None else res.objective * TIME_UNIT_S,
            bound_s=None if res.bound is None else res.bound * TIME_UNIT_S,
            wall_time_s=res.wall_time_s,
        )

    def value(self, var: Any) -> float:
        return float(var.value() or 0.0)

    def export(self, path: str) -> None:
        """Write the model in LP format for debugging (``writeLP``)."""
        self.problem.writeLP(path)
