"""What a layout implies before any cost: whether it can run, and where its transfers go.

:func:`validate_layout` = :func:`check_knobs` (everything but the placement:
the same answer for every placement of a layout, so a search checks it once
per layout) + :func:`check_placement`.  Messages are only formatted for a
failing check: the passing path is a few integer comparisons.
:func:`flow_template` lists every transfer of an iteration as positions in
the flat placement, so that a placement turns it into GPU pairs in one gather.
"""

from __future__ import annotations

from itertools import chain
from typing import Any, NamedTuple

import numpy as np

from pipette_cp.cost.compute.hybrid_work import check_hybrid_plan
from pipette_cp.cost.stack.attention_variants import check_attention_variants
from pipette_cp.errors import LayoutError
from pipette_cp.specs.instance import Instance
from pipette_cp.specs.knobs import Job, Phase, knob_rules, knobs_key
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.selection import excluded_nodes, usable_gpus

__all__ = [
    "FlowTemplate", "check_experts", "check_knobs", "check_placement", "flow_template",
    "knobs_key", "num_micro_batches", "placement_array", "validate_layout",
]  # fmt: skip


def placement_array(plan: Plan) -> np.ndarray:
    """The placement as a (pp, dp * cp, tp) integer array: ``[stage, replica, tp_rank]``."""
    flat = np.fromiter(chain.from_iterable(plan.placement), dtype=np.int64)
    return flat.reshape(plan.pp, plan.replicas, plan.tp)


def num_micro_batches(instance: Instance, plan: Plan) -> int:
    """Micro-batches per iteration per pipeline: ``global_batch / (dp * micro_batch)``."""
    return instance.training.global_batch_size // (plan.dp * plan.micro_batch_size)


def check_knobs(instance: Instance, plan: Plan) -> None:
    """Raise :class:`LayoutError` for the first failing check that ignores the placement.

    In order: context parallelism (2 cp dividing the sequence), then the knobs' rules of
    :attr:`~pipette_cp.specs.knobs.Phase.CONTEXT`; expert parallelism
    (:func:`check_experts`), then the knobs' rules for experts; the attention variants'
    kernels (:func:`~pipette_cp.cost.stack.attention_variants.check_attention_variants`);
    tp within a node (beyond a node: a multiple of gpus_per_node dividing the GPUs of an
    NVLink domain) and dividing the attention and key/value heads; dp * pp * tp GPUs; the
    knobs' batch rules (dp * micro-batch dividing the global batch); the layer split; the
    knobs' schedule rules (interleaving: pp > 1 dividing the micro-batches as Megatron
    requires; sharding).  The knobs' rules are declared with them
    (:data:`pipette_cp.specs.knobs.KNOBS`).
    """
    model, cluster, training = instance.model, instance.cluster, instance.training
    dp, pp, tp = plan.dp, plan.pp, plan.tp
    g, n, used = cluster.gpus_per_node, cluster.num_gpus, plan.num_gpus
    heads, kv = model.num_attention_heads, model.kv_heads
    product = f"dp={dp} x pp={pp} x tp={tp}" + (f" x cp={plan.cp}" if plan.cp > 1 else "")
    job = Job(model, training, instance.search_space)
    cp, seq = plan.cp, training.seq_length
    if cp > 1 and seq % (2 * cp):
        raise LayoutError("plan.cp", cp, f"cp={cp}: 2 x cp = {2 * cp} must divide "
                          f"seq_length={seq} (load-balanced causal chunks)")  # fmt: skip
    _knob_rules(Phase.CONTEXT, job, plan)
    check_experts(model, plan)
    _knob_rules(Phase.EXPERT_STATE, job, plan)
    _knob_rules(Phase.EXPERT_TENSOR, job, plan)
    # latent attention, sliding windows, sinks, multi-token prediction: what the stack runs
    check_attention_variants(model, training, plan, cluster.gpu_types.values())
    check_hybrid_plan(model, training, plan)  # a hybrid model's sublayers: what is priced
    if tp > g:
        _check_wide_tp(cluster, tp)
    if heads % tp:
        raise LayoutError("plan.tp", tp, f"tp={tp} must divide num_attention_heads={heads}")
    if kv % tp:
        raise LayoutError("plan.tp", tp, f"tp={tp} must divide num_kv_heads={kv}")
    if used > n:
        raise LayoutError("plan.dp*pp*tp", used,
                          f"{product} = {used} GPUs, but the cluster has {n} GPUs")  # fmt: skip
    usable = usable_gpus(cluster, instance.search_space)
    if used != usable if instance.search_space.use_all_gpus else used > usable:
        raise LayoutError("plan.dp*pp*tp", used,
                          f"{product} = {used} GPUs, but the nodes not excluded "
                          f"have {usable} GPUs" + (" (use_all_gpus: true)" if used < usable else ""))  # fmt: skip
    _knob_rules(Phase.BATCH, job, plan)
    if (layers := sum(plan.layer_split)) != model.num_layers:
        raise LayoutError("plan.layer_split", plan.layer_split,
                          f"sums to {layers} layers, expected num_layers={model.num_layers}")  # fmt: skip
    _knob_rules(Phase.SCHEDULE, job, plan)


def _knob_rules(phase: Phase, job: Job, plan: Plan) -> None:
    for rule in knob_rules(phase):
        rule.check(job, plan)


def check_experts(model: Any, plan: Plan) -> None:
    """Megatron-Core's rules for expert parallelism.

    A dense model has no experts (ep = 1, etp unset or tp); for a mixture-of-experts
    model ep divides num_experts, etp the expert FFN size, and ep x etp the stage's
    tp x cp x dp ranks.  (Context parallelism's: 2 cp dividing the sequence, so that it
    splits into 2 cp load-balanced causal chunks, in :func:`check_knobs`.)
    """
    tp, cp = plan.tp, plan.cp
    if not model.is_moe:
        if plan.ep > 1:
            raise LayoutError("plan.ep", plan.ep, "expert parallelism needs a mixture-of-experts "
                              "model (model.num_experts)")  # fmt: skip
        if plan.etp is not None and plan.etp != tp:
            raise LayoutError("plan.etp", plan.etp, "expert tensor parallelism needs a "
                              "mixture-of-experts model (model.num_experts)")  # fmt: skip
        return
    experts, etp = model.num_experts, plan.expert_tp
    if experts % plan.ep:
        raise LayoutError("plan.ep", plan.ep, f"ep={plan.ep} must divide num_experts={experts}")
    if (ffn := model.expert_width) % etp:
        raise LayoutError("plan.etp", etp, f"etp={etp} must divide the expert FFN size {ffn}")
    if plan.expert_dp == 0:
        ranks = tp * cp * plan.dp
        raise LayoutError("plan.ep", plan.ep, f"ep={plan.ep} x etp={etp} must divide the "
                          f"tp x cp x dp = {ranks} ranks of a pipeline stage")  # fmt: skip


def _check_wide_tp(cluster: Any, tp: int) -> None:
    """A tensor group wider than a node: whole nodes of one NVLink domain."""
    g, per, domain = cluster.gpus_per_node, cluster.nodes_per_nvlink_domain, cluster.gpus_per_domain
    if per == 1:
        raise LayoutError("plan.tp", tp, f"tp={tp} exceeds gpus_per_node={g}")
    if tp > domain:
        raise LayoutError("plan.tp", tp, f"tp={tp} exceeds the {domain} GPUs of an NVLink domain "
                          f"(nodes_per_nvlink_domain={per} x gpus_per_node={g})")  # fmt: skip
    if tp % g or domain % tp:
        raise LayoutError("plan.tp", tp, f"tp={tp} > gpus_per_node={g} must be a multiple of it "
                          f"dividing the {domain} GPUs of an NVLink domain")  # fmt: skip


def check_placement(instance: Instance, plan: Plan, gpus: np.ndarray) -> None:
    """Raise :class:`LayoutError` unless every GPU id is in range, used once, and every
    unit sits inside one node, or one NVLink domain where domains span several nodes
    (``gpus``: :func:`placement_array`)."""
    g, n, tp = instance.cluster.gpus_per_node, instance.cluster.num_gpus, plan.tp
    units = gpus.reshape(-1, tp)
    flat = units.ravel()
    if flat.min() < 0 or flat.max() >= n:
        where = int(np.argmax((flat < 0) | (flat >= n)))
        raise LayoutError(
            f"plan.placement[{where // tp}]", int(flat[where]), f"GPU id outside 0..{n - 1}"
        )
    counts = np.bincount(flat, minlength=n)
    if counts.max() > 1:
        gpu = int(np.argmax(counts > 1))
        users = [i for i, unit in enumerate(plan.placement) if gpu in unit]
        raise LayoutError(
            "plan.placement", gpu, f"GPU {gpu} is used by units {users[0]} and {users[-1]}"
        )
    if excluded := excluded_nodes(instance.cluster, instance.search_space):
        on = np.isin(flat // g, excluded)
        if on.any():
            where = int(np.argmax(on))
            name = instance.cluster.node_names[int(flat[where]) // g]
            raise LayoutError(
                f"plan.placement[{where // tp}]", int(flat[where]),
                f"GPU {int(flat[where])} is on node {name}, which search_space.exclude_nodes excludes",
            )  # fmt: skip
    if tp == 1:
        return
    per = instance.cluster.nodes_per_nvlink_domain
    nodes = units // (g * per)
    if (spans := nodes != nodes[:, :1]).any():
        spans = spans.any(axis=1)
        u = int(np.argmax(spans))
        found = sorted({int(x) for x in nodes[u]})
        raise LayoutError(
            f"plan.placement[{u}]",
            plan.placement[u],
            f"the tp={tp} ranks of unit {u} span nodes {found}; a unit must sit in one node"
            if per == 1
            else f"the tp={tp} ranks of unit {u} span NVLink domains {found} "
            f"(nodes_per_nvlink_domain={per}); a unit must sit in one NVLink domain",
        )


def validate_layout(instance: Instance, plan: Plan, gpus: np.ndarray | None = None) -> None:
    """Raise :class:`LayoutError` if ``plan`` cannot run this model on this cluster.

    Checks, in order: :func:`check_knobs` (context and expert parallelism; tp within a
    node and dividing the attention and key/value heads; dp * pp * tp GPUs; dp *
    micro-batch dividing the global batch; the layer split; interleaving and sharding);
    the placement (ids in range, no GPU
    twice, each unit inside one node, or one NVLink domain).  ``gpus`` is :func:`placement_array`
    if already computed.  Example message:
    ``plan.tp=3: tp=3 must divide num_attention_heads=8``.
    """
    check_knobs(instance, plan)
    check_placement(instance, plan, placement_array(plan) if gpus is None else gpus)


class FlowTemplate(NamedTuple):
    """Every transfer of an iteration as positions in the flat placement (see
    :func:`flow_template`)."""

    src: np.ndarray
    dst: np.ndarray
    offset: np.ndarray  # concurrency group x num_nodes: the NIC-sharing key offset
    size: int  # number of NIC-sharing keys
    bounds: tuple[int, int, int]  # start of the rings, start of the pairs, end
    last: int  # hops per direction
    ring_pos: np.ndarray  # (pp * tp, dp) DP rings
    parts: tuple[tuple[str, int, int], ...]  # (operation, start, end) for error messages


def flow_template(pp: int, dp: int, tp: int, vpp: int, tied: bool, num_nodes: int) -> FlowTemplate:
    """Hops s -> s+1 and back (a concurrency group per hop and direction), all DP rings
    (one group: they overlap at the end) and the tied-embedding pairs (a group per
    direction).  The TP rings inside the units are not NIC flows: their order is
    NCCL's (:mod:`pipette_cp.cost.network.tp_rings`), not a fixed template."""
    pos = np.arange(pp * dp * tp).reshape(pp, dp, tp)
    last = pp if vpp > 1 else pp - 1  # interleaving adds the hop from the last stage to 0
    here, nxt = pos[:last], np.concatenate((pos[1:], pos[:1]))[:last]
    rings = pos.transpose(0, 2, 1).reshape(pp * tp, dp)
    # ring links in (link, ring) order: per-ring reductions then run over long columns
    ring_src, ring_dst = rings.T[:0], rings.T[:0]
    if dp > 1:
        ring_src, ring_dst = rings.T, np.concatenate((rings[:, 1:], rings[:, :1]), axis=1).T
    first, final = (pos[0].ravel(), pos[-1].ravel()) if tied else (pos[:0, 0, 0],) * 2
    hop = np.broadcast_to(np.arange(last)[:, None, None], here.shape)
    chunks: list[tuple[str, np.ndarray, np.ndarray, Any]] = [
        ("a pipeline hop (activations)", here, nxt, hop),
        ("a pipeline hop (gradients)", nxt, here, pp + hop),
        ("a data-parallel gradient sync", ring_src, ring_dst, 2 * pp),
        ("the tied-embedding gradient all-reduce", first, final, 2 * pp + 1),
        ("the tied-embedding gradient all-reduce", final, first, 2 * pp + 2),
    ]
    ends = np.cumsum([0] + [c[1].size for c in chunks]).tolist()
    src = np.concatenate([c[1].ravel() for c in chunks])
    dst = np.concatenate([c[2].ravel() for c in chunks])
    group = np.concatenate([np.broadcast_to(c[3], c[1].shape).ravel() for c in chunks])
    parts = tuple((c[0], ends[i], ends[i + 1]) for i, c in enumerate(chunks))
    out = FlowTemplate(src, dst, group * num_nodes, (2 * pp + 3) * num_nodes,
                       (ends[2], ends[3], ends[5]), last, rings, parts)  # fmt: skip
    for a in (out.src, out.dst, out.offset, out.ring_pos):
        a.flags.writeable = False
    return out
