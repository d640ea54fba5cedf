"""Evaluate a plan: validate it, then predict iteration time, throughput, MFU and memory.

:class:`Evaluator` keeps what depends only on the instance (the cluster's
arrays) and caches what depends on the plan's knobs but not its placement
(chunk times, memory, optimizer time, flow templates), so a search that tries
thousands of placements pays only for one gather of every transfer of the
iteration.  :func:`evaluate` and :func:`simulate` are one-shot conveniences.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from itertools import chain
from typing import Any, Literal

import numpy as np

from pipette_cp.cost import comm
from pipette_cp.cost.compute import (
    chunk_times,
    hardware_flops_per_iteration,
    model_flops_per_iteration,
    optimizer_step_time_s,
)
from pipette_cp.cost.memory import (
    memory_by_stage,
    padded_vocab_size,
    stage_params_per_gpu,
    usable_memory_bytes,
)
from pipette_cp.cost.pipeline import PipelineInputs, finish_iteration, pipeline_times
from pipette_cp.cost.profile import LayerProfile
from pipette_cp.cost.simulator import Timeline, simulate_pipeline
from pipette_cp.cost.simulator import simulate as simulate_inputs
from pipette_cp.errors import InfeasibleError, LayoutError
from pipette_cp.specs.instance import Instance
from pipette_cp.specs.plan import Evaluation, Plan
from pipette_cp.units import BYTES_PER_ELEMENT, TFLOPS

Predictor = Literal["analytic", "simulator"]

#: Keys of ``Evaluation.breakdown_s``; they sum to the iteration time.
BREAKDOWN_KEYS = ("compute", "bubble", "pp_comm", "dp_comm", "tp_comm", "optimizer")


# ------------------------------------------------------------------ validation
def placement_array(plan: Plan) -> np.ndarray:
    """The placement as a (pp, dp, tp) integer array: ``[stage, replica, tp_rank]``."""
    flat = np.fromiter(chain.from_iterable(plan.placement), dtype=np.int64)
    return flat.reshape(plan.pp, plan.dp, plan.tp)


def num_micro_batches(instance: Instance, plan: Plan) -> int:
    """Micro-batches per iteration per pipeline: ``global_batch / (dp * micro_batch)``."""
    return instance.training.global_batch_size // (plan.dp * plan.micro_batch_size)


def validate_layout(instance: Instance, plan: Plan, gpus: np.ndarray | None = None) -> None:
    """Raise :class:`LayoutError` if ``plan`` cannot run this model on this cluster.

    Checks, in order: dense model; tp within a node and dividing the attention
    and key/value heads; dp * pp * tp GPUs; dp * micro-batch dividing the
    global batch; the layer split; interleaving (pp > 1, pp dividing the
    micro-batches as Megatron requires); the placement (ids in range, no GPU
    twice, each unit inside one node).  ``gpus`` is :func:`placement_array`
    if already computed.  Example message:
    ``plan.tp=3: tp=3 must divide num_attention_heads=8``.
    """
    model, cluster, training = instance.model, instance.cluster, instance.training
    dp, pp, tp, mb, vpp = plan.dp, plan.pp, plan.tp, plan.micro_batch_size, plan.vpp
    g, n, used = cluster.gpus_per_node, cluster.num_gpus, plan.num_gpus
    gbs = training.global_batch_size
    layers, m = sum(plan.layer_split), training.global_batch_size // (dp * mb)
    all_gpus = instance.search_space.use_all_gpus
    checks = (
        (model.is_moe, "model.num_experts", model.num_experts,
         f"num_experts={model.num_experts}: mixture-of-experts models are not modelled"),
        (tp > g, "plan.tp", tp, f"tp={tp} exceeds gpus_per_node={g}"),
        (model.num_attention_heads % tp, "plan.tp", tp,
         f"tp={tp} must divide num_attention_heads={model.num_attention_heads}"),
        (model.kv_heads % tp, "plan.tp", tp, f"tp={tp} must divide num_kv_heads={model.kv_heads}"),
        (used != n if all_gpus else used > n, "plan.dp*pp*tp", used,
         f"dp={dp} x pp={pp} x tp={tp} = {used} GPUs, but the cluster has {n} GPUs"),
        (gbs % (dp * mb), "plan.micro_batch_size", mb,
         f"dp={dp} x micro_batch_size={mb} = {dp * mb} must divide global_batch_size={gbs}"),
        (layers != model.num_layers, "plan.layer_split", plan.layer_split,
         f"sums to {layers} layers, expected num_layers={model.num_layers}"),
        (vpp > 1 and pp == 1, "plan.vpp", vpp, f"vpp={vpp} > 1 needs pp > 1, got pp=1"),
        (vpp > 1 and m % pp, "plan.vpp", vpp,
         f"vpp={vpp}: interleaving needs pp={pp} to divide the {m} micro-batches (Megatron)"),
    )  # fmt: skip
    for failed, field, value, expected in checks:
        if failed:
            raise LayoutError(field, value, expected)
    units = (placement_array(plan) if gpus is None else gpus).reshape(-1, tp)
    flat = units.ravel()
    if (outside := (flat < 0) | (flat >= n)).any():
        where = int(np.argmax(outside))
        raise LayoutError(
            f"plan.placement[{where // tp}]", int(flat[where]), f"GPU id outside 0..{n - 1}"
        )
    counts = np.bincount(flat, minlength=n)
    if (counts > 1).any():
        gpu = int(np.argmax(counts > 1))
        users = [i for i, unit in enumerate(plan.placement) if gpu in unit]
        raise LayoutError(
            "plan.placement", gpu, f"GPU {gpu} is used by units {users[0]} and {users[-1]}"
        )
    nodes = units // g
    spans = (nodes != nodes[:, :1]).any(axis=1)
    if spans.any():
        u = int(np.argmax(spans))
        found = sorted({int(x) for x in nodes[u]})
        raise LayoutError(
            f"plan.placement[{u}]",
            plan.placement[u],
            f"the tp={tp} ranks of unit {u} span nodes {found}; a unit must sit in one node",
        )


# ------------------------------------------------------------------ evaluation
def _knobs(plan: Plan) -> tuple:
    """Everything of a plan but its placement (the cache key of placement-free costs)."""
    return (
        plan.dp, plan.pp, plan.tp, plan.micro_batch_size, plan.vpp, plan.sequence_parallel,
        plan.recompute, plan.distributed_optimizer, plan.flash_attention, plan.layer_split,
    )  # fmt: skip


def _flows(pp: int, dp: int, tp: int, vpp: int, tied: bool) -> tuple:
    """Every transfer of an iteration as positions in the flat placement: hops s -> s+1
    and back (a concurrency group per hop and direction), all DP rings (one group: they
    overlap at the end), the tied-embedding pairs (a group per direction).  Returns
    (src, dst, group, (start of rings, start of pairs, end), hops per direction, ring
    positions, ((operation, start, end), ...) for error messages)."""
    pos = np.arange(pp * dp * tp).reshape(pp, dp, tp)
    last = pp if vpp > 1 else pp - 1  # interleaving adds the hop from the last stage to 0
    here, nxt = pos[:last], np.concatenate((pos[1:], pos[:1]))[:last]
    rings = pos.transpose(0, 2, 1).reshape(pp * tp, dp)
    ring_next = np.concatenate((rings[:, 1:], rings[:, :1]), axis=1) if dp > 1 else rings[:, :0]
    first, final = (pos[0].ravel(), pos[-1].ravel()) if tied else (pos[:0, 0, 0],) * 2
    hop = np.broadcast_to(np.arange(last)[:, None, None], here.shape)
    chunks: list[tuple[str, np.ndarray, np.ndarray, Any]] = [
        ("a pipeline hop (activations)", here, nxt, hop),
        ("a pipeline hop (gradients)", nxt, here, pp + hop),
        ("a data-parallel gradient sync", rings[:, : ring_next.shape[1]], ring_next, 2 * pp),
        ("the tied-embedding gradient all-reduce", first, final, 2 * pp + 1),
        ("the tied-embedding gradient all-reduce", final, first, 2 * pp + 2),
    ]
    ends = np.cumsum([0] + [c[1].size for c in chunks]).tolist()
    src = np.concatenate([c[1].ravel() for c in chunks])
    dst = np.concatenate([c[2].ravel() for c in chunks])
    group = np.concatenate([np.broadcast_to(c[3], c[1].shape).ravel() for c in chunks])
    parts = tuple((c[0], ends[i], ends[i + 1]) for i, c in enumerate(chunks))
    return src, dst, group, (ends[2], ends[3], ends[5]), last, rings, parts


class Evaluator:
    """Evaluate many plans of one instance fast.

    ``profile``: measured per-layer times (:mod:`pipette_cp.cost.profile`).
    ``dp_algorithm``: ``"ring"`` (in replica order), ``"hierarchical"`` or ``"best"``
    (the faster per group, as NCCL's tuner picks; with one GPU of a group per node
    they coincide and only the ring is costed).  ``validate``: whether
    :meth:`evaluate` calls :func:`validate_layout` first.
    """

    def __init__(
        self, instance: Instance, *, profile: LayerProfile | None = None,
        dp_algorithm: comm.Algorithm = "best", validate: bool = True,
    ) -> None:  # fmt: skip
        cluster = instance.cluster
        self.instance, self.profile, self.validate = instance, profile, validate
        self.dp_algorithm: comm.Algorithm = dp_algorithm
        self.fabric = comm.Fabric.from_cluster(cluster)
        node_gpu = [cluster.gpu_of_node(i) for i in range(cluster.num_nodes)]
        self._gpu_of_gpu = [node_gpu[i // cluster.gpus_per_node] for i in range(cluster.num_gpus)]
        self._peak = np.array([gpu.peak_flops_per_s for gpu in self._gpu_of_gpu])
        self._usable = np.array([usable_memory_bytes(gpu) for gpu in self._gpu_of_gpu])
        self._model_flops = model_flops_per_iteration(instance.model, instance.training)
        self._cache: dict[tuple, object] = {}

    def _cached(self, key: tuple, make: Callable[[], Any]) -> Any:
        if key not in self._cache:
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[key] = make()
        return self._cache[key]

    def _stage_times(self, plan: Plan, key: tuple, stage_gpu: list, stage_bw: np.ndarray) -> Any:
        """(forward, backward, TP comm) per virtual stage: each stage's rows from the
        chunk times of its slowest GPU type at its slowest TP group's bandwidth."""
        inst, rows = self.instance, np.arange(plan.pp * plan.vpp) % plan.pp
        stage_keys = [(gpu.name, float(bw)) for gpu, bw in zip(stage_gpu, stage_bw, strict=True)]
        out = np.zeros((3, plan.pp * plan.vpp))
        for name, bw in set(stage_keys):
            args = (inst.model, inst.training, inst.cluster.gpu_types[name], plan, bw, self.profile)
            t = self._cached(("chunks", key, name, bw), partial(chunk_times, *args))
            times = np.stack(
                [t.forward_s, t.backward_s, t.tp_comm_forward_s + t.tp_comm_backward_s]
            )
            sel = np.array([k == (name, bw) for k in stage_keys])[rows]
            out[:, sel] = times[:, sel]
        return out

    def _per_stage(self, plan: Plan, key: tuple, stage_gpu: list) -> tuple[np.ndarray, np.ndarray]:
        """Parameters per GPU and optimizer-step time of every stage (cached)."""
        model, training = self.instance.model, self.instance.training
        return self._cached(
            ("stage", key, *(g.name for g in stage_gpu)),
            lambda: (
                np.array([stage_params_per_gpu(model, plan, s) for s in range(plan.pp)]),
                np.array([optimizer_step_time_s(model, training, g, plan, s) for s, g in enumerate(stage_gpu)]),
            ),
        )  # fmt: skip

    def _dp_times(self, plan: Plan, rings, bw, lat, params) -> tuple[np.ndarray, np.ndarray]:
        """Each stage's DP gradient sync and distributed-optimizer parameter gather.

        Megatron reduces the gradients in fp32 under bf16 (``arguments.py``):
        all-reduce, or with the distributed optimizer a reduce-scatter, then
        after the step an all-gather of the bf16 parameters (unless
        ``overlap_param_gather``).  All stages' rings run at once.
        """
        training, pp, tp, algorithm = self.instance.training, plan.pp, plan.tp, self.dp_algorithm
        elem = BYTES_PER_ELEMENT[training.precision]
        grad_bytes = 4.0 if training.precision == "bf16" else float(elem)
        sizes = np.repeat(params, tp)
        ops: list[tuple[comm.Collective, np.ndarray]] = [
            ("reduce_scatter" if plan.distributed_optimizer else "all_reduce", sizes * grad_bytes)
        ]
        if plan.distributed_optimizer and not training.overlap_param_gather:
            ops.append(("all_gather", sizes * elem))
        flat_ok = bool(bw.all())
        two_level = algorithm != "ring" and comm.local_group_size(self.fabric, rings) > 1
        what = "a data-parallel gradient sync"
        out = [np.zeros(pp), np.zeros(pp)]
        for i, (op, size) in enumerate(ops):
            if not flat_ok:  # the ring needs a failed link: another algorithm, or an error
                t = comm.collective_times_s(self.fabric, rings, size, op, algorithm, what)
            else:
                t = comm.ring_time_from_links(bw, lat, size, op)
                if two_level:
                    try:  # "hierarchical" keeps the ring only where local groups differ
                        hier = comm.hierarchical_times_s(self.fabric, rings, size, op, what)
                        best = algorithm == "best"
                        t = np.minimum(t, hier) if best else np.where(hier < np.inf, hier, t)
                    except InfeasibleError:
                        pass  # the two-level links include a failed pair; the ring is fine
            out[i] = t.reshape(pp, tp).max(axis=1)
        return out[0], out[1]

    def pipeline_inputs(
        self, plan: Plan, gpus: np.ndarray | None = None
    ) -> tuple[PipelineInputs, np.ndarray]:
        """The schedule inputs of ``plan`` and the TP communication time per virtual stage
        (part of its forward + backward); :class:`~pipette_cp.errors.InfeasibleError`
        names the operation (hop, DP ring, TP group, embedding pair) of a failed link."""
        inst, fabric = self.instance, self.fabric
        model, training = inst.model, inst.training
        dp, pp, tp = plan.dp, plan.pp, plan.tp
        gpus = placement_array(plan) if gpus is None else gpus
        key = _knobs(plan)
        if tp > 1:  # tensor-parallel rings inside each unit: slowest link per stage
            succ = np.concatenate((gpus[:, :, 1:], gpus[:, :, :1]), axis=2)
            stage_bw = fabric.bandwidth[gpus, succ].min(axis=(1, 2))
            if not stage_bw.all():
                comm.check_links(fabric, gpus, succ, "a tensor-parallel group")
        else:
            stage_bw = np.zeros(pp)
        stage_gpu = [self._gpu_of_gpu[0]] * pp
        if len(inst.cluster.gpu_types) > 1:  # the slowest GPU type among each stage's GPUs
            by_stage = gpus.reshape(pp, -1)
            slowest = by_stage[np.arange(pp), self._peak[by_stage].argmin(axis=1)]
            stage_gpu = [self._gpu_of_gpu[int(g)] for g in slowest]
        fwd, bwd, tp_comm = self._stage_times(plan, key, stage_gpu, stage_bw)
        params, optimizer = self._per_stage(plan, key, stage_gpu)
        # every transfer of the iteration in one gather
        tied = model.tied_embeddings and pp > 1
        f = self._cached(
            ("flows", pp, dp, tp, plan.vpp, tied), partial(_flows, pp, dp, tp, plan.vpp, tied)
        )
        flat, (src, dst, group, (r0, e0, end), last, ring_pos, parts) = gpus.ravel(), f
        bw, lat = comm.concurrent_flows(fabric, flat[src], flat[dst], group, None)
        if not bw.all():
            for what, lo, hi in parts:  # a DP ring may still avoid it (two-level)
                if not what.startswith("a data-parallel") or self.dp_algorithm == "ring":
                    comm.check_links(fabric, flat[src[lo:hi]], flat[dst[lo:hi]], what)
        hops = np.zeros((2, pp))
        if last:
            # activation (= gradient) per tp rank: s b h, / tp with sequence parallelism
            # (Megatron get_tensor_shapes); point-to-point: latency + bytes / bandwidth
            elem = BYTES_PER_ELEMENT[training.precision]
            act = training.seq_length * plan.micro_batch_size * model.hidden_size * elem
            t = lat[:r0] + act / (tp if plan.sequence_parallel else 1) / bw[:r0]
            # a hop takes its slowest tp rank; the slowest DP replica sets the pipeline
            hops[:, :last] = t.reshape(2, last, dp * tp).max(axis=2)
        dp_sync = gather = np.zeros(pp)
        if dp > 1:
            shape = (pp * tp, dp)
            ring_bw, ring_lat = bw[r0:e0].reshape(shape), lat[r0:e0].reshape(shape)
            dp_sync, gather = self._dp_times(plan, flat[ring_pos], ring_bw, ring_lat, params)
        embedding = 0.0
        if tied:  # all-reduce of the word-embedding gradient between its two copies
            grad_bytes = 4.0 if training.precision == "bf16" else 2.0  # as _dp_times
            size = padded_vocab_size(model, tp) * model.hidden_size / tp * grad_bytes
            pair_bw, pair_lat = bw[e0:end].reshape(2, -1).T, lat[e0:end].reshape(2, -1).T
            embedding = float(comm.ring_time_from_links(pair_bw, pair_lat, size).max())
        inputs = PipelineInputs(
            pp=pp, vpp=plan.vpp, schedule="interleaved" if plan.vpp > 1 else "1f1b",
            num_micro_batches=num_micro_batches(inst, plan), forward_s=fwd, backward_s=bwd,
            fwd_hop_s=hops[0], bwd_hop_s=hops[1], dp_sync_s=dp_sync,
            overlap_grad_reduce=training.overlap_grad_reduce, embedding_sync_s=embedding,
            optimizer_s=optimizer, param_gather_s=gather,
        )  # fmt: skip
        return inputs, tp_comm

    def evaluate(self, plan: Plan, predictor: Predictor = "analytic") -> Evaluation:
        """Iteration time, throughput, MFU/HFU, memory and time breakdown of ``plan``.

        ``breakdown_s`` (keys :data:`BREAKDOWN_KEYS`) sums to the iteration time:
        ``compute`` and ``tp_comm`` split the busiest stage's forward/backward
        work, ``pp_comm`` is what the pipeline hops add (the time minus the time
        with free hops), ``bubble`` the rest of the pipeline phase, ``dp_comm``
        the exposed gradient, embedding and parameter syncs, ``optimizer`` the step.
        MFU counts model FLOPs, HFU recomputation too, both against the summed
        peak of the GPUs used.
        """
        gpus = placement_array(plan)
        if self.validate:
            validate_layout(self.instance, plan, gpus)
        x, tp_comm = self.pipeline_inputs(plan, gpus)
        if predictor == "simulator":
            run = simulate_pipeline(x, record=False)
            free = replace(x, fwd_hop_s=np.zeros(x.pp), bwd_hop_s=np.zeros(x.pp))
            pipe, pipe_free = run.pipeline_time_s, simulate_pipeline(free, record=False)[0]
            ends, last_b = run.stage_end_s, run.last_backward_s
        else:
            times = pipeline_times(x)
            pipe, pipe_free = times.pipeline_s, times.free_hops_s
            ends, last_b = times.stage_end_s, times.last_backward_s
        tail = finish_iteration(x, ends, last_b)
        busy = x.num_micro_batches * (x.forward_s + x.backward_s).reshape(plan.vpp, -1).sum(axis=0)
        tp_stage = x.num_micro_batches * tp_comm.reshape(plan.vpp, -1).sum(axis=0)
        top = int(np.argmax(busy))
        pp_comm = max(pipe - pipe_free, 0.0)
        breakdown = {
            "compute": float(busy[top] - tp_stage[top]),
            "bubble": float(pipe - busy[top] - pp_comm),
            "pp_comm": pp_comm,
            "dp_comm": tail.optimizer_start_s - pipe + tail.param_gather_s,
            "tp_comm": float(tp_stage[top]),
            "optimizer": tail.optimizer_s,
        }
        inst, total, n = self.instance, tail.total_s, plan.num_gpus
        stages = self._cached(
            ("memory", _knobs(plan)),
            lambda: tuple(b.total_bytes for b in memory_by_stage(inst.model, inst.training, plan)),
        )
        by_stage = gpus.reshape(plan.pp, -1)
        limit = self._usable[by_stage].min(axis=1)
        peak = float(self._peak[by_stage].sum())
        hw = self._cached(
            ("hfu", _knobs(plan)),
            lambda: hardware_flops_per_iteration(inst.model, inst.training, plan),
        )
        # trusted numbers: built without re-validation (the hot path of a search)
        return Evaluation.model_construct(
            iteration_time_s=total,
            tokens_per_s=inst.training.global_batch_size * inst.training.seq_length / total,
            model_tflops_per_gpu=self._model_flops / total / n / TFLOPS,
            hardware_tflops_per_gpu=hw / total / n / TFLOPS,
            mfu=self._model_flops / (total * peak), hfu=hw / (total * peak),
            memory_bytes_by_stage=stages, memory_bytes_max=max(stages),
            memory_limit_bytes=float(limit.min()), fits=bool((np.array(stages) <= limit).all()),
            breakdown_s=breakdown, model=predictor,
        )  # fmt: skip

    def simulate(self, plan: Plan) -> Timeline:
        """The simulator's timeline of ``plan`` (stage GPUs of DP replica 0)."""
        gpus = placement_array(plan)
        if self.validate:
            validate_layout(self.instance, plan, gpus)
        x, _ = self.pipeline_inputs(plan, gpus)
        return simulate_inputs(x, tuple(plan.unit_gpus(s, 0) for s in range(plan.pp)))


def evaluate(
    instance: Instance, plan: Plan, *, profile: LayerProfile | None = None, predictor: Predictor = "analytic"
) -> Evaluation:  # fmt: skip
    """Predict ``plan``'s performance on ``instance`` (see :meth:`Evaluator.evaluate`)."""
    return Evaluator(instance, profile=profile).evaluate(plan, predictor)


def simulate(instance: Instance, plan: Plan, *, profile: LayerProfile | None = None) -> Timeline:
    """The discrete-event timeline of one iteration of ``plan`` (for plots)."""
    return Evaluator(instance, profile=profile).simulate(plan)
