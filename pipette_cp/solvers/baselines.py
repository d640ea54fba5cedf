"""Plain baselines: Megatron-LM's default layout and a seeded random placement.

Both keep the even layer split (:func:`pipette_cp.specs.layouts.even_split`) and
know nothing about link quality; they are what an exact solver must beat.
The helpers :func:`require_layout_fits` and :func:`finish_plan` are shared by
the other baselines (:mod:`pipette_cp.solvers.pipette_sa`,
:mod:`pipette_cp.solvers.amp`).
"""

from __future__ import annotations

import contextlib
import math
import random
import time

import numpy as np

from pipette_cp.checker.checks import check_plan, communication_pairs
from pipette_cp.cost.evaluate import Evaluator
from pipette_cp.errors import LayoutError, PipetteError
from pipette_cp.solvers.base import SolveOptions, register
from pipette_cp.specs import ClusterSpec, Instance, Plan, SolveInfo
from pipette_cp.specs.layouts import even_split, megatron_placement

#: How many random placements ``random`` draws at most to avoid failed links.
RANDOM_TRIES = 20
#: Random node permutations of Megatron's order tried as two-level-friendly hints.
NODE_PACKED_HINTS = 8

Placement = tuple[tuple[int, ...], ...]


def require_layout_fits(instance: Instance, plan: Plan, method: str) -> None:
    """Raise :class:`LayoutError` unless dp x pp x tp GPUs exist and tp | gpus_per_node.

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
    if cluster.gpus_per_node % plan.tp:
        raise LayoutError(
            "plan.tp",
            plan.tp,
            f"{method}: tp={plan.tp} does not divide gpus_per_node={cluster.gpus_per_node}, "
            "so a tensor-parallel group would span nodes",
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
    began; any previous evaluation is dropped (it described another layout).
    """
    info = SolveInfo(
        method=method,
        status="heuristic",
        objective=objective_s,
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


@register("megatron-default")
def megatron_default(instance: Instance, skeleton: Plan, options: SolveOptions) -> Plan:
    """Megatron-LM's own layout: even split, ranks tp-dp-pp over hostfile order.

    Rank ``r = t + tp (d + dp s)`` runs on the r-th GPU of the hostfile
    (``RankGenerator`` in Megatron-LM ``megatron/core/parallel_state.py``, order
    "tp-dp-pp"); the layer split is even (``--num-layers`` / pp per stage).  No
    notion of link quality, failed links included.  Objective: none.

    Raises
    ------
    LayoutError
        See :func:`require_layout_fits`.
    """
    del options
    started = time.perf_counter()
    require_layout_fits(instance, skeleton, "megatron-default")
    return finish_plan(
        skeleton,
        layer_split=even_split(instance.model.num_layers, skeleton.pp, skeleton.vpp),
        placement=megatron_placement(skeleton.dp, skeleton.pp, skeleton.tp),
        method="megatron-default",
        objective_s=None,
        started_at=started,
    )


def random_placement(
    cluster: ClusterSpec, dp: int, pp: int, tp: int, rng: random.Random
) -> Placement:
    """A uniformly random placement of the ``dp * pp`` units, each inside one node.

    Every node's GPUs are shuffled and cut into ``gpus_per_node // tp`` groups;
    the groups of all nodes are shuffled and the first ``dp * pp`` become units
    ``0, 1, ...`` (unit = stage * dp + replica).  When the plan uses every GPU
    and tp divides gpus_per_node, each valid placement (including the order of
    the tp ranks inside a unit) is equally likely.

    Examples
    --------
    >>> from pipette_cp.clusters.expand import cluster_from_node_matrix
    >>> from pipette_cp.specs import resolve_gpu
    >>> import numpy as np
    >>> c = cluster_from_node_matrix(node_bandwidth=np.full((2, 2), 20e9), intra_node=150e9,
    ...     gpus_per_node=4, gpu=resolve_gpu("a100"), nics_per_node=4,
    ...     nic_bandwidth_bytes_per_s=25e9)
    >>> units = random_placement(c, dp=2, pp=2, tp=2, rng=random.Random(0))
    >>> sorted(g for u in units for g in u)
    [0, 1, 2, 3, 4, 5, 6, 7]
    """
    groups: list[tuple[int, ...]] = []
    for node in range(cluster.num_nodes):
        gpus = list(cluster.gpus_of_node(node))
        rng.shuffle(gpus)
        groups.extend(tuple(gpus[i : i + tp]) for i in range(0, len(gpus) - tp + 1, tp))
    if len(groups) < dp * pp:
        raise LayoutError(
            "plan.num_gpus",
            dp * pp * tp,
            f"random: only {len(groups)} node-local groups of tp={tp} GPUs exist, "
            f"dp*pp={dp * pp} units needed",
        )
    rng.shuffle(groups)
    return tuple(groups[: dp * pp])


def failed_pairs_used(instance: Instance, plan: Plan) -> int:
    """Number of ordered failed GPU pairs that ``plan`` sends data over (any traffic class)."""
    failed = instance.cluster.failed_mask
    if not failed.any():
        return 0
    pairs = communication_pairs(plan, instance.model.tied_embeddings)
    return sum(bool(failed[a, b]) for kind in pairs.values() for a, b in kind)


@register("random")
def random_method(instance: Instance, skeleton: Plan, options: SolveOptions) -> Plan:
    """Even split and a uniformly random node-local placement, seeded.

    Draws up to :data:`RANDOM_TRIES` placements with ``random.Random(options.seed)``
    and keeps the first that sends nothing over a failed GPU pair; if every draw
    uses one, keeps the draw using the fewest failed pairs (the checker's
    ``no_failed_link`` family then reports it).  Objective: none.

    Raises
    ------
    LayoutError
        See :func:`require_layout_fits`.
    """
    started = time.perf_counter()
    require_layout_fits(instance, skeleton, "random")
    rng = random.Random(options.seed)
    split = even_split(instance.model.num_layers, skeleton.pp, skeleton.vpp)
    best: Plan | None = None
    best_bad = -1
    for _ in range(RANDOM_TRIES):
        placement = random_placement(instance.cluster, skeleton.dp, skeleton.pp, skeleton.tp, rng)
        plan = finish_plan(
            skeleton,
            layer_split=split,
            placement=placement,
            method="random",
            objective_s=None,
            started_at=started,
        )
        bad = failed_pairs_used(instance, plan)
        if best is None or bad < best_bad:
            best, best_bad = plan, bad
        if bad == 0:
            break
    assert best is not None
    return finish_plan(
        skeleton,
        layer_split=split,
        placement=best.placement,
        method="random",
        objective_s=None,
        started_at=started,
    )


def node_packed_placements(
    instance: Instance, plan: Plan, seed: int, count: int = NODE_PACKED_HINTS
) -> list[Placement]:
    """Megatron's order with whole nodes permuted (identity first, then ``count`` random
    permutations).

    Megatron's order packs the data-parallel replicas of a stage onto whole nodes when
    tp x dp fills them, which is what the two-level all-reduce rewards; permuting nodes
    keeps the packing while moving stages off failed or slow links.  The placement
    masters model ring all-reduce only, so these hints (scored by the evaluator)
    carry the two-level case.
    """
    g = instance.cluster.gpus_per_node
    base = np.array(megatron_placement(plan.dp, plan.pp, plan.tp), dtype=np.int64)
    rng = np.random.default_rng(seed)
    nodes = instance.cluster.num_nodes
    out = [base]
    for _ in range(count):
        perm = rng.permutation(nodes)
        out.append(perm[base // g] * g + base % g)
    return [tuple(tuple(int(x) for x in unit) for unit in p) for p in out]


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
