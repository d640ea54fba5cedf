"""CP-SAT backend of the layer-split master (:mod:`pipette_cp.solvers.split.model`).

Integer scaling (the only place): time is counted in steps of
``reference_s / TIME_STEPS`` (``reference_s`` = the hint's iteration time), so
1e-9 relative resolution; a cut's coefficients are rounded to steps and its
intercept lowered by the largest rounding gain over any split (``L`` x the
largest upward rounding of a coefficient), so a rounded cut never exceeds the
real one and the master stays a valid lower bound.  Memory rows arrive as
small-integer facets (:meth:`~pipette_cp.solvers.split.cost.MemoryModel.facets`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from ortools.sat.python import cp_model

from pipette_cp.solvers import work_meter as work
from pipette_cp.solvers.cuts import Cut
from pipette_cp.solvers.extensions import LinearTerms
from pipette_cp.solvers.split.cost import MasterSolution
from pipette_cp.solvers.work_meter import limit

#: Time steps per reference iteration time: CP-SAT's time resolution is 1e-9 relative.
TIME_STEPS = 10**9


class CpSatSplitBackend:
    """:class:`~pipette_cp.solvers.split.model.SplitBackend` over ``cp_model.CpModel``.

    Parameters
    ----------
    reference_s
        An iteration time of the right magnitude (the hint's): fixes the time step.
    num_layers
        ``L``: the largest sum of the layer counts (bounds a cut's rounding gain).
    workers, seed
        CP-SAT ``num_workers`` and ``random_seed``.
    """

    name = "cpsat"

    def __init__(self, reference_s: float, num_layers: int, *, workers: int = 1, seed: int = 0):
        self.step_s = max(reference_s, 1e-12) / TIME_STEPS
        self.num_layers, self.workers, self.seed = num_layers, workers, seed
        self.model = cp_model.CpModel()

    def new_int(self, name: str, lb: int, ub: int) -> Any:
        return self.model.new_int_var(lb, ub, name)

    def new_time(self, name: str) -> Any:
        # t is bounded by 1000 x the reference: far above any split a search would keep
        return self.model.new_int_var(0, 1000 * TIME_STEPS, name)

    def add_linear(self, terms: LinearTerms, sense: str, rhs: int, name: str) -> None:
        expr = sum(c * x for c, x in terms)
        row = {"<=": expr <= rhs, ">=": expr >= rhs, "==": expr == rhs}[sense]
        self.model.add(row).with_name(name)

    def add_cut(self, t: Any, n: list[Any], cut: Cut, name: str) -> None:
        """``t >= a + g . n`` in time steps, rounded to stay valid."""
        coef = np.rint(cut.gradient / self.step_s)
        gain = max(float((coef - cut.gradient / self.step_s).max()), 0.0)
        intercept = math.floor(cut.intercept / self.step_s - gain * self.num_layers) - 1
        expr = sum(int(g) * x for g, x in zip(coef, n, strict=True) if g) + intercept
        self.model.add(t >= expr).with_name(name)

    def add_cutoff(self, t: Any, best_s: float, name: str) -> None:
        """``t <= best_s``, rounded up (one step of slack)."""
        self.model.add(t <= math.ceil(best_s / self.step_s) + 1).with_name(name)

    def minimise(self, t: Any) -> None:
        self.model.minimize(t)

    def hint(self, n: list[Any], values: np.ndarray) -> None:
        self.model.clear_hints()
        for var, value in zip(n, values, strict=True):
            self.model.add_hint(var, int(value))

    def solve(self, time_limit_s: float, n: list[Any], t: Any) -> MasterSolution:
        solver = cp_model.CpSolver()
        solver.parameters.catch_sigint_signal = False  # Ctrl-C stops the search, not one solve
        limit(solver, max(time_limit_s, 1e-3), self.workers, self.seed)
        status = solver.solve(self.model)
        work.spend_cpsat(solver.deterministic_time)
        if status == cp_model.INFEASIBLE:
            return MasterSolution("infeasible", None, math.inf, math.inf)
        bound = solver.best_objective_bound * self.step_s
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return MasterSolution("unknown", None, math.inf, bound)
        split = np.array([solver.value(x) for x in n], dtype=np.int64)
        label = "optimal" if status == cp_model.OPTIMAL else "feasible"
        return MasterSolution(label, split, solver.value(t) * self.step_s, bound)

    def export(self, path: str | Path) -> None:
        """Write the model (``.pb.txt`` text, otherwise binary proto)."""
        self.model.export_to_file(str(path))
