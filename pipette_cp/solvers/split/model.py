"""The layer-split master problem, written once over a solver backend.

``min t`` over integer layer counts ``n_v >= 1`` per virtual stage, subject to the rows
of the master's families (:mod:`pipette_cp.solvers.split.families`:
``split_covers_layers``, ``split_contiguous``, ``memory_limit``, ``chunk_balance`` and
the user's) and the Kelley cuts ``iteration_time`` (``t >= a + g . n``) added by
:func:`~pipette_cp.solvers.split.solve.solve_split`.  The family names are those of
:mod:`pipette_cp.checker`.

:class:`SplitModel` states every family once; a :class:`SplitBackend`
(:class:`~pipette_cp.solvers.split.cpsat.CpSatSplitBackend`,
:class:`~pipette_cp.solvers.split.milp.MilpSplitBackend`) turns rows into its
solver's API and owns the one thing that differs: how time is represented
(CP-SAT: integer steps with cuts rounded to stay valid; MILP: continuous seconds).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from pipette_cp.solvers.cuts import Cut
from pipette_cp.solvers.extensions import LinearTerms
from pipette_cp.solvers.split.cost import MasterSolution, SplitCost
from pipette_cp.solvers.split.families import BUILTIN, SplitFamily


class SplitBackend(Protocol):
    """What a solver offers the split formulation (variables are opaque handles).

    Integer rows are ``sum coef * var (sense) rhs`` with ``sense`` in ``<=, >=, ==``;
    every time (cuts, the cut-off, the solution's ``t``) is in seconds here.
    """

    def new_int(self, name: str, lb: int, ub: int) -> Any: ...

    def new_time(self, name: str) -> Any: ...

    def add_linear(self, terms: LinearTerms, sense: str, rhs: int, name: str) -> None: ...

    def add_cut(self, t: Any, n: list[Any], cut: Cut, name: str) -> None: ...

    def add_cutoff(self, t: Any, best_s: float, name: str) -> None: ...

    def minimise(self, t: Any) -> None: ...

    def hint(self, n: list[Any], values: np.ndarray) -> None: ...

    def solve(self, time_limit_s: float, n: list[Any], t: Any) -> MasterSolution: ...

    def export(self, path: str | Path) -> None: ...


class SplitModel:
    """The cutting-plane split master of ``cost`` on ``backend`` with the rows of
    ``families`` (default: the built-in ones), in order (module docstring)."""

    def __init__(
        self, cost: SplitCost, backend: SplitBackend, families: Sequence[SplitFamily] = BUILTIN
    ) -> None:
        self.cost, self.backend, self.families = cost, backend, tuple(families)
        self.num_rows = 0
        self.build_variables()
        for family in self.families:
            family.add_rows(self)
        self.set_objective()

    # ------------------------------------------------------------------ model
    def build_variables(self) -> None:
        """``n_v`` in ``[1, L - (V - 1)]`` per virtual stage and the iteration time ``t``."""
        c = self.cost
        top = c.num_layers - c.num_chunks + 1
        self.n = [self.backend.new_int(f"layers_{v}", 1, top) for v in range(c.num_chunks)]
        self.t = self.backend.new_time("iteration_time")

    def add_row(self, terms: LinearTerms, sense: str, rhs: int, name: str) -> None:
        """A family's row ``sum coef * n (sense) rhs``, named ``name``."""
        self.backend.add_linear(terms, sense, rhs, name)

    def add_iteration_time(self, cut: Cut) -> None:
        """Kelley cut ``t >= a + g . n`` (the backend keeps it valid in its own units)."""
        self.backend.add_cut(self.t, self.n, cut, f"iteration_time_{self.num_rows}")
        self.num_rows += 1

    def add_linear(self, terms: LinearTerms, sense: str, rhs: int, name: str) -> None:
        """A user row ``sum coef * n (sense) rhs`` (:mod:`pipette_cp.solvers.extensions`)."""
        self.backend.add_linear(terms, sense, rhs, f"{name}_{self.num_rows}")
        self.num_rows += 1

    def add_objective_cutoff(self, best_s: float) -> None:
        """``t <= best_s`` (plus a hair): splits worse than the incumbent need no search."""
        self.backend.add_cutoff(self.t, best_s, f"objective_cutoff_{self.num_rows}")
        self.num_rows += 1

    def set_objective(self) -> None:
        """Minimise the iteration time ``t``."""
        self.backend.minimise(self.t)

    def add_hint(self, split: np.ndarray) -> None:
        """Start the next solve from ``split`` (replaces any previous hint)."""
        self.backend.hint(self.n, split)

    # ------------------------------------------------------------------ solve
    def solve(self, time_limit_s: float) -> MasterSolution:
        """Solve within ``time_limit_s``: status, split, its ``t`` and a proven bound."""
        return self.backend.solve(time_limit_s, self.n, self.t)

    def export(self, path: str | Path) -> None:
        """Write the model for debugging (CP-SAT proto or LP file)."""
        self.backend.export(path)
