"""MILP backend of the layer-split master (PuLP on the engine of ``milp_solver``).

No time scaling is needed: ``t`` is continuous and the cut coefficients are
kept as floats (their intercepts already carry the
:func:`~pipette_cp.solvers.cuts.supporting_cut` slack).  The engine is
:func:`~pipette_cp.solvers.milp_engine.solve_milp`'s (HiGHS by default, in process;
CBC a subprocess per solve, ~20 ms each); the bound of a master stopped by its time
limit is the engine's best bound, and :func:`~pipette_cp.solvers.split.solve.solve_split`
keeps the largest one seen.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pulp

from pipette_cp.solvers.cuts import Cut
from pipette_cp.solvers.extensions import LinearTerms
from pipette_cp.solvers.milp_engine import (
    DEFAULT_ENGINE,
    MIN_START_S,
    pulp_solver_name,
    solve_milp,
)
from pipette_cp.solvers.split.cost import MasterSolution

_SENSES = {"==": pulp.LpConstraintEQ, "<=": pulp.LpConstraintLE, ">=": pulp.LpConstraintGE}


class MilpSplitBackend:
    """:class:`~pipette_cp.solvers.split.model.SplitBackend` over a ``pulp.LpProblem``.

    ``workers``: solver threads; ``engine``: the ``milp_solver``
    (:data:`~pipette_cp.solvers.milp_engine.ENGINES`); ``seed``: the engine's seed.
    """

    name = "milp"

    def __init__(self, *, workers: int = 1, engine: str = DEFAULT_ENGINE, seed: int = 0) -> None:
        self.workers, self.engine, self.seed = workers, engine, seed
        self.solver_name = pulp_solver_name(engine)  # a SpecError when it cannot run
        self.start: dict[Any, float] = {}
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
        """Warm start of the next solve (replaces any previous one)."""
        self.start = {var: int(value) for var, value in zip(n, values, strict=True)}

    def solve(self, time_limit_s: float, n: list[Any], t: Any) -> MasterSolution:
        """Below the engine's :data:`~pipette_cp.solvers.milp_engine.MIN_START_S` it is
        not started (it needs that long to answer).  The split is rounded to integers
        and its ``t`` recomputed as the largest cut there: CBC prints ``t`` with 8
        significant digits only.  The bound is the engine's (``-inf`` without one)."""
        del t
        if time_limit_s < MIN_START_S[self.engine]:
            return MasterSolution("unknown", None, math.inf, -math.inf)
        res = solve_milp(self.problem, self.engine, time_limit_s=time_limit_s,
                         threads=self.workers, seed=self.seed, start=self.start,
                         solver_name=self.solver_name)  # fmt: skip
        if res.status == "infeasible":
            return MasterSolution("infeasible", None, math.inf, math.inf)
        bound = -math.inf if res.bound is None else res.bound
        if res.status == "unknown":
            return MasterSolution("unknown", None, math.inf, bound)
        split = np.array([round(x.value()) for x in n], dtype=np.int64)
        value = max((cut(split) for cut in self.cuts), default=0.0)
        return MasterSolution(res.status, split, value, min(bound, value))

    def export(self, path: str | Path) -> None:
        """Write the model as an LP file."""
        self.problem.writeLP(str(path))
