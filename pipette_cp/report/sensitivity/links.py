"""The candidates and perturbations of :mod:`pipette_cp.report.sensitivity.analysis`: the links
a plan may send data over (:func:`plan_links`) and the cluster with some of its links
scaled (:func:`scaled_instance`, with the masks of a GPU pair and of a node's NIC and
NVLink).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipette_cp.checker import communication_pairs
from pipette_cp.errors import SpecError
from pipette_cp.specs import ClusterSpec, Instance, Plan


# ----------------------------------------------------------------- the links used
def plan_links(instance: Instance, plan: Plan) -> dict[tuple[int, int], tuple[str, ...]]:
    """Unordered GPU pairs ``(a, b)``, ``a < b``, the plan may send data over, and the
    traffic classes on each (pp, dp, tp, embedding).

    The checker's :func:`communication_pairs` (pipeline hops, DP and TP rings in
    NCCL's order, embedding pairs) plus, per DP group, the intra-node and inter-node
    rings of the two-level all-reduce (nodes in the order of their first replica, as
    in :func:`pipette_cp.cost.network.collectives.hierarchical_times_s`).
    """
    kinds: dict[tuple[int, int], set[str]] = {}

    def add(kind: str, a: int, b: int) -> None:
        if a != b:
            kinds.setdefault((min(a, b), max(a, b)), set()).add(kind)

    bandwidth = instance.cluster.matrix  # TP rings in NCCL's order
    tied, g = instance.model.tied_embeddings, instance.cluster.gpus_per_node
    for kind, pairs in communication_pairs(plan, tied, bandwidth, g).items():
        for a, b in pairs:
            add(kind, a, b)
    for s in range(plan.pp):
        for t in range(plan.tp):
            by_node: dict[int, list[int]] = {}  # nodes in the order of their first replica
            for gpu in (plan.unit_gpus(s, d)[t] for d in range(plan.replicas)):
                by_node.setdefault(gpu // g, []).append(gpu)
            blocks = list(by_node.values())
            if len({len(b) for b in blocks}) != 1:
                continue  # unequal local groups: the evaluator uses the ring only
            local = len(blocks[0])
            for i, block in enumerate(blocks):
                for j, gpu in enumerate(block):
                    add("dp", gpu, block[(j + 1) % local])
                    add("dp", gpu, blocks[(i + 1) % len(blocks)][j])
    order = ("pp", "dp", "tp", "embedding")
    return {pair: tuple(k for k in order if k in found) for pair, found in sorted(kinds.items())}


# ------------------------------------------------------------------ perturbations
def scaled_instance(instance: Instance, mask: np.ndarray, factor: float) -> Instance:
    """``instance`` with the bandwidth of the GPU pairs where ``mask`` is True multiplied
    by ``factor`` > 0 (a new cluster; the input is not touched).

    Scaling a valid matrix by a positive factor keeps every invariant the cluster
    validators check (finite, non-negative, zero diagonal, the same failed pairs),
    so the copy is valid without re-running them (they cost more than an evaluation).
    """
    if not factor > 0:
        raise SpecError("factor", factor, "must be positive (0 would fail the links)")
    cluster = instance.cluster
    matrix = np.where(mask, cluster.matrix * factor, cluster.matrix)
    matrix.flags.writeable = False
    scaled = cluster.model_copy(update={"bandwidth_bytes_per_s": matrix})
    return instance.model_copy(update={"cluster": scaled})


def pair_mask(n: int, pairs: Sequence[tuple[int, int]]) -> np.ndarray:
    """An ``n x n`` mask of ``pairs``, both directions."""
    mask = np.zeros((n, n), dtype=bool)
    for a, b in pairs:
        mask[a, b] = mask[b, a] = True
    return mask


def node_masks(cluster: ClusterSpec, node: int) -> tuple[np.ndarray, np.ndarray]:
    """(NIC mask: every link with exactly one end on ``node``, NVLink mask: inside it)."""
    inside = np.zeros(cluster.num_gpus, dtype=bool)
    inside[list(cluster.gpus_of_node(node))] = True
    nvlink = inside[:, None] & inside[None, :]
    nic = inside[:, None] ^ inside[None, :]
    return nic, nvlink
