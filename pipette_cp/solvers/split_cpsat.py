"""The layer-split master problem in CP-SAT (OR-Tools).

``min t`` over integer layer counts ``n_v >= 1`` per virtual stage, subject to
``split_covers_layers`` (``sum n = L``), ``memory_limit`` (the integer facets of
every chunk's memory row, :meth:`~pipette_cp.solvers.split_cost.MemoryModel.facets`),
``chunk_balance`` (vpp > 1) and the Kelley cuts
``iteration_time`` (``t >= a + g . n``) added by :mod:`pipette_cp.solvers.split`.
Contiguity (``split_contiguous``) holds by construction: the variables are counts
in virtual-stage order.  Same family names as :mod:`pipette_cp.solvers.split_milp`
and :mod:`pipette_cp.checker`.

Integer scaling (the only place): time is counted in steps of
``reference_s / TIME_STEPS`` (``reference_s`` = the hint's iteration time), so
1e-9 relative resolution; a cut's coefficients are rounded to steps and its
intercept lowered by the largest rounding gain over any split (``L`` x the
largest upward rounding of a coefficient), so a rounded cut never exceeds the
real one and the master stays a valid lower bound.  Memory rows are small-integer
facets (:meth:`MemoryModel.facets`).
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
from ortools.sat.python import cp_model

from pipette_cp.solvers.cuts import Cut
from pipette_cp.solvers.split_cost import MasterSolution, SplitCost

#: Time steps per reference iteration time: CP-SAT's time resolution is 1e-9 relative.
TIME_STEPS = 10**9


class CpSatSplitMaster:
    """CP-SAT master of the cutting-plane split model (see the module docstring).

    Parameters
    ----------
    cost
        The split-dependent costs of the plan.
    reference_s
        An iteration time of the right magnitude (the hint's): fixes the time step.
    workers, seed
        CP-SAT ``num_workers`` and ``random_seed``.
    """

    def __init__(self, cost: SplitCost, reference_s: float, *, workers: int = 1, seed: int = 0):
        self.cost, self.workers, self.seed = cost, workers, seed
        self.step_s = max(reference_s, 1e-12) / TIME_STEPS
        self.model = cp_model.CpModel()
        self.num_cuts = 0
        self.build_variables()
        self.add_split_covers_layers()
        self.add_memory_limit()
        self.add_chunk_balance()
        self.set_objective()

    # ------------------------------------------------------------------ model
    def build_variables(self) -> None:
        """``n_v`` in ``[1, L - (V - 1)]`` per virtual stage and ``t >= 0`` in time steps."""
        c = self.cost
        top = c.num_layers - c.num_chunks + 1
        self.n = [self.model.new_int_var(1, top, f"layers_{v}") for v in range(c.num_chunks)]
        # t is bounded by 1000 x the reference: far above any split a search would keep
        self.t = self.model.new_int_var(0, 1000 * TIME_STEPS, "iteration_time")

    def add_split_covers_layers(self) -> None:
        """Every layer in exactly one chunk: ``sum_v n_v = L``."""
        self.model.add(sum(self.n) == self.cost.num_layers).with_name("split_covers_layers")

    def add_memory_limit(self) -> None:
        """Per stage ``s``: ``k_s <= K_s`` and, for each chunk ``c``, the integer facets
        ``a k_s + b n_{c,s} <= r`` of ``W_s k_s + X_s n_{c,s} <= R_s`` (bytes)
        (:meth:`~pipette_cp.solvers.split_cost.MemoryModel.facets`: the same integer points)."""
        c = self.cost
        for s in range(c.pp):
            chunks = [self.n[k * c.pp + s] for k in range(c.vpp)]
            total = sum(chunks)
            top, rows = c.memory_facets(s)
            self.model.add(total <= top).with_name(f"memory_limit_{s}")
            for k, chunk in enumerate(chunks):
                for i, (a, b, r) in enumerate(rows):
                    self.model.add(a * total + b * chunk <= r).with_name(
                        f"memory_limit_{s}_{k}_{i}"
                    )

    def add_chunk_balance(self) -> None:
        """With ``vpp > 1``: the chunks of a stage differ by at most ``cost.chunk_spread``."""
        c, spread = self.cost, self.cost.chunk_spread
        if spread is None or c.vpp == 1:
            return
        for s in range(c.pp):
            for a, b in itertools.permutations(range(c.vpp), 2):
                diff = self.n[a * c.pp + s] - self.n[b * c.pp + s]
                self.model.add(diff <= spread).with_name(f"chunk_balance_{s}_{a}_{b}")

    def add_iteration_time(self, cut: Cut) -> None:
        """Kelley cut ``t >= a + g . n`` in time steps, rounded to stay valid."""
        coef = np.rint(cut.gradient / self.step_s)
        gain = max(float((coef - cut.gradient / self.step_s).max()), 0.0)
        intercept = math.floor(cut.intercept / self.step_s - gain * self.cost.num_layers) - 1
        expr = sum(int(g) * n for g, n in zip(coef, self.n, strict=True) if g) + intercept
        self.model.add(self.t >= expr).with_name(f"iteration_time_{self.num_cuts}")
        self.num_cuts += 1

    def add_linear(self, terms: list[tuple[int, Any]], sense: str, rhs: int, name: str) -> None:
        """A user row ``sum coef * n (sense) rhs`` (:mod:`pipette_cp.solvers.extensions`)."""
        expr = sum(c * x for c, x in terms)
        row = {"<=": expr <= rhs, ">=": expr >= rhs, "==": expr == rhs}[sense]
        self.model.add(row).with_name(f"{name}_{self.num_cuts}")
        self.num_cuts += 1

    def add_objective_cutoff(self, best_s: float) -> None:
        """``t <= best_s`` (rounded up): splits worse than the incumbent need no search."""
        self.model.add(self.t <= math.ceil(best_s / self.step_s) + 1).with_name(
            f"objective_cutoff_{self.num_cuts}"
        )

    def set_objective(self) -> None:
        """Minimise the iteration time ``t``."""
        self.model.minimize(self.t)

    def add_hint(self, split: np.ndarray) -> None:
        """Start the search from ``split`` (replaces any previous hint)."""
        self.model.clear_hints()
        for var, value in zip(self.n, split, strict=True):
            self.model.add_hint(var, int(value))

    # ------------------------------------------------------------------ solve
    def solve(self, time_limit_s: float) -> MasterSolution:
        """Solve the master within ``time_limit_s``; see :class:`MasterSolution`."""
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(time_limit_s, 1e-3)
        solver.parameters.num_workers = self.workers
        solver.parameters.random_seed = self.seed
        status = solver.solve(self.model)
        if status == cp_model.INFEASIBLE:
            return MasterSolution("infeasible", None, math.inf, math.inf)
        bound = solver.best_objective_bound * self.step_s
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return MasterSolution("unknown", None, math.inf, bound)
        return self.extract(solver, "optimal" if status == cp_model.OPTIMAL else "feasible", bound)

    def extract(self, solver: cp_model.CpSolver, status: str, bound_s: float) -> MasterSolution:
        """The solver's split and ``t``."""
        split = np.array([solver.value(n) for n in self.n], dtype=np.int64)
        return MasterSolution(status, split, solver.value(self.t) * self.step_s, bound_s)

    def export(self, path: str | Path) -> None:
        """Write the model for debugging (``.pb.txt`` text, otherwise binary proto)."""
        self.model.export_to_file(str(path))
