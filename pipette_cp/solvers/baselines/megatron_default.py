"""Megatron-LM's default layout, and whole-node permutations of its rank order.

It keeps the even layer split (:func:`pipette_cp.specs.layouts.even_split`) and
knows nothing about link quality.
"""

from __future__ import annotations

import time

import numpy as np

from pipette_cp.solvers.baselines.common import Placement, finish_plan, require_layout_fits
from pipette_cp.solvers.options import SolveOptions
from pipette_cp.specs import Instance, Plan
from pipette_cp.specs.layouts import even_split, megatron_placement

#: Random node permutations of Megatron's order tried as two-level-friendly hints.
NODE_PACKED_HINTS = 8


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
        placement=megatron_placement(skeleton.replicas, skeleton.pp, skeleton.tp),
        method="megatron-default",
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
    base = np.array(megatron_placement(plan.replicas, plan.pp, plan.tp), dtype=np.int64)
    rng = np.random.default_rng(seed)
    nodes = instance.cluster.num_nodes
    out = [base]
    for _ in range(count):
        perm = rng.permutation(nodes)
        out.append(perm[base // g] * g + base % g)
    return [tuple(tuple(int(x) for x in unit) for unit in p) for p in out]
