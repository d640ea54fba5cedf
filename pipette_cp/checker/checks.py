"""The constraint families every plan must satisfy, checked independently of any solver.

The family names are the ``check`` of the masters' hard families
(:mod:`pipette_cp.solvers.placement.families`, :mod:`pipette_cp.solvers.split.families`),
so a violated family points at the model rows that should have prevented it.  The
checker sits below the solvers and keeps its own list (:data:`CHECKS`); the tests pin
that the two lists name the same families.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.cost.memory.peak import memory_by_stage, usable_memory_bytes
from pipette_cp.cost.network.nccl_rings import nccl_rings
from pipette_cp.cost.network.tp_rings import best_ring, ring_links
from pipette_cp.errors import InfeasibleError, PipetteError
from pipette_cp.specs import Instance, Plan


@dataclass(frozen=True)
class Violation:
    """One broken constraint: its family and a message naming the numbers."""

    family: str
    message: str

    def __str__(self) -> str:
        return f"{self.family}: {self.message}"


def check_split_covers_layers(instance: Instance, plan: Plan) -> list[Violation]:
    """Every transformer layer is in exactly one model chunk, every chunk has >= 1 layer."""
    found: list[Violation] = []
    total = sum(plan.layer_split)
    if total != instance.model.num_layers:
        found.append(
            Violation(
                "split_covers_layers",
                f"layer_split sums to {total}, the model has {instance.model.num_layers} layers",
            )
        )
    empty = [v for v, n in enumerate(plan.layer_split) if n < 1]
    if empty:
        found.append(Violation("split_covers_layers", f"model chunks {empty} hold no layer"))
    return found


def check_split_contiguous(instance: Instance, plan: Plan) -> list[Violation]:
    """Chunks hold contiguous layer ranges in virtual-stage order.

    A split is stored as counts per virtual stage, so contiguity holds by
    construction; this check pins that representation (a permuted or
    non-integer split could not be stored)."""
    del instance
    bad = [n for n in plan.layer_split if int(n) != n]
    return [Violation("split_contiguous", f"non-integer chunk sizes {bad}")] if bad else []


def check_placement_bijection(instance: Instance, plan: Plan) -> list[Violation]:
    """Every rank on a distinct, existing GPU."""
    gpus = [g for unit in plan.placement for g in unit]
    n = instance.cluster.num_gpus
    found: list[Violation] = []
    outside = sorted({g for g in gpus if not 0 <= g < n})
    if outside:
        found.append(
            Violation("placement_bijection", f"GPUs {outside[:8]} do not exist (cluster has {n})")
        )
    twice = sorted(g for g, count in Counter(gpus).items() if count > 1)
    if twice:
        found.append(Violation("placement_bijection", f"GPUs {twice[:8]} hold more than one rank"))
    return found


def check_tp_within_node(instance: Instance, plan: Plan) -> list[Violation]:
    """The tp ranks of every unit share one NVLink domain (a node, or the trays of one
    NVLink-switch rack): tensor parallelism needs NVLink."""
    cluster = instance.cluster
    found = []
    for u, unit in enumerate(plan.placement):
        domains = {cluster.domain_of(g) for g in unit if 0 <= g < cluster.num_gpus}
        if len(domains) > 1:
            stage, replica = divmod(u, plan.replicas)
            where = "nodes" if cluster.nodes_per_nvlink_domain == 1 else "NVLink domains"
            spanned = sorted(domains)
            found.append(
                Violation(
                    "tp_within_node",
                    f"unit stage {stage} replica {replica} spans {where} {spanned}",
                )
            )
    return found


def communication_pairs(
    plan: Plan, tied_embeddings: bool, bandwidth: np.ndarray | None = None,
    gpus_per_node: int = 0,
) -> dict[str, set[tuple[int, int]]]:  # fmt: skip
    """Ordered GPU pairs that exchange data, by traffic class.

    pp: tp rank t of stage s to tp rank t of stage s+1 of the same replica, both
    directions (activations forward, gradients back); with interleaving the last
    stage also feeds stage 0 (next model chunk).  dp: the ring of each stage and
    tp rank over the replicas (dp x cp of them), both directions, as NCCL builds it from
    replica order (given ``gpus_per_node``: nodes in the order of their first replica,
    :func:`~pipette_cp.cost.network.nccl_rings.nccl_rings`; replica order without).  tp: the links
    ``u -> next(u)`` of the ring inside each unit, in rank order or, given the GPU x
    GPU ``bandwidth``, in the order NCCL picks (:func:`~pipette_cp.cost.network.tp_rings.best_ring`:
    the ring the Evaluator charges).  embedding: first and last stage of a replica
    (tied embeddings, pp > 1).  cp and ep: see :func:`_group_pairs`."""
    pairs: dict[str, set[tuple[int, int]]] = {
        "pp": set(),
        "dp": set(),
        "tp": set(),
        "embedding": set(),
        "cp": set(),
        "ep": set(),
    }

    def both(kind: str, a: int, b: int) -> None:
        if a != b:
            pairs[kind].update({(a, b), (b, a)})

    hops = [(s, s + 1) for s in range(plan.pp - 1)]
    if plan.vpp > 1 and plan.pp > 1:
        hops.append((plan.pp - 1, 0))
    for d in range(plan.replicas):
        for s, nxt in hops:
            for a, b in zip(plan.unit_gpus(s, d), plan.unit_gpus(nxt, d), strict=True):
                both("pp", a, b)
        if tied_embeddings and plan.pp > 1:
            for a, b in zip(plan.unit_gpus(0, d), plan.unit_gpus(plan.pp - 1, d), strict=True):
                both("embedding", a, b)
    for s in range(plan.pp):
        for t in range(plan.tp):
            ring = _dp_ring([plan.unit_gpus(s, d)[t] for d in range(plan.replicas)], gpus_per_node)
            for i, a in enumerate(ring):
                both("dp", a, ring[(i + 1) % len(ring)])
    for unit in plan.placement:
        pairs["tp"].update((a, b) for a, b in ring_links(tp_ring_order(unit, bandwidth)) if a != b)
    _group_pairs(plan, pairs)
    return pairs


def _group_pairs(plan: Plan, pairs: dict[str, set[tuple[int, int]]]) -> None:
    """cp: the ring over the context-parallel ranks of each (stage, dp rank, tp rank);
    ep: every pair of an expert-parallel group.  Both from Megatron's rank formulas:
    stage-local rank ``t + tp (c + cp d)`` (dense), ``e_t + etp (e + ep e_d)`` (experts)."""
    tp, cp, ep, etp = plan.tp, plan.cp, plan.ep, plan.expert_tp
    for s in range(plan.pp):
        local = [g for r in range(plan.replicas) for g in plan.unit_gpus(s, r)]
        if cp > 1:
            for d in range(plan.dp):
                for t in range(tp):
                    ring = [local[t + tp * (c + cp * d)] for c in range(cp)]
                    pairs["cp"].update(
                        (a, ring[(i + 1) % cp])
                        for i, a in enumerate(ring)
                        if a != ring[(i + 1) % cp]
                    )
        if ep > 1 and len(local) % (ep * etp) == 0:
            groups: dict[tuple[int, int], list[int]] = {}
            for rank, gpu in enumerate(local):
                e_d, rest = divmod(rank, ep * etp)
                e_t = rest % etp  # the expert-parallel rank (rest // etp) varies in a group
                groups.setdefault((e_t, e_d), []).append(gpu)
            for members in groups.values():
                pairs["ep"].update((a, b) for a in members for b in members if a != b)


def _dp_ring(ranked: list[int], gpus_per_node: int) -> list[int]:
    """A DP group's GPUs (in rank order) in the order of NCCL's ring."""
    if gpus_per_node < 1 or min(ranked) < 0:
        return ranked
    ids = np.asarray(ranked)[None, :]
    return nccl_rings(ids, np.arange(int(ids.max()) + 1) // gpus_per_node)[0].tolist()


def tp_ring_order(unit: tuple[int, ...], bandwidth: np.ndarray | None) -> tuple[int, ...]:
    """The unit's GPUs in ring order (rank order without ``bandwidth`` or valid ids)."""
    if bandwidth is None or not all(0 <= g < len(bandwidth) for g in unit):
        return unit
    ids = np.asarray(unit)
    order, _ = best_ring(bandwidth[ids[:, None], ids[None, :]])
    return tuple(unit[i] for i in order)


def check_no_failed_link(instance: Instance, plan: Plan) -> list[Violation]:
    """No traffic over a failed (zero-bandwidth) GPU pair (TP rings in NCCL's order:
    a unit is fine while some ring of its GPUs avoids failed pairs)."""
    cluster = instance.cluster
    n = cluster.num_gpus
    found = []
    tied, bandwidth = instance.model.tied_embeddings, cluster.links
    for kind, pairs in communication_pairs(plan, tied, bandwidth, cluster.gpus_per_node).items():
        ends = np.array(sorted((a, b) for a, b in pairs if 0 <= a < n and 0 <= b < n),
                        dtype=np.int64).reshape(-1, 2)  # fmt: skip
        hit = cluster.pair_failed(ends[:, 0], ends[:, 1])
        bad = [(int(a), int(b)) for a, b in ends[hit]]
        if bad and kind == "dp" and _two_level_avoids(instance, plan):
            continue  # NCCL's two-level all-reduce runs without those pairs (as the Evaluator)
        if bad:
            found.append(
                Violation("no_failed_link", f"{kind} traffic over failed GPU pairs {bad[:6]}")
            )
    return found


def _two_level_avoids(instance: Instance, plan: Plan) -> bool:
    """Whether the Evaluator runs the plan's DP syncs without a failed pair (the
    two-level all-reduce where the replica-order ring crosses one)."""
    try:
        Evaluator(instance, validate=False).iteration_time(plan)
    except PipetteError:
        return False
    return True


def check_memory_limit(instance: Instance, plan: Plan) -> list[Violation]:
    """Every GPU's memory bound (peak + calibrated margin) within the usable memory of its type."""
    cluster, training = instance.cluster, instance.training
    found = []
    for stage, breakdown in enumerate(memory_by_stage(instance.model, instance.training, plan)):
        gpus = [
            g
            for d in range(plan.replicas)
            for g in plan.unit_gpus(stage, d)
            if 0 <= g < cluster.num_gpus
        ]
        types = {cluster.gpu_of_node(cluster.node_of(g)) for g in gpus}
        smallest = min(types, key=usable_memory_bytes)
        limit = usable_memory_bytes(smallest, training)
        if breakdown.bound_bytes > limit:
            found.append(
                Violation(
                    "memory_limit",
                    f"stage {stage} needs up to {breakdown.bound_bytes / 1e9:.2f} GB per GPU, "
                    f"{smallest.name} has {limit / 1e9:.2f} GB usable",
                )
            )
    return found


#: Every family, in the order a user should fix them.
CHECKS: dict[str, Callable[[Instance, Plan], list[Violation]]] = {
    "split_covers_layers": check_split_covers_layers,
    "split_contiguous": check_split_contiguous,
    "placement_bijection": check_placement_bijection,
    "tp_within_node": check_tp_within_node,
    "no_failed_link": check_no_failed_link,
    "memory_limit": check_memory_limit,
}


def check_plan(instance: Instance, plan: Plan) -> list[Violation]:
    """All violations of ``plan`` on ``instance`` (empty when valid)."""
    found: list[Violation] = []
    for check in CHECKS.values():
        found.extend(check(instance, plan))
    return found


def assert_valid(instance: Instance, plan: Plan) -> None:
    """Raise :class:`InfeasibleError` listing the violations, if any."""
    found = check_plan(instance, plan)
    if found:
        raise InfeasibleError("; ".join(str(v) for v in found))
