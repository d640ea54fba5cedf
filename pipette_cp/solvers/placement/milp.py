"""MILP backend of the placement master (PuLP; CBC, or HiGHS when installed).

The same formulation as CP-SAT (:mod:`pipette_cp.solvers.placement.model`);
continuous time variables in :data:`TIME_UNIT_S` (microseconds keep the
coefficients near 1 for the LP), enforcement by big-M with the tightest ``M``
the bounds allow: ``var >= const + sum c x`` if ``e`` becomes
``var >= const + sum c x - M (1 - e)`` with ``M = const + sum max(c, 0) - lb(var)``.
The bound of a solve stopped by the time limit is read from CBC's log
("Lower bound:"), as PuLP does not return it.
"""

from __future__ import annotations

import os
import re
import tempfile
from itertools import count
from typing import Any

import pulp

from pipette_cp.solvers.milp_engine import MIN_CBC_S
from pipette_cp.solvers.placement.backend import MasterResult, Terms

#: Time unit of the MILP model, s.
TIME_UNIT_S = 1e-6

_LOWER = re.compile(r"Lower bound:\s+([-+0-9.eE]+)")


def available_solver() -> str:
    """Name of the MILP solver PuLP will use: HiGHS if available, else CBC."""
    names = pulp.listSolvers(onlyAvailable=True)
    return "HiGHS" if "HiGHS" in names else "PULP_CBC_CMD"


class MilpBackend:
    """:class:`~pipette_cp.solvers.placement.model.Backend` over a ``pulp.LpProblem``."""

    name = "milp"

    def __init__(self) -> None:
        self.problem = pulp.LpProblem("placement", pulp.LpMinimize)
        self._ids = count()
        self._lb: dict[str, float] = {}
        self._hinted = False

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
        """CBC through PuLP reports only its final solution: nothing to watch."""
        del variables

    def hint(self, values: dict[Any, int]) -> None:
        for var, value in values.items():
            var.setInitialValue(value)
        self._hinted = bool(values)

    def solve(self, time_limit_s: float, workers: int, seed: int) -> MasterResult:
        if time_limit_s < MIN_CBC_S:  # CBC would not answer in time
            return MasterResult("unknown", None, None, 0.0)
        handle, log = tempfile.mkstemp(suffix=".log", prefix="pipette_cbc_")
        os.close(handle)
        try:
            solver = pulp.PULP_CBC_CMD(
                msg=False, timeLimit=max(time_limit_s, 0.1), threads=max(workers, 1),
                warmStart=self._hinted, logPath=log, options=[f"randomCbcSeed {seed + 1}"],
            )  # fmt: skip
            try:
                self.problem.solve(solver)
            except pulp.PulpSolverError:  # CBC died (killed, or no time to start)
                return MasterResult("unknown", None, None, 0.0)
            with open(log, encoding="utf-8", errors="replace") as f:
                text = f.read()
        finally:
            os.unlink(log)
        sol = self.problem.sol_status
        status = {1: "optimal", 2: "feasible", -1: "infeasible"}.get(sol, "unknown")
        if self.problem.status == -1 and sol != 2:
            status = "infeasible"
        wall = re.findall(r"Wallclock seconds\):\s+([0-9.]+)", text)
        objective = (
            pulp.value(self.problem.objective) if status in ("optimal", "feasible") else None
        )
        bound = objective if status == "optimal" else None
        if status == "feasible" and (m := _LOWER.findall(text)):
            bound = float(m[-1])
        return MasterResult(
            status=status,
            objective_s=None if objective is None else objective * TIME_UNIT_S,
            bound_s=None if bound is None else bound * TIME_UNIT_S,
            wall_time_s=float(wall[-1]) if wall else 0.0,
        )

    def value(self, var: Any) -> float:
        return float(var.value() or 0.0)

    def export(self, path: str) -> None:
        """Write the model in LP format for debugging (``writeLP``)."""
        self.problem.writeLP(path)
