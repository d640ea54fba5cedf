"""A seeded random placement with the even layer split."""

from __future__ import annotations

import random
import time

from pipette_cp.errors import LayoutError
from pipette_cp.solvers.baselines.common import (
    Placement,
    failed_pairs_used,
    finish_plan,
    require_layout_fits,
)
from pipette_cp.solvers.options import SolveOptions
from pipette_cp.specs import ClusterSpec, Instance, Plan
from pipette_cp.specs.layouts import even_split

#: How many random placements ``random`` draws at most to avoid failed links.
RANDOM_TRIES = 20


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
    span = cluster.gpus_per_node if tp <= cluster.gpus_per_node else cluster.gpus_per_domain
    for first in range(0, cluster.num_gpus, span):  # a node, or an NVLink domain for wide tp
        gpus = list(range(first, first + span))
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
        placement = random_placement(
            instance.cluster, skeleton.replicas, skeleton.pp, skeleton.tp, rng
        )
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
