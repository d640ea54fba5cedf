"""What every baseline shares: the layout check, the finished plan, the best of a list.

The baselines (:mod:`~pipette_cp.solvers.baselines.megatron_default`,
:mod:`~pipette_cp.solvers.baselines.random_method`,
:mod:`~pipette_cp.solvers.baselines.greedy`, :mod:`~pipette_cp.solvers.baselines.pipette_sa`,
:mod:`~pipette_cp.solvers.baselines.amp`) know nothing of the exact models; what
they return is what an exact solver must beat.
"""

from __future__ import annotations

import contextlib
import math
import time

import numpy as np

from pipette_cp.checker.checks import check_plan, communication_pairs
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.errors import LayoutError, PipetteError
from pipette_cp.specs import Instance, Plan, SolveInfo

Placement = tuple[tuple[int, ...], ...]


def require_layout_fits(instance: Instance, plan: Plan, method: str) -> None:
    """Raise :class:`LayoutError` unless dp x pp x tp GPUs exist and tp divides the GPUs
    of a node (or, beyond a node, is whole nodes dividing the NVLink domain).

    Every baseline keeps a unit's tp ranks on one node by cutting each node
    into ``gpus_per_node / tp`` aligned groups (Megatron's consecutive tp ranks
    on hostfile order do the same), so ``tp`` must divide the GPUs of a node.

    Raises
    ------
    LayoutError
        Too many GPUs requested, or tp not a divisor of gpus_per_node.
    """
    cluster = instance.cluster
    if plan.num_gpus > cluster.num_gpus:
        raise LayoutError(
            "plan.num_gpus",
            plan.num_gpus,
            f"{method}: dp*pp*tp={plan.dp}*{plan.pp}*{plan.tp} exceeds the "
            f"{cluster.num_gpus} GPUs of the cluster",
        )
    g, domain = cluster.gpus_per_node, cluster.gpus_per_domain
    if g % plan.tp if plan.tp <= g else plan.tp % g or domain % plan.tp:
        raise LayoutError(
            "plan.tp",
            plan.tp,
            f"{method}: tp={plan.tp} does not divide gpus_per_node={g}"
            + (f" nor the {domain} GPUs of an NVLink domain" if domain > g else "")
            + ", so a tensor-parallel group would span nodes",
        )


def finish_plan(
    skeleton: Plan,
    *,
    layer_split: tuple[int, ...],
    placement: Placement,
    method: str,
    objective_s: float | None,
    started_at: float,
) -> Plan:
    """The skeleton with a new split and placement and a heuristic :class:`SolveInfo`.

    ``started_at`` is a :func:`time.perf_counter` reading taken when the method
    began; any previous evaluation is dropped (it described another layout).  An
    infinite objective (no state of the heuristic avoids the failed pairs) becomes none.
    """
    finite = objective_s is not None and math.isfinite(objective_s)
    info = SolveInfo(
        method=method,
        status="heuristic",
        objective=objective_s if finite else None,  # inf: every state crosses a failed pair
        wall_time_s=time.perf_counter() - started_at,
    )
    data = skeleton.model_dump()
    data.update(
        layer_split=tuple(layer_split),
        placement=tuple(tuple(int(g) for g in unit) for unit in placement),
        evaluation=None,
        solve_info=info.model_dump(),
    )
    return Plan.model_validate(data)


def failed_pairs_used(instance: Instance, plan: Plan) -> int:
    """Number of ordered failed GPU pairs that ``plan`` sends data over (any traffic class)."""
    cluster = instance.cluster
    if not cluster.has_failed_pairs:
        return 0
    tied = instance.model.tied_embeddings
    pairs = communication_pairs(plan, tied, cluster.links, cluster.gpus_per_node)
    ends = np.array([p for kind in pairs.values() for p in kind], dtype=np.int64).reshape(-1, 2)
    return int(cluster.pair_failed(ends[:, 0], ends[:, 1]).sum())


def best_of(
    instance: Instance, plan: Plan, placements: list[Placement]
) -> tuple[float, Placement | None]:
    """The placement of ``placements`` with the smallest evaluated iteration time for
    ``plan``'s degrees and split (inf, None when none runs: failed link, memory)."""
    evaluator = Evaluator(instance)
    best: tuple[float, Placement | None] = (math.inf, None)
    for placement in placements:
        candidate = plan.model_copy(update={"placement": placement, "evaluation": None})
        if check_plan(instance, candidate):
            continue
        with contextlib.suppress(PipetteError):
            t = evaluator.iteration_time(candidate)
            if t < best[0]:
                best = (t, placement)
    return best
