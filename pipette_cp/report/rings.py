"""The rings a plan's collectives are charged on: the ones NCCL builds at launch.

The exported launch files give every Megatron-LM rank its GPU (``rank_map.csv``,
:mod:`pipette_cp.report.launch`).  Each data-parallel group (one per stage and tensor
rank, its ranks in DP-rank order) and each expert data-parallel group is an NCCL
communicator whose ring visits the nodes in the order of their first rank, each node's
GPUs together (:mod:`pipette_cp.cost.network.nccl_rings`); a tensor-parallel group sits
inside one node, where NCCL's search picks the ring over the node's links
(:func:`~pipette_cp.checker.checks.tp_ring_order`).  :func:`charged_rings` lists
those rings as the Evaluator charges them, so that a launch can be checked against
them (:func:`failed_ring_links`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipette_cp.checker.checks import tp_ring_order
from pipette_cp.cost.evaluator.expert_groups import expert_rings_apart
from pipette_cp.cost.network.nccl_rings import nccl_rings
from pipette_cp.cost.network.parallel_groups import group_flows
from pipette_cp.cost.network.tp_rings import ring_links
from pipette_cp.specs import Instance, Plan


@dataclass(frozen=True)
class ChargedRing:
    """One communicator's ring: ``kind`` (``dp``, ``expert-dp`` or ``tp``), its stage,
    its index among the stage's rings of that kind, and its GPUs in ring order."""

    kind: str
    stage: int
    index: int
    gpus: tuple[int, ...]

    def links(self) -> list[tuple[int, int]]:
        """Its directed links ``gpu -> next gpu`` (none for one GPU)."""
        return ring_links(self.gpus)


def charged_rings(instance: Instance, plan: Plan) -> list[ChargedRing]:
    """Every ring of ``plan`` of two or more GPUs, as the Evaluator charges it."""
    cluster = instance.cluster
    node_of = np.arange(cluster.num_gpus) // cluster.gpus_per_node
    out: list[ChargedRing] = []
    if plan.replicas > 1:
        for s in range(plan.pp):
            ranked = np.array([[plan.unit_gpus(s, d)[t] for d in range(plan.replicas)]
                               for t in range(plan.tp)])  # fmt: skip
            for t, ring in enumerate(nccl_rings(ranked, node_of)):
                out.append(ChargedRing("dp", s, t, tuple(int(g) for g in ring)))
    if plan.expert_dp > 1 and instance.model.is_moe and expert_rings_apart(plan):
        flat = np.array([g for unit in plan.placement for g in unit])
        rings = nccl_rings(flat[group_flows(plan).edp_rings], node_of)
        per_stage = len(rings) // plan.pp
        for k, ring in enumerate(rings):
            s, i = divmod(k, per_stage)
            out.append(ChargedRing("expert-dp", s, i, tuple(int(g) for g in ring)))
    if plan.tp > 1:
        for k, unit in enumerate(plan.placement):
            stage, replica = divmod(k, plan.replicas)
            out.append(ChargedRing("tp", stage, replica, tp_ring_order(unit, cluster.links)))
    return out


def failed_ring_links(instance: Instance, rings: list[ChargedRing]) -> list[tuple[int, int]]:
    """The links of ``rings`` over failed GPU pairs (none for a plan that runs)."""
    ends = np.array([link for r in rings for link in r.links()], dtype=np.int64).reshape(-1, 2)
    bad = instance.cluster.pair_failed(ends[:, 0], ends[:, 1])
    return [(int(a), int(b)) for a, b in ends[bad]]
