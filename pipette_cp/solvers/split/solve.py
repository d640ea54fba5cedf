"""The exact layer split: Kelley's cutting planes over a CP-SAT or MILP master.

Problem (docs/design.md, section 4, "Layer split"): choose ``n_v >= 1`` layers for
every virtual stage ``v = chunk * pp + stage`` (contiguous blocks in that
order, :class:`~pipette_cp.specs.Plan`), ``sum n = L``, every stage within its
usable memory given its in-flight micro-batches, minimising the analytic
iteration time ``T(n)`` of :mod:`pipette_cp.cost.schedule.critical_path` with the plan's
placement-dependent hop, DP, embedding and optimizer times
(:mod:`pipette_cp.solvers.split.cost`).

Method.  ``T`` is a convex piecewise-linear function of the per-stage times
(maxima and non-negative sums of affine terms; :mod:`pipette_cp.solvers.cuts`),
and those are affine in ``n``, so Kelley's cutting-plane method (Kelley 1960)
minimises it exactly over the integer splits: the master ``min t`` s.t. the
cuts so far, ``split_covers_layers``, ``memory_limit`` and (vpp > 1)
``chunk_balance`` (:data:`CHUNK_SPREAD`) is solved, ``T`` is
evaluated at its split, and the supporting cut there is added, until
``T(best) - t <= tolerance x T(best)``.  The master's optimum is a proven lower
bound (reported as ``bound``).  A greedy local search from the even split
supplies the hint and the first cuts, so the result is never worse than the
even split.  Where layers cost unequally (a hybrid model's sublayers, dense layers
among MoE ones) the affine forms are an approximation: the master's split is then
polished by moving single layers under the evaluator and the memory check itself
(:func:`~pipette_cp.solvers.split.heuristics.polish_unequal_layers`) and reported
``feasible`` without a bound.  When the DP sync table is not convex (the faster of ring and
two-level all-reduce changes with the stage's size), the cuts use its convex
envelope: the bound stays valid, optimality may then go unproven (status
``feasible`` with the gap).

Two devices make it fast.  At a balanced split many pieces of ``T`` tie (every
stage one layer short of being the bottleneck), and plain Kelley would find
them one master solve at a time: the cuts at every one-layer neighbour of each
new incumbent are added at once (:meth:`SplitCost.cuts_around`), after which
128 layers x 32 stages close in one master solve.  The memory rows are given to
the solvers as small-integer facets of the same integer set (1e10-byte
coefficients next to 1e-3 s cut coefficients made CBC's cut generators cut off
the optimum).  Cuts come from finite differences and are valid up to rounding,
about 1e-9 relative per layer of distance, far below :data:`TOLERANCE`.

Ties between optimal splits are broken towards what Megatron's plain flags
express (:func:`~pipette_cp.solvers.split.heuristics.prefer_simple`);
:func:`~pipette_cp.solvers.split.flags.megatron_split_args` gives the flags.  The
oracle :func:`~pipette_cp.solvers.split.oracle.brute_force_split` enumerates
every split of tiny instances through
:class:`~pipette_cp.cost.evaluator.evaluate.Evaluator` and the checker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np

from pipette_cp.errors import InfeasibleError, SolverError, SpecError
from pipette_cp.solvers import work_meter as work
from pipette_cp.solvers.options import SPLIT_WORK_SHARE, SolveOptions
from pipette_cp.solvers.split.cost import SplitCost, split_cost
from pipette_cp.solvers.split.cpsat import CpSatSplitBackend
from pipette_cp.solvers.split.families import UserSplitFamily, split_families
from pipette_cp.solvers.split.heuristics import (
    feasible_start,
    local_search,
    polish_unequal_layers,
    prefer_simple,
)
from pipette_cp.solvers.split.milp import MilpSplitBackend
from pipette_cp.solvers.split.model import SplitBackend, SplitModel
from pipette_cp.specs import Instance, Plan, SolveInfo

Backend = Literal["cpsat", "milp"]

#: The split backends by name.
BACKENDS = ("cpsat", "milp")
#: Kelley stops when the best time is within this fraction of the proven bound.
TOLERANCE = 1e-6
#: Share of the time limit the greedy warm start may use.
HEURISTIC_SHARE = 0.25
#: With vpp > 1, the largest difference between two chunks of one stage (``chunk_balance``).
#: The analytic interleaved model is a lower bound that grows loose as the chunks of a
#: stage diverge (:mod:`pipette_cp.cost.schedule.critical_path`: up to 15 % low); an unconstrained
#: optimum exploits that: 128 layers, pp=16 x vpp=2 gave 30.36 s analytic but 39.6 s in
#: the simulator, against 30.47 / 30.48 s for the even split.  Spread 1 keeps Megatron's
#: near-even chunks; ``None`` lifts the constraint.
CHUNK_SPREAD = 1


@dataclass(frozen=True)
class SplitResult:
    """A solved layer split and the solver's report (times in seconds).

    ``status``: ``optimal`` (gap within :data:`TOLERANCE`) or ``feasible`` (time
    ran out, or the bound could not be closed: see ``gap``).  ``bound_s`` is a
    proven lower bound of the best split's time, ``None`` when no master solve
    finished; ``start_s`` the time of the even (or first memory-feasible) split.
    """

    split: tuple[int, ...]
    status: str
    objective_s: float
    bound_s: float | None
    gap: float | None
    wall_time_s: float
    iterations: int
    backend: str
    start_s: float
    convex: bool

    def solve_info(self) -> SolveInfo:
        """The report as a :class:`~pipette_cp.specs.SolveInfo`."""
        return SolveInfo(
            method=f"split-{self.backend}",
            status=self.status,
            objective=self.objective_s,
            bound=self.bound_s,
            gap=self.gap,
            wall_time_s=self.wall_time_s,
        )


def solve_split(
    instance: Instance,
    plan: Plan,
    options: SolveOptions | None = None,
    backend: Backend = "cpsat",
    *,
    tolerance: float = TOLERANCE,
    chunk_spread: int | None = CHUNK_SPREAD,
    cost: SplitCost | None = None,
    export_path: str | Path | None = None,
) -> SplitResult:
    """The fastest memory-feasible layer split of ``plan`` (its other fields fixed).

    Parameters
    ----------
    instance, plan
        The job and the layout whose ``layer_split`` is chosen (its value is ignored).
    options
        Time limit (the whole call, set-up included), seed, master workers.
    backend
        ``"cpsat"`` (OR-Tools CP-SAT) or ``"milp"`` (PuLP, on ``options.milp_solver``).
    tolerance
        Relative optimality tolerance of the cutting-plane loop.
    chunk_spread
        With ``vpp > 1``, the largest difference between two chunks of one stage
        (:data:`CHUNK_SPREAD`; ``None``: unconstrained).
    cost
        Pre-built :func:`~pipette_cp.solvers.split.cost.split_cost` of ``plan``.
    export_path
        Write the final master model there (CP-SAT proto or LP file).

    Raises
    ------
    InfeasibleError
        No split fits in memory; the message names the stage and the numbers.
    LayoutError
        Fewer layers than model chunks.
    """
    options = options or SolveOptions()
    if backend not in BACKENDS:
        raise SpecError("backend", backend, f"unknown split backend; known: {', '.join(BACKENDS)}")
    if options.deterministic:  # the part's work budget, whatever the caller's clock said
        options = replace(options, time_limit_s=options.work_limit_s(SPLIT_WORK_SHARE), work_s=None)
    with work.deterministic(options.deterministic and not work.active()):  # metered here
        return _split(instance, plan, options, backend, tolerance, chunk_spread, cost, export_path)


def _split(instance: Instance, plan: Plan, options: SolveOptions, backend: Backend,
           tolerance: float, chunk_spread: int | None, cost: SplitCost | None,
           export_path: str | Path | None) -> SplitResult:  # fmt: skip
    """:func:`solve_split` within ``options.time_limit_s`` (under the work meter of
    :mod:`~pipette_cp.solvers.work_meter`: reference s of work; the heuristics there, which read
    the wall clock, run to their end and are charged by the cuts they take)."""
    started = work.now()
    metered = work.active()
    deadline = started + options.time_limit_s
    cost = replace(cost or split_cost(instance, plan), chunk_spread=chunk_spread)
    cost.require_feasible()
    rng = np.random.default_rng(options.seed)
    start = feasible_start(cost)
    greedy_until = started + HEURISTIC_SHARE * options.time_limit_s
    trail = local_search(cost, start, rng, deadline_s=math.inf if metered else greedy_until)
    work.spend(work.CUT_TICKS * len(trail.cuts))
    best, best_s = trail.split, trail.time_s
    users = options.constraints
    families = split_families(instance, plan, users)
    bound, iterations, status = -math.inf, 0, "feasible"
    if cost.num_chunks == 1:
        bound, status = best_s, "optimal"
    master = SplitModel(cost, _backend(backend, cost, best_s, options), families)
    # the heuristics know only the built-in families
    if users and not all(f.admits(cost, best) for f in families):
        best_s, bound, status = math.inf, -math.inf, "feasible"
    for cut in trail.cuts:
        master.add_iteration_time(cut)
    surrounded = False
    while status != "optimal" and deadline > work.now() and not work.exhausted():
        if not surrounded and math.isfinite(best_s):  # once per incumbent
            around = cost.cuts_around(best, rng, math.inf if metered else deadline)
            work.spend(work.CUT_TICKS * len(around))
            for cut in around:
                master.add_iteration_time(cut)
            master.add_objective_cutoff(best_s)
            surrounded = True
        if math.isfinite(best_s):
            master.add_hint(best)
        sol = master.solve(max(deadline - work.now(), 0.0))
        iterations += 1
        bound = max(bound, sol.bound_s)
        if sol.status == "infeasible":
            if not math.isfinite(best_s):
                raise InfeasibleError("no layer split satisfies the user constraint families")
            raise SolverError(f"split master infeasible although {best.tolist()} fits")
        if sol.split is None:
            break
        value = cost.iteration_time_s(sol.split)
        if value < best_s:
            best, best_s, surrounded = sol.split, value, False
        if best_s - bound <= tolerance * best_s:
            status = "optimal"
        elif sol.status != "optimal":
            break  # the master ran out of time
        else:
            cut = cost.cut(sol.split, rng)
            work.spend(work.CUT_TICKS)
            if cut(sol.split) <= sol.objective_s + 0.5 * tolerance * value:
                break  # cannot separate (non-convex DP table): report the gap
            master.add_iteration_time(cut)
    if export_path is not None:
        master.export(export_path)
    if not math.isfinite(best_s):
        raise InfeasibleError("no layer split satisfying the user families found in the time limit")
    if not users:
        best, best_s = prefer_simple(cost, best, best_s)
    if not cost.exact:  # the affine forms approximate unequal layers: no bound, no claim
        user = [f for f in families if isinstance(f, UserSplitFamily)]
        best, best_s = polish_unequal_layers(
            instance, plan, cost, (np.asarray(best), start),
            admits=lambda split: all(f.admits(cost, split) for f in user),
        )  # fmt: skip
        bound, status = -math.inf, "feasible"
    proven = bound if math.isfinite(bound) else None
    return SplitResult(
        split=tuple(int(n) for n in best),
        status=status,
        objective_s=best_s,
        bound_s=proven,
        gap=None if proven is None else max(0.0, (best_s - proven) / best_s),
        wall_time_s=work.now() - started,
        iterations=iterations,
        backend=backend,
        start_s=cost.iteration_time_s(start),
        convex=cost.convex,
    )


def _backend(name: str, cost: SplitCost, reference_s: float, options: SolveOptions) -> SplitBackend:
    if name == "cpsat":
        return CpSatSplitBackend(
            reference_s, cost.num_layers, workers=options.workers, seed=options.seed
        )
    return MilpSplitBackend(workers=options.workers, engine=options.milp_solver, seed=options.seed)


def with_optimal_split(
    instance: Instance,
    plan: Plan,
    options: SolveOptions | None = None,
    backend: Backend = "cpsat",
    *,
    chunk_spread: int | None = CHUNK_SPREAD,
) -> Plan:
    """``plan`` with the split of :func:`solve_split` and its :class:`SolveInfo`
    (placement and knobs unchanged, any previous evaluation dropped)."""
    result = solve_split(instance, plan, options, backend, chunk_spread=chunk_spread)
    data = plan.model_dump()
    data.update(
        layer_split=result.split, evaluation=None, solve_info=result.solve_info().model_dump()
    )
    return Plan.model_validate(data)
