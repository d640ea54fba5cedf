"""MILP backend of the layer-split master (PuLP; HiGHS when available, else CBC).

No time scaling is needed: ``t`` is continuous and the cut coefficients are
kept as floats (their intercepts already carry the
:func:`~pipette_cp.solvers.cuts.supporting_cut` slack).  PuLP's bundled CBC is a
subprocess per solve (~20 ms each); it reports no best bound when it stops on
time, so a timed-out master's bound is the last proven one
(:func:`~pipette_cp.solvers.split.solve.solve_split` keeps it).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pulp

from pipette_cp.solvers.cuts import Cut
from pipette_cp.solvers.extensions import LinearTerms
from pipette_cp.solvers.milp_engine import MIN_CBC_S, milp_solver
from pipette_cp.solvers.split.cost import MasterSolution

_SENSES = {"==": pulp.LpConstraintEQ, "<=": pulp.LpConstraintLE, ">=": pulp.LpConstraintGE}


class MilpSplitBackend:
    """:class:`~pipette_cp.solvers.split.model.SplitBackend` over a ``pulp.LpProblem``.

    ``workers``: solver threads (CBC and HiGHS are deterministic here: no seed).
    """

    name = "milp"

    def __init__(self, *, workers: int = 1) -> None:
        self.workers, self.hinted = workers, False
        self.cuts: list[Cut] = []
        self.problem = pulp.LpProblem("layer_split", pulp.LpMinimize)

    def new_int(self, name: str, lb: int, ub: int) -> Any:
        return self.problem.add_variable(name, lb, ub, cat="Integer")

    def new_time(self, name: str) -> Any:
        return self.problem.add_variable(name, 0, None)

    def add_linear(self, terms: LinearTerms, sense: str, rhs: int, name: str) -> None:
        expr = pulp.LpAffineExpression([(x, c) for c, x in terms])
        self.problem += pulp.LpConstraint(expr, _SENSES[sense], name, rhs)

    def add_cut(self, t: Any, n: list[Any], cut: Cut, name: str) -> None:
        """``t >= a + g . n`` in seconds."""
        terms = [(x, float(g)) for x, g in zip(n, cut.gradient, strict=True) if g]
        expr = pulp.LpAffineExpression(terms, constant=float(cut.intercept))
        self.problem += t >= expr, name
        self.cuts.append(cut)

    def add_cutoff(self, t: Any, best_s: float, name: str) -> None:
        self.problem += t <= best_s * (1 + 1e-9), name

    def minimise(self, t: Any) -> None:
        self.problem.setObjective(pulp.LpAffineExpression([(t, 1.0)]))

    def hint(self, n: list[Any], values: np.ndarray) -> None:
        """Warm start (CBC reads it as a MIP start)."""
        for var, value in zip(n, values, strict=True):
            var.setInitialValue(int(value))
        self.hinted = True

    def solve(self, time_limit_s: float, n: list[Any], t: Any) -> MasterSolution:
        """Below :data:`MIN_CBC_S` CBC is not started (it needs that long to answer).
        The split is rounded to integers and its ``t`` recomputed as the largest cut
        there: CBC prints ``t`` with 8 significant digits only."""
        del t
        if time_limit_s < MIN_CBC_S:
            return MasterSolution("unknown", None, math.inf, -math.inf)
        self.problem.solve(milp_solver(time_limit_s, self.workers, warm_start=self.hinted))
        sol = self.problem.sol_status
        if sol == pulp.LpSolutionInfeasible or self.problem.status == pulp.LpStatusInfeasible:
            return MasterSolution("infeasible", None, math.inf, math.inf)
        if sol not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
            return MasterSolution("unknown", None, math.inf, -math.inf)
        status = "optimal" if sol == pulp.LpSolutionOptimal else "feasible"
        split = np.array([round(x.value()) for x in n], dtype=np.int64)
        value = max((cut(split) for cut in self.cuts), default=0.0)
        return MasterSolution(status, split, value, value if status == "optimal" else -math.inf)

    def export(self, path: str | Path) -> None:
        """Write the model as an LP file."""
        self.problem.writeLP(str(path))
