"""The layer-split master problem as a MILP (PuLP; HiGHS when available, else CBC).

Same model and family names as :mod:`pipette_cp.solvers.split_cpsat`: integer
``n_v >= 1`` per virtual stage, continuous ``t`` in seconds,
``split_covers_layers``, ``memory_limit`` (integer facets,
:meth:`~pipette_cp.solvers.split_cost.MemoryModel.facets`), ``chunk_balance`` and the
Kelley cuts ``iteration_time``.  No time scaling is needed: ``t`` is continuous and the
cut coefficients are kept as floats (their intercepts already carry the
:func:`~pipette_cp.solvers.cuts.supporting_cut` slack).

PuLP's bundled CBC is a subprocess per solve (~20 ms each); it reports no best
bound when it stops on time, so a timed-out master's bound is the last proven
one (:mod:`pipette_cp.solvers.split` keeps it).
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
import pulp

from pipette_cp.solvers.cuts import Cut
from pipette_cp.solvers.split_cost import MasterSolution, SplitCost

#: Shortest time limit worth starting the MILP solver with (process start, MPS file,
#: presolve: given 0.4 s on an 80-unit LNS neighbourhood it took 1.06 s; benchmarks/time_limits.py).
MIN_CBC_S = 1.0


def milp_solver(
    time_limit_s: float, workers: int = 1, *, warm_start: bool = False, gap: float = 0.0
) -> pulp.LpSolver:
    """HiGHS (in-process) if PuLP finds it, else CBC (the system's, or PuLP's bundled one).

    ``warm_start`` passes the variables' initial values to CBC as a MIP start.
    """
    available = pulp.listSolvers(onlyAvailable=True)
    limit = max(time_limit_s, 0.01)
    if "HiGHS" in available:
        return pulp.HiGHS(msg=False, timeLimit=limit, threads=workers, gapRel=gap)
    if "HiGHS_CMD" in available:
        return pulp.HiGHS_CMD(msg=False, timeLimit=limit, threads=workers, gapRel=gap)
    # COIN_CMD with PuLP's bundled binary: PULP_CBC_CMD itself is deprecated in PuLP 3.3
    path = None if pulp.COIN_CMD().available() else pulp.PULP_CBC_CMD.pulp_cbc_path
    return pulp.COIN_CMD(
        msg=False, timeLimit=limit, threads=workers, gapRel=gap, path=path, warmStart=warm_start
    )


class MilpSplitMaster:
    """PuLP master of the cutting-plane split model (see the module docstring).

    Parameters
    ----------
    cost
        The split-dependent costs of the plan.
    workers
        Solver threads.
    """

    def __init__(
        self, cost: SplitCost, reference_s: float = 0.0, *, workers: int = 1, seed: int = 0
    ):
        del reference_s, seed  # no scaling needed; CBC and HiGHS are deterministic here
        self.cost, self.workers, self.hinted = cost, workers, False
        self.cuts: list[Cut] = []
        self.problem = pulp.LpProblem("layer_split", pulp.LpMinimize)
        self.num_cuts = 0
        self.build_variables()
        self.add_split_covers_layers()
        self.add_memory_limit()
        self.add_chunk_balance()
        self.set_objective()

    # ------------------------------------------------------------------ model
    def build_variables(self) -> None:
        """``n_v`` in ``[1, L - (V - 1)]`` per virtual stage, ``t >= 0`` seconds."""
        c = self.cost
        top = c.num_layers - c.num_chunks + 1
        add = self.problem.add_variable
        self.n = [add(f"layers_{v}", 1, top, cat="Integer") for v in range(c.num_chunks)]
        self.t = add("iteration_time", 0, None)

    def add_split_covers_layers(self) -> None:
        """Every layer in exactly one chunk: ``sum_v n_v = L``."""
        self.problem += pulp.lpSum(self.n) == self.cost.num_layers, "split_covers_layers"

    def add_memory_limit(self) -> None:
        """Per stage ``s``: ``k_s <= K_s`` and, for each chunk ``c``, the integer facets
        ``a k_s + b n_{c,s} <= r`` of ``W_s k_s + X_s n_{c,s} <= R_s`` (bytes)
        (:meth:`~pipette_cp.solvers.split_cost.MemoryModel.facets`: the same integer points)."""
        c = self.cost
        for s in range(c.pp):
            chunks = [self.n[k * c.pp + s] for k in range(c.vpp)]
            total = pulp.lpSum(chunks)
            top, rows = c.memory_facets(s)
            self.problem += total <= top, f"memory_limit_{s}"
            for k, chunk in enumerate(chunks):
                for i, (a, b, r) in enumerate(rows):
                    self.problem += a * total + b * chunk <= r, f"memory_limit_{s}_{k}_{i}"

    def add_chunk_balance(self) -> None:
        """With ``vpp > 1``: the chunks of a stage differ by at most ``cost.chunk_spread``."""
        c, spread = self.cost, self.cost.chunk_spread
        if spread is None or c.vpp == 1:
            return
        for s in range(c.pp):
            for a, b in itertools.permutations(range(c.vpp), 2):
                diff = self.n[a * c.pp + s] - self.n[b * c.pp + s]
                self.problem += diff <= spread, f"chunk_balance_{s}_{a}_{b}"

    def add_iteration_time(self, cut: Cut) -> None:
        """Kelley cut ``t >= a + g . n`` (seconds)."""
        terms = [(n, float(g)) for n, g in zip(self.n, cut.gradient, strict=True) if g]
        expr = pulp.LpAffineExpression(terms, constant=float(cut.intercept))
        self.problem += self.t >= expr, f"iteration_time_{self.num_cuts}"
        self.cuts.append(cut)
        self.num_cuts += 1

    def add_linear(self, terms: list[tuple[int, Any]], sense: str, rhs: int, name: str) -> None:
        """A user row ``sum coef * n (sense) rhs`` (:mod:`pipette_cp.solvers.extensions`)."""
        expr = pulp.LpAffineExpression([(x, c) for c, x in terms])
        op = {"==": pulp.LpConstraintEQ, "<=": pulp.LpConstraintLE, ">=": pulp.LpConstraintGE}
        self.problem += pulp.LpConstraint(expr, op[sense], f"{name}_{self.num_cuts}", rhs)
        self.num_cuts += 1

    def add_objective_cutoff(self, best_s: float) -> None:
        """``t <= best_s`` (plus a hair): splits worse than the incumbent need no search."""
        self.problem += self.t <= best_s * (1 + 1e-9), f"objective_cutoff_{self.num_cuts}"
        self.num_cuts += 1

    def set_objective(self) -> None:
        """Minimise the iteration time ``t``."""
        self.problem.setObjective(pulp.LpAffineExpression([(self.t, 1.0)]))

    def add_hint(self, split: np.ndarray) -> None:
        """Warm start from ``split`` (CBC reads it as a MIP start)."""
        for var, value in zip(self.n, split, strict=True):
            var.setInitialValue(int(value))
        self.hinted = True

    # ------------------------------------------------------------------ solve
    def solve(self, time_limit_s: float) -> MasterSolution:
        """Solve the master within ``time_limit_s``; see :class:`MasterSolution`.
        Below :data:`MIN_CBC_S` CBC is not started (it needs that long to answer)."""
        if time_limit_s < MIN_CBC_S:
            return MasterSolution("unknown", None, math.inf, -math.inf)
        solver = milp_solver(time_limit_s, self.workers, warm_start=self.hinted)
        self.problem.solve(solver)
        sol = self.problem.sol_status
        if sol == pulp.LpSolutionInfeasible or self.problem.status == pulp.LpStatusInfeasible:
            return MasterSolution("infeasible", None, math.inf, math.inf)
        if sol not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
            return MasterSolution("unknown", None, math.inf, -math.inf)
        return self.extract("optimal" if sol == pulp.LpSolutionOptimal else "feasible")

    def extract(self, status: str) -> MasterSolution:
        """The solver's split (rounded to integers) and ``t``, recomputed as the largest
        cut at that split: CBC prints ``t`` with 8 significant digits only."""
        split = np.array([round(n.value()) for n in self.n], dtype=np.int64)
        t = max((cut(split) for cut in self.cuts), default=0.0)
        return MasterSolution(status, split, t, t if status == "optimal" else -math.inf)

    def export(self, path: str | Path) -> None:
        """Write the model as an LP file for debugging."""
        self.problem.writeLP(str(path))
