"""Brute-force placement oracle for tiny instances (at most :data:`MAX_UNITS` units).

Enumerates every injective map of the units onto tensor groups, skipping only
the swap of two DP replicas (it keeps every pipeline, the ring, every NIC share, so
every time the Evaluator computes; not skipped where context-parallel rings, expert
groups or HSDP shard groups are blocks of consecutive replicas, which it regroups;
with more replicas no rotation is skipped, since NCCL's ring follows the replicas'
order), and scores each
with :class:`~pipette_cp.cost.evaluator.evaluate.Evaluator` itself, the checker's
``memory_limit`` and the failed-link test of the cost model.  The groups are
either the tp-aligned blocks of every node (``groups="aligned"``: the exact
methods' slots on uniform nodes, :mod:`pipette_cp.solvers.placement`) or any
``tp`` GPUs of one node, ranks in GPU order (``groups="any"``: every partition
of every node's GPUs into tensor groups, and every subset of them when there
are fewer units than groups); beyond a node (tp > gpus_per_node) a group lies in
one NVLink domain.  It shares no code with the master models, which is what
makes it an oracle.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Literal

from pipette_cp.checker.checks import check_memory_limit
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.cost.network import collectives as comm
from pipette_cp.errors import InfeasibleError, LayoutError, SpecError
from pipette_cp.specs import Instance, Plan

#: Largest number of units (dp x pp) the oracle accepts.
MAX_UNITS = 8
#: Largest number of placements ``groups="any"`` may have to enumerate (ordered
#: choices of the units' groups among all groups of the cluster, an upper bound).
MAX_ANY_PLACEMENTS = 2_000_000

Groups = Literal["aligned", "any"]


def _span(instance: Instance, tp: int) -> int:
    """GPUs a group of ``tp`` must lie in: a node, or an NVLink domain beyond a node."""
    c = instance.cluster
    return c.gpus_per_node if tp <= c.gpus_per_node else c.gpus_per_domain


def aligned_blocks(instance: Instance, tp: int) -> list[tuple[int, ...]]:
    """GPU ids of every tp-aligned block ``[k tp, (k+1) tp)`` of every node (of every
    NVLink domain, for tp > gpus_per_node)."""
    c, span = instance.cluster, _span(instance, tp)
    if span % tp or (tp > c.gpus_per_node and tp % c.gpus_per_node):
        raise LayoutError("plan.tp", tp, f"tp={tp} does not divide gpus_per_node={c.gpus_per_node}")
    return [tuple(range(k * tp, (k + 1) * tp)) for k in range(c.num_gpus // tp)]


def any_groups(instance: Instance, tp: int) -> list[tuple[int, ...]]:
    """Every ``tp`` GPUs of one node (of one NVLink domain, for tp > gpus_per_node), in
    GPU order."""
    aligned_blocks(instance, tp)  # the same size checks
    span = _span(instance, tp)
    return [
        group
        for start in range(0, instance.cluster.num_gpus, span)
        for group in itertools.combinations(range(start, start + span), tp)
    ]


def _assignments(
    groups: list[tuple[int, ...]], units: int, dp: int, disjoint: bool
) -> Iterator[tuple[int, ...]]:
    """Injective choices of group indices for the units (no GPU twice when groups
    overlap), replica 0 of stage 0 on the lowest index of stage 0's groups."""
    if not disjoint:
        for perm in itertools.permutations(range(len(groups)), units):
            if dp == 1 or perm[0] == min(perm[:dp]):
                yield perm
        return
    sets = [frozenset(g) for g in groups]
    chosen: list[int] = []

    def extend(used: frozenset[int]) -> Iterator[tuple[int, ...]]:
        if len(chosen) == units:
            yield tuple(chosen)
            return
        u = len(chosen)
        for i, s in enumerate(sets):
            if s & used or i in chosen or (0 < u < dp and i < chosen[0]):
                continue  # a GPU twice, or a rotation of the replicas of stage 0
            chosen.append(i)
            yield from extend(used | s)
            chosen.pop()

    yield from extend(frozenset())


def brute_force_placement(
    instance: Instance,
    plan: Plan,
    dp_algorithm: comm.Algorithm = "best",
    groups: Groups = "aligned",
) -> tuple[Plan, float]:
    """The fastest placement of ``plan``'s units on tensor groups, and its time (s).

    ``groups``: ``"aligned"``, the tp-aligned blocks; ``"any"``, any tp GPUs of one node
    (module doc).

    Raises
    ------
    SpecError
        More than :data:`MAX_UNITS` units, or (``"any"``) more than
        :data:`MAX_ANY_PLACEMENTS` placements to enumerate.
    InfeasibleError
        Every placement crosses a failed link or overflows a GPU's memory.
    """
    units = plan.replicas * plan.pp
    if units > MAX_UNITS:
        raise SpecError("plan.dp*pp", units, f"the brute-force oracle takes <= {MAX_UNITS} units")
    if groups not in ("aligned", "any"):
        raise SpecError("groups", groups, "expected 'aligned' or 'any'")
    blocks = (
        aligned_blocks(instance, plan.tp) if groups == "aligned" else any_groups(instance, plan.tp)
    )
    if groups == "any" and (count := math.perm(len(blocks), units)) > MAX_ANY_PLACEMENTS:
        raise SpecError(
            "plan.dp*pp", units, f"{units} units on {len(blocks)} tensor groups of tp={plan.tp}: "
            f"{count} placements, the brute-force oracle (groups='any') takes <= {MAX_ANY_PLACEMENTS}",
        )  # fmt: skip
    evaluator = Evaluator(instance, dp_algorithm=dp_algorithm, validate=False)
    best: tuple[float, Plan | None] = (float("inf"), None)
    # a rotation of the replicas keeps every time only where no group is a block of
    # consecutive replicas (context-parallel rings, expert groups, HSDP shard groups) and
    # the DP ring has two replicas: NCCL builds a longer ring from the replicas' order
    # (nodes in the order of their first replica), which a rotation changes
    blocks_of_replicas = plan.cp > 1 or plan.ep > 1 or plan.expert_tp != plan.tp or plan.hybrid
    rotations = plan.replicas if plan.replicas == 2 and not blocks_of_replicas else 1
    for perm in _assignments(blocks, units, rotations, disjoint=groups == "any"):
        candidate = plan.model_copy(update={"placement": tuple(blocks[i] for i in perm)})
        try:
            value = evaluator.iteration_time(candidate)
        except InfeasibleError:
            continue  # a failed link
        if value < best[0] and not check_memory_limit(instance, candidate):
            best = (value, candidate)
    if best[1] is None:
        raise InfeasibleError("every placement crosses a failed link or overflows memory")
    return best[1], best[0]
