"""Brute-force placement oracle for tiny instances (at most :data:`MAX_UNITS` units).

Enumerates every injective map of the units onto the tp-aligned GPU blocks of
the cluster (the exact methods' search space, :mod:`pipette_cp.solvers.placement`),
skipping only the rotations of the DP replicas (a rotation maps replica ``r``
to ``r + k mod dp`` on every stage: it keeps every pipeline, every ring up to
its starting point, every NIC share, so every time the Evaluator computes), and
scores each with :class:`~pipette_cp.cost.evaluate.Evaluator` itself, the
checker's ``memory_limit`` and the failed-link test of the cost model.  It
shares no code with the master models, which is what makes it an oracle.
"""

from __future__ import annotations

import itertools

from pipette_cp.checker.checks import check_memory_limit
from pipette_cp.cost import comm
from pipette_cp.cost.evaluate import Evaluator
from pipette_cp.errors import InfeasibleError, LayoutError, SpecError
from pipette_cp.specs import Instance, Plan

#: Largest number of units (dp x pp) the oracle accepts.
MAX_UNITS = 8


def aligned_blocks(instance: Instance, tp: int) -> list[tuple[int, ...]]:
    """GPU ids of every tp-aligned block ``[k tp, (k+1) tp)`` of every node."""
    g = instance.cluster.gpus_per_node
    if g % tp:
        raise LayoutError("plan.tp", tp, f"tp={tp} does not divide gpus_per_node={g}")
    return [
        tuple(node * g + k * tp + t for t in range(tp))
        for node in range(instance.cluster.num_nodes)
        for k in range(g // tp)
    ]


def brute_force_placement(
    instance: Instance, plan: Plan, dp_algorithm: comm.Algorithm = "best"
) -> tuple[Plan, float]:
    """The fastest placement of ``plan``'s units on aligned blocks, and its time (s).

    Raises
    ------
    SpecError
        More than :data:`MAX_UNITS` units.
    InfeasibleError
        Every placement crosses a failed link or overflows a GPU's memory.
    """
    units = plan.dp * plan.pp
    if units > MAX_UNITS:
        raise SpecError("plan.dp*pp", units, f"the brute-force oracle takes <= {MAX_UNITS} units")
    blocks = aligned_blocks(instance, plan.tp)
    evaluator = Evaluator(instance, dp_algorithm=dp_algorithm, validate=False)
    best: tuple[float, Plan | None] = (float("inf"), None)
    for perm in itertools.permutations(range(len(blocks)), units):
        if plan.dp > 1 and perm[0] != min(perm[: plan.dp]):
            continue  # a rotation of the replicas of an enumerated placement
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
