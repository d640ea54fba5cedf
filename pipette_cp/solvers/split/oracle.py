"""The split oracle: every composition of the layers of a tiny instance, enumerated."""

from __future__ import annotations

import itertools

import numpy as np

from pipette_cp.checker.checks import check_memory_limit
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.errors import InfeasibleError, SpecError
from pipette_cp.solvers.split.solve import CHUNK_SPREAD
from pipette_cp.specs import Instance, Plan

#: Largest instance :func:`brute_force_split` accepts: layers, model chunks.
BRUTE_FORCE_LIMITS = (12, 4)


def brute_force_split(
    instance: Instance, plan: Plan, chunk_spread: int | None = CHUNK_SPREAD
) -> tuple[tuple[int, ...], float]:
    """Best split of a tiny instance by enumerating every composition of the layers.

    Each split is checked with :func:`pipette_cp.checker.check_memory_limit` (and
    the chunk spread) and timed with :meth:`Evaluator.evaluate` (analytic):
    independent of the split models.  Ties keep the first split in lexicographic
    order.

    Raises
    ------
    SpecError
        More than :data:`BRUTE_FORCE_LIMITS` layers or chunks.
    InfeasibleError
        No split fits in memory.
    """
    layers, chunks = instance.model.num_layers, plan.pp * plan.vpp
    if layers > BRUTE_FORCE_LIMITS[0] or chunks > BRUTE_FORCE_LIMITS[1]:
        raise SpecError(
            "brute_force_split", (layers, chunks), f"at most {BRUTE_FORCE_LIMITS} layers, chunks"
        )
    evaluator = Evaluator(instance, validate=False)
    best: tuple[tuple[int, ...], float] | None = None
    for cuts in itertools.combinations(range(1, layers), chunks - 1):
        bounds = (0, *cuts, layers)
        split = tuple(b - a for a, b in itertools.pairwise(bounds))
        candidate = plan.model_copy(update={"layer_split": split})
        grid = np.reshape(split, (plan.vpp, plan.pp))
        spread = int((grid.max(axis=0) - grid.min(axis=0)).max())
        if chunk_spread is not None and spread > chunk_spread:
            continue
        if check_memory_limit(instance, candidate):
            continue
        value = evaluator.evaluate(candidate).iteration_time_s
        if best is None or value < best[1]:
            best = (split, value)
    if best is None:
        raise InfeasibleError(f"no split of {layers} layers into {chunks} chunks fits in memory")
    return best
