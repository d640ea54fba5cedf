"""Exact placement of a fixed layout and layer split (:func:`solve_placement`).

Problem (docs/design.md, section 4, "Placement"): put every unit (the tp ranks of one
stage of one DP replica) on a slot, a tensor group of one node (of one NVLink
domain when tp exceeds a node; :func:`~pipette_cp.solvers.placement.build.tensor_slots`),
minimising the analytic iteration time of :class:`~pipette_cp.cost.evaluator.evaluate.Evaluator`
through its placement-dependent terms: every boundary's slowest activation and
gradient hop (with the weight the 1F1B / interleaved schedule gives it), every
stage's DP ring in replica order, NIC sharing among concurrent flows, the
tied-embedding pair and each stage's slowest TP block; never using a failed
link and keeping every stage on GPUs whose memory fits it.  Several stages may
share a node, a stage may span nodes.

Method.
1. Seeds from a :class:`Seeder` (the methods ``cpsat`` and ``milp``,
   :mod:`pipette_cp.solvers.methods`, hand in the greedy walk, Megatron's order and
   its node permutations, seeded random placements and Pipette's SA for large
   clusters), seeded random assignments, the best two polished by a
   critical-unit local search (:mod:`pipette_cp.solvers.placement.local_search`).
2. Bounds: per class (a boundary's hops, a stage's ring, the embedding pairs)
   the cheapest value any placement can reach, and the dearest value any
   placement as fast as the best seed can afford (reduced-cost fixing on the
   cuts); pairs beyond it are forbidden (:mod:`pipette_cp.solvers.placement.kelley`).
3. Kelley's cutting planes over one master model
   (:mod:`pipette_cp.solvers.placement.model`), solved by CP-SAT or a MILP,
   warm-started with the best placement so far; the cuts start at the seeds
   and at the lower bound, and are added at every solution the master returns
   until its bound meets the best placement (proven optimal).  Up to
   :data:`EXACT_SIZE` the whole master is solved, with DP-ring rotation (and,
   for symmetric links, reflection) symmetry broken; larger problems run LNS
   on the same master with most units fixed.
4. The result is re-scored by ``Evaluator(instance)`` next to every hint plan
   that passes the checker, and the best is returned: never worse than a hint.

Reported (:class:`~pipette_cp.specs.SolveInfo`): ``objective`` = that
Evaluator's iteration time; ``bound`` = the master's proven bound (or the
analytic one, for LNS) when the Evaluator's DP all-reduce is the ring in replica
order; when a node can hold two units of one stage, so that NCCL's two-level
all-reduce (not in the master) may win, the analytic floor of both algorithms
(:func:`~pipette_cp.solvers.placement.kelley.two_level_floor_x`): valid, looser.
Mixed GPU types (compute classes not a ladder) and HSDP give no bound: ``bound`` and
``gap`` are ``None`` and the status is at best ``feasible``.  So do slots that do not
match every grouping of a node's GPUs into tensor groups
(:func:`~pipette_cp.solvers.placement.build.tensor_slots`): where a node's links
differ (the cube mesh, a failed NVLink) the slots are one cut of each node into
groups, the best by ring bandwidth, and the master's proof covers that cut only,
not placements on other groups, which may pair the GPUs of consecutive stages
better.  Equal ring bandwidths of every cut would not make up for it (the links
between groups still differ); the claim stands only where a symmetry of the node
maps every cut onto the chosen one (:func:`~pipette_cp.cost.network.tp_rings.partition_is_complete`:
uniform nodes, one group per node, single-GPU groups), and it then holds against
every placement on any tensor groups (ranks in GPU order), as the brute-force
oracle's ``groups="any"`` enumerates them.  ``status``:
``optimal`` when the gap is at most
:data:`~pipette_cp.solvers.placement.kelley.OPTIMALITY_GAP`, else ``feasible``;
no placement at all raises :class:`~pipette_cp.errors.InfeasibleError`
(proven) or :class:`~pipette_cp.errors.SolverTimeoutError` (time ran out).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Protocol

import numpy as np

from pipette_cp.checker.checks import check_plan
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.cost.network import collectives as comm
from pipette_cp.errors import InfeasibleError, PipetteError, SolverTimeoutError
from pipette_cp.solvers import work_meter as work
from pipette_cp.solvers.extensions import family_violations
from pipette_cp.solvers.options import PLACEMENT_WORK_SHARE, SolveOptions
from pipette_cp.solvers.placement.backend import Backend
from pipette_cp.solvers.placement.build import build_placement_data, node_uniform
from pipette_cp.solvers.placement.cpsat import CpSatBackend
from pipette_cp.solvers.placement.data import PlacementData
from pipette_cp.solvers.placement.kelley import (
    OPTIMALITY_GAP,
    CutPool,
    bounds,
    kelley,
    lower_x,
    two_level_floor_x,
    worst_x,
)
from pipette_cp.solvers.placement.lns import lns
from pipette_cp.solvers.placement.local_search import failed_flows, local_search
from pipette_cp.solvers.placement.milp import MilpBackend
from pipette_cp.solvers.placement.regroup import regroup_within
from pipette_cp.specs import Instance, Plan, SolveInfo
from pipette_cp.specs.layouts import megatron_placement

#: Backends by name.
BACKENDS: dict[str, Callable[[], Backend]] = {"cpsat": CpSatBackend, "milp": MilpBackend}
#: Largest full master (sum over communicating unit pairs of |domain u| x |domain v|).
EXACT_SIZE = 20_000
#: Largest full MILP master (every engine); larger ones go to LNS.  CBC checks its time
#: limit only between phases: past this size its root node alone overran a 5 s limit by
#: 7 s, and up to 21 s at 6,144 terms.  HiGHS keeps its limit up to 9,248 terms (+0.09 s
#: at most) but not at 12,000 (+2.1 s at 20 s: root LP re-solves it does not interrupt),
#: and a cut-over of 10,000 gave tighter bounds at the 10 s default but no better plans
#: (worse on 3 of the 4 layouts whose plans differed) and 0.1-0.3 s longer solves where
#: LNS proves optimality (``python -m pipette_cp.experiments.solving.milp_engines``): one cut-over.
EXACT_SIZE_MILP = 4_000
#: Share of the time limit for seeds and their local search.
SEED_SHARE = 0.1
#: Time kept at the end for re-scoring (s; at most 5 % of the limit).
FINISH_RESERVE_S = 1.0
#: Share of a placement solve that chooses the expert groups and context-parallel rings
#: where the masters price them only as a bound (slot places, uneven groups;
#: :mod:`pipette_cp.solvers.placement.regroup`).
REGROUP_SHARE = 0.3
#: Random seed placements tried.
RANDOM_SEEDS = 16
#: Cuts added up front at the best seeds (and half-way to the lower bound).
SEED_CUTS = 12


def master_size(data: PlacementData) -> int:
    """Terms of the full master: sum over communicating unit pairs of the domain sizes."""
    per_stage = data.allowed.sum(axis=1)
    total = 0
    for edges in data.edges().values():
        for _, u, v in edges:
            total += int(per_stage[data.stage_of(u)] * per_stage[data.stage_of(v)])
    return total


def two_level_possible(data: PlacementData) -> bool:
    """Whether the Evaluator's ``best`` DP algorithm may differ from the ring: two
    replicas of one stage can share a node."""
    return data.plan.replicas > 1 and data.multi


class Seeder(Protocol):
    """Where the exact placement gets its warm starts.

    The heuristics sit above the exact models and are handed in
    (:class:`pipette_cp.solvers.methods.BaselineSeeder`); :class:`PlainSeeder`
    uses nothing but the plan's own placement and Megatron's order.
    """

    def hint_plans(
        self, instance: Instance, plan: Plan, options: SolveOptions, sa_s: float
    ) -> list[Plan]:
        """Complete plans of ``plan``'s degrees and split, tried as hints, preferred in
        this order on ties (``sa_s``: seconds for Pipette's annealer, 0 to skip it)."""
        ...

    def assignments(self, data: PlacementData, seed: int) -> list[tuple[float, np.ndarray]]:
        """Seed assignments with their :meth:`PlacementData.value`, best first."""
        ...

    def first_layout(self, data: PlacementData, rng: np.random.Generator) -> np.ndarray | None:
        """Some assignment whatever its links (the start of a repair), None if none."""
        ...


class PlainSeeder:
    """The plan's own placement and Megatron's order; no heuristic."""

    def hint_plans(
        self, instance: Instance, plan: Plan, options: SolveOptions, sa_s: float
    ) -> list[Plan]:
        del instance, options, sa_s
        default = megatron_placement(plan.replicas, plan.pp, plan.tp)
        plans = [plan.model_copy(update={"placement": default})]
        if plan.placement is not None and plan.placement != default:
            plans.append(plan)
        return plans

    def assignments(self, data: PlacementData, seed: int) -> list[tuple[float, np.ndarray]]:
        del data, seed
        return []

    def first_layout(self, data: PlacementData, rng: np.random.Generator) -> np.ndarray | None:
        del rng
        return data.assignment_of(
            megatron_placement(data.plan.replicas, data.plan.pp, data.plan.tp)
        )


def seed_assignments(
    data: PlacementData,
    plans: list[Plan],
    seeder: Seeder,
    options: SolveOptions,
    deadline: float,
) -> list[tuple[float, np.ndarray]]:
    """Feasible seed assignments with their values, best first (after local search)."""
    found = seeder.assignments(data, options.seed)
    for hint in plans:
        assign = data.assignment_of(hint.placement)
        if assign is not None:
            found.append((data.value(assign), assign))
    rng = np.random.default_rng(options.seed)
    slots = np.repeat(np.arange(data.num_places), data.capacity)
    for _ in range(RANDOM_SEEDS):
        assign = rng.permutation(slots)[: data.num_units]
        if all(data.allowed[data.stage_of(u), p] for u, p in enumerate(assign)):
            found.append((data.value(assign), assign))
    if not any(np.isfinite(v) for v, _ in found):  # every candidate crosses a failed link
        first = seeder.first_layout(data, rng)
        found += [] if first is None else [(np.inf, first)]
    if not found:
        return []
    feasible = sorted((item for item in found if np.isfinite(item[0])), key=lambda t: t[0])
    starts = [a for _, a in feasible[:2]]
    if not starts:  # repair the candidate with the fewest flows over failed links
        starts = [min((a for _, a in found), key=lambda a: len(failed_flows(data, a)))]
    for i, start in enumerate(starts):
        share = (deadline - work.now()) / (len(starts) - i)
        assign, value = local_search(data, start, work.now() + share, rng)
        if np.isfinite(value):
            feasible.append((value, assign))
    feasible.sort(key=lambda item: item[0])
    return feasible


def solve_placement(
    instance: Instance,
    plan: Plan,
    options: SolveOptions,
    backend: str = "cpsat",
    dp_algorithm: comm.Algorithm = "best",
    seeder: Seeder | None = None,
    aligned: bool | None = None,
) -> Plan:
    """The best placement of ``plan``'s degrees and split found within the time limit.

    ``dp_algorithm`` is the final scorer's (``Evaluator(instance, dp_algorithm=...)``);
    with ``"ring"`` the master is exact and its bound always valid.  ``seeder`` gives
    the warm starts (default :class:`PlainSeeder`).  ``aligned``: slots on the
    tp-aligned blocks (True) or on each node's best cut into tensor groups (False);
    None, where a node's links are not uniform, solves both in half the time each and
    keeps the faster, so the chosen groups never lose to the aligned blocks.

    Raises
    ------
    LayoutError
        tp does not divide gpus_per_node, or too many units.
    InfeasibleError
        No placement avoids the failed links with every stage within memory.
    SolverTimeoutError
        No placement found within the time limit (the master never answered).
    """
    if options.deterministic:  # the part's work budget, whatever the caller's clock said
        limit = options.work_limit_s(PLACEMENT_WORK_SHARE)
        options = replace(options, time_limit_s=limit, work_s=None)
    with work.deterministic(options.deterministic and not work.active()):  # metered here
        return _placement(instance, plan, options, backend, dp_algorithm, seeder, aligned)


def _placement(instance: Instance, plan: Plan, options: SolveOptions, backend: str,
               dp_algorithm: comm.Algorithm, seeder: Seeder | None, aligned: bool | None,
               ) -> Plan:  # fmt: skip
    cut_differs = 1 < plan.tp <= instance.cluster.gpus_per_node and not node_uniform(instance)
    if aligned is None and cut_differs and not plan.hybrid:
        half = replace(options, time_limit_s=options.time_limit_s / 2)
        found: list[tuple[float, int, Plan]] = []
        for choice in (False, True):
            with contextlib.suppress(PipetteError):
                placed = _placement(instance, plan, half, backend, dp_algorithm, seeder,
                                    aligned=choice)  # fmt: skip
                info = placed.solve_info
                found.append((info.objective if info and info.objective else 0.0, choice, placed))
        if not found:  # neither: the error of the best cut again
            return _placement(instance, plan, half, backend, dp_algorithm, seeder, False)
        return min(found, key=lambda item: item[:2])[2]
    started = work.now()
    if plan.hybrid:
        return _hybrid_placement(instance, plan, options, backend, dp_algorithm, seeder, started)
    # keep a little of the budget for re-scoring the result and the hints, and with
    # expert groups or context-parallel rings a share for choosing them (regroup)
    end = started + options.time_limit_s - min(FINISH_RESERVE_S, 0.05 * options.time_limit_s)
    data = build_placement_data(instance, plan, constraints=options.constraints,
                                aligned=bool(aligned))  # fmt: skip
    # groups the masters price only as a bound (slot places, uneven groups): regroup after
    grouped = (plan.cp > 1 or plan.ep > 1) and not data.exact
    deadline = end - (REGROUP_SHARE * options.time_limit_s if grouped else 0.0)
    if not data.allowed.any(axis=1).all():
        raise InfeasibleError("some pipeline stage fits on no GPU type of the cluster (memory)")
    exact = master_size(data) <= (
        EXACT_SIZE if backend == "cpsat" else min(EXACT_SIZE, EXACT_SIZE_MILP)
    )
    # Pipette's SA scores with the evaluator itself: a hint worth its time when the master
    # is not exact, or when the two-level all-reduce (not in the master) may win
    sa_s = 0.0 if exact and not two_level_possible(data) else min(2.0, 0.1 * options.time_limit_s)
    seeder = seeder or PlainSeeder()
    plans = seeder.hint_plans(instance, plan, options, sa_s)
    seed_deadline = work.now() + SEED_SHARE * options.time_limit_s
    seeds = seed_assignments(data, plans, seeder, options, seed_deadline)
    if not seeds and not exact:  # the full master is too large to find one: keep repairing
        more = work.now() + 0.5 * (deadline - work.now())
        seeds = seed_assignments(data, plans, seeder, replace(options, seed=options.seed + 1), more)
    if not seeds and not exact and not data.constraints:  # with user rows: try the full master
        raise SolverTimeoutError("no placement avoiding the failed links found in the time limit")
    best_value, best = seeds[0] if seeds else (float("inf"), None)
    lx = lower_x(data)
    upper = best_value if seeds else data.total_time_s(worst_x(data))
    bound = data.total_time_s(lx)  # no placement's inputs lie below lx: a floor of all
    pool = CutPool(data, upper_s=upper, deadline=end)
    # the MILP master on the engine of the options (milp_solver)
    make = partial(MilpBackend, options.milp_solver) if backend == "milp" else BACKENDS[backend]
    full = [np.flatnonzero(data.allowed[data.stage_of(u)]) for u in range(data.num_units)]
    try:
        pool.add_at(lx)
        for _, assign in seeds[:SEED_CUTS]:
            x = data.x_of(assign)
            pool.add_at(x)
            pool.add_at(lx + 0.5 * (x - lx))
        if exact or best is None:  # no seed: only the full master can find (or refute) one
            res = kelley(data, make, domains=full, start=best, pool=pool, deadline=deadline,
                         workers=options.workers, seed=options.seed, symmetry=True, bound_s=bound)  # fmt: skip
            best, best_value, bound = res.assign, res.value_s, max(bound, res.bound_s)
        if not exact:
            bound = max(bound, data.total_time_s(bounds(pool, best_value)[0]))
            best, best_value, _ = lns(data, best, pool, make, deadline=deadline, seed=options.seed,
                                      workers=options.workers, bound_s=bound)  # fmt: skip
            bound = max(bound, data.total_time_s(bounds(pool, best_value)[0]))
    except SolverTimeoutError:  # the time ran out building a cut: the best placement so far
        if best is None:
            raise
    scorer = Evaluator(instance, dp_algorithm=dp_algorithm)
    # the master is exact for ring all-reduce, and its compute classes for one GPU type;
    # where the two-level all-reduce may win, the bound is the analytic floor of both
    if data.exact and dp_algorithm != "ring" and two_level_possible(data):
        bound = data.total_time_s(two_level_floor_x(data))
    solved = _finish(
        scorer, plan, data, best, bound if data.exact else None, plans, backend, started
    )
    if not grouped:
        return solved
    regrouped, objective = regroup_within(scorer, solved, end, options.seed)
    if (
        regrouped is solved
        or check_plan(instance, regrouped)
        or family_violations(options.constraints, instance, regrouped)
    ):
        return solved
    info = solved.solve_info
    assert info is not None
    gap = None if info.bound is None else max(objective - info.bound, 0.0) / objective
    info = info.model_copy(update={"objective": objective, "gap": gap,
                                   "wall_time_s": work.now() - started})  # fmt: skip
    return regrouped.model_copy(update={"solve_info": info})


def _hybrid_placement(
    instance: Instance, plan: Plan, options: SolveOptions, backend: str,
    dp_algorithm: comm.Algorithm, seeder: Seeder | None, started: float,
) -> Plan:  # fmt: skip
    """HSDP: the masters model one DP ring per stage, not the shard and replica groups, so
    the seeder's placements (Pipette's annealer among them) are scored by the Evaluator
    and the best is returned as ``feasible``, with no bound."""
    evaluator = Evaluator(instance, dp_algorithm=dp_algorithm)
    plans = (seeder or PlainSeeder()).hint_plans(instance, plan, options, min(2.0, 0.1 * options.time_limit_s))  # fmt: skip
    scored = []
    for i, hint in enumerate(plans):
        if check_plan(instance, hint) or family_violations(options.constraints, instance, hint):
            continue  # over a failed link, out of memory, or against a user family
        with contextlib.suppress(PipetteError):
            scored.append((evaluator.iteration_time(hint), i, hint))
    if not scored:
        raise InfeasibleError(
            "no placement of the hybrid-sharded plan avoids the failed links and fits"
        )
    objective, _, chosen = min(scored, key=lambda item: (item[0], item[1]))
    info = SolveInfo(method=backend, status="feasible", objective=objective,
                     wall_time_s=work.now() - started)  # fmt: skip
    return chosen.model_copy(update={"evaluation": None, "solve_info": info})


def _finish(evaluator, plan, data, best, bound, plans, method, started) -> Plan:
    """Re-score with the final evaluator; keep the best of the result and the hints
    (``bound`` None: not valid for that evaluator, or only over slots that do not
    match every grouping of the GPUs)."""
    if not data.slots_complete:
        bound = None  # a proof over one cut into tensor groups, not over all of them
    candidate = plan.model_copy(update={"placement": data.placement(best), "evaluation": None})
    scored = [(evaluator.iteration_time(candidate), 0, candidate)]
    for i, hint in enumerate(plans, start=1):
        if check_plan(evaluator.instance, hint) or family_violations(
            data.constraints, evaluator.instance, hint
        ):
            continue  # a hint over a failed link, out of memory, or against a user family
        with contextlib.suppress(PipetteError):
            scored.append((evaluator.iteration_time(hint), i, hint))
    objective, _, chosen = min(scored, key=lambda item: (item[0], item[1]))
    if bound is not None and objective < bound * (1 - OPTIMALITY_GAP):
        bound = None  # a hint outside the master's space (e.g. unaligned TP groups) won
    gap = None if bound is None else max(objective - bound, 0.0) / objective
    status = "optimal" if gap is not None and gap <= OPTIMALITY_GAP else "feasible"
    info = SolveInfo(
        method=method,
        status=status,
        objective=objective,
        bound=None if bound is None else min(bound, objective),
        gap=gap,
        wall_time_s=work.now() - started,
    )
    return chosen.model_copy(update={"evaluation": None, "solve_info": info})
