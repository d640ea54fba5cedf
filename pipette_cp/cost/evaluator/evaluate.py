"""Evaluate a plan: validate it, then predict iteration time, throughput, MFU and memory.

:class:`Evaluator` keeps what depends only on the instance (the cluster's
arrays) and caches what depends on the plan's knobs but not its placement
(chunk times, memory, optimizer time, flow templates), so a search that tries
thousands of placements pays only for one gather of every transfer of the
iteration.  :meth:`Evaluator.iteration_time` is the fast path of a search
(no breakdown, memory or :class:`~pipette_cp.specs.plan.Evaluation`).
:func:`evaluate` and :func:`simulate` are one-shot conveniences; the layout
checks live in :mod:`pipette_cp.cost.evaluator.layout_rules` (re-exported here), the
data-parallel and expert-group costs in the parts the evaluator holds
(:mod:`~pipette_cp.cost.evaluator.dp_collectives`,
:mod:`~pipette_cp.cost.evaluator.expert_groups`).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Literal

import numpy as np

from pipette_cp.cost.compute.model_chunks import chunk_times
from pipette_cp.cost.compute.optimizer_step import optimizer_step_time_s
from pipette_cp.cost.evaluator.caches import KnobMemo, fabric_of
from pipette_cp.cost.evaluator.dp_collectives import DpCollectives
from pipette_cp.cost.evaluator.expert_groups import ExpertGroupCosts, expert_rings_apart
from pipette_cp.cost.evaluator.layout_rules import (
    FlowTemplate,
    check_knobs,
    check_placement,
    flow_template,
    num_micro_batches,
    placement_array,
    validate_layout,
)
from pipette_cp.cost.evaluator.layout_rules import (
    knobs_key as _knobs,
)
from pipette_cp.cost.evaluator.stage_times import StageTimes
from pipette_cp.cost.memory.peak import (
    memory_by_stage,
    padded_vocab_size,
    usable_memory_bytes,
)
from pipette_cp.cost.network import collectives as comm
from pipette_cp.cost.network.data_parallel import (
    gradient_wire_bytes,
    step_collectives,
)
from pipette_cp.cost.network.nccl_rings import nccl_rings
from pipette_cp.cost.network.parallel_groups import GroupFlows, cp_ring_bandwidths, group_flows
from pipette_cp.cost.network.tp_rings import group_bandwidths
from pipette_cp.cost.schedule.critical_path import PipelineInputs, finish_iteration, pipeline_times
from pipette_cp.cost.schedule.simulator import Timeline, simulate_pipeline
from pipette_cp.cost.schedule.simulator import simulate as simulate_inputs
from pipette_cp.cost.workload.flops import hardware_flops_per_iteration, model_flops_per_iteration
from pipette_cp.cost.workload.tokens import unit_tokens
from pipette_cp.specs.instance import Instance
from pipette_cp.specs.plan import Evaluation, Plan, TimeBreakdown
from pipette_cp.specs.profile import LayerProfile
from pipette_cp.specs.training import GRADIENT_SHARDING
from pipette_cp.units import BYTES_PER_ELEMENT, TFLOPS

__all__ = [
    "Evaluator", "Predictor", "evaluate", "num_micro_batches", "placement_array", "simulate",
    "validate_layout",
]  # fmt: skip

Predictor = Literal["analytic", "simulator"]


class Evaluator:
    """Evaluate many plans of one instance fast.

    ``profile``: measured per-layer times (:mod:`pipette_cp.specs.profile`; default: the instance's).
    ``dp_algorithm``: ``"ring"`` (the ring NCCL builds from replica order), ``"hierarchical"`` or ``"best"``
    (the faster per group, as NCCL's tuner picks; with one GPU of a group per node
    they coincide and only the ring is costed); a tensor-parallel group runs at its
    best ring's bottleneck (:mod:`pipette_cp.cost.network.tp_rings`).  ``validate``: whether
    :meth:`evaluate` and :meth:`iteration_time` call :func:`validate_layout` first
    (the placement-free part once per layout).

    It holds two parts that share its memo of placement-free costs: :attr:`dp_sync`
    (:class:`~pipette_cp.cost.evaluator.dp_collectives.DpCollectives`, the data-parallel
    rings) and :attr:`expert_groups`
    (:class:`~pipette_cp.cost.evaluator.expert_groups.ExpertGroupCosts`, the MoE all-to-alls,
    parameter split and expert rings).
    """

    def __init__(
        self, instance: Instance, *, profile: LayerProfile | None = None,
        dp_algorithm: comm.Algorithm = "best", validate: bool = True,
    ) -> None:  # fmt: skip
        cluster = instance.cluster
        self.instance, self.validate = instance, validate
        self.profile = profile if profile is not None else instance.profile
        self.dp_algorithm: comm.Algorithm = dp_algorithm
        self.fabric = fabric_of(cluster)
        node_gpu = [cluster.gpu_of_node(i) for i in range(cluster.num_nodes)]
        self._gpu_of_gpu = [node_gpu[i // cluster.gpus_per_node] for i in range(cluster.num_gpus)]
        self._peak = np.array([gpu.peak_flops_per_s for gpu in self._gpu_of_gpu])
        training = instance.training
        self._usable = np.array([usable_memory_bytes(g, training) for g in self._gpu_of_gpu])
        self._model_flops = model_flops_per_iteration(instance.model, instance.training)
        self._mixed = len(cluster.gpu_types) > 1
        self._memo = memo = KnobMemo()
        self.dp_sync = DpCollectives(instance, self.fabric, dp_algorithm, memo)
        self.expert_groups = ExpertGroupCosts(instance, self.fabric, dp_algorithm, memo)

    def _check(self, plan: Plan, key: tuple, gpus: np.ndarray) -> None:
        """:func:`validate_layout`, the placement-free checks once per layout."""
        if ("valid", key) not in self._memo:
            check_knobs(self.instance, plan)
            self._memo.get(("valid", key), lambda: True)
        check_placement(self.instance, plan, gpus)

    def _stage_times(
        self, plan: Plan, key: tuple, stage_gpu: list, stage_bw: np.ndarray, cp_bw: np.ndarray
    ) -> StageTimes:
        """Per virtual stage: each stage's rows from the chunk times of its slowest GPU
        type at its slowest TP group's bandwidth (cached by both)."""
        inst, vpp = self.instance, plan.vpp
        model, training, types = inst.model, inst.training, inst.cluster.gpu_types

        def make() -> StageTimes:
            rows = np.arange(plan.pp * vpp) % plan.pp
            stage_keys = [
                (g.name, float(bw), float(c))
                for g, bw, c in zip(stage_gpu, stage_bw, cp_bw, strict=True)
            ]
            out = np.zeros((4, plan.pp * vpp))
            for name, bw, c in set(stage_keys):
                args = (model, training, types[name], plan, bw, self.profile)
                make_chunks = partial(chunk_times, *args, cp_bandwidth_bytes_per_s=c)
                t = self._memo.get(("chunks", key, name, bw, c), make_chunks)
                times = np.stack([
                    t.forward_s, t.backward_s, t.tp_comm_forward_s + t.tp_comm_backward_s,
                    t.cp_comm_forward_s + t.cp_comm_backward_s,
                ])  # fmt: skip
                sel = np.array([k == (name, bw, c) for k in stage_keys])[rows]
                out[:, sel] = times[:, sel]
            out.flags.writeable = False
            m = num_micro_batches(inst, plan)
            busy = m * (out[0] + out[1]).reshape(vpp, -1).sum(axis=0)
            tp_stage, cp_stage = (m * out[i].reshape(vpp, -1).sum(axis=0) for i in (2, 3))
            top = int(np.argmax(busy))
            return StageTimes(out[0], out[1], out[2], float(busy[top]), float(tp_stage[top]),
                           busy_cp_s=float(cp_stage[top]))  # fmt: skip

        names = tuple(g.name for g in stage_gpu) if self._mixed else None
        at = (stage_bw.tobytes(), cp_bw.tobytes())
        return self._memo.get(("stage times", key, names, at), make)

    def _per_stage(self, plan: Plan, key: tuple, stage_gpu: list) -> tuple[np.ndarray, np.ndarray]:
        """Parameters per GPU and optimizer-step time of every stage (cached)."""
        model, training = self.instance.model, self.instance.training

        def make() -> tuple[np.ndarray, np.ndarray]:
            params = self.expert_groups.param_split(plan, key).sum(axis=1)  # dense + routed experts
            step = [
                optimizer_step_time_s(model, training, g, plan, s) for s, g in enumerate(stage_gpu)
            ]
            out = params, np.array(step)
            for array in out:
                array.flags.writeable = False
            return out

        names = tuple(g.name for g in stage_gpu) if self._mixed else None
        return self._memo.get(("stage", key, names), make)

    def pipeline_inputs(
        self, plan: Plan, gpus: np.ndarray | None = None
    ) -> tuple[PipelineInputs, tuple[float, float]]:
        """The schedule inputs of ``plan`` and, under ZeRO-2/3, one layer's gradient
        reduce-scatter and weight all-gather times (``(0, 0)`` otherwise), s;
        :class:`~pipette_cp.errors.InfeasibleError` names the operation (hop, DP ring,
        TP group, embedding pair) of a failed link."""
        x, stages = self._inputs(plan, placement_array(plan) if gpus is None else gpus)
        return x, stages.layer_collectives_s

    def _inputs(self, plan: Plan, gpus: np.ndarray) -> tuple[PipelineInputs, StageTimes]:
        inst, fabric = self.instance, self.fabric
        model, training = inst.model, inst.training
        dp, pp, tp, vpp = plan.replicas, plan.pp, plan.tp, plan.vpp  # dp: DP ring length
        key = _knobs(plan)
        # the two copies' gradient all-reduce (none for LoRA's frozen embedding)
        tied = model.tied_embeddings and pp > 1 and training.lora is None
        args = (pp, plan.replicas, tp, vpp, tied, fabric.num_nodes)
        f: FlowTemplate = self._memo.get(("flows", *args[:5]), partial(flow_template, *args))
        flat = gpus.ravel()
        if tp > 1:  # each unit's TP ring in NCCL's order (rings); slowest unit per stage
            stage_bw = group_bandwidths(fabric, gpus.reshape(-1, tp)).reshape(pp, -1).min(axis=1)
        else:
            stage_bw = np.zeros(pp)
        stage_gpu = [self._gpu_of_gpu[0]] * pp
        if self._mixed:  # the slowest GPU type among each stage's GPUs
            by_stage = gpus.reshape(pp, -1)
            slowest = by_stage[np.arange(pp), self._peak[by_stage].argmin(axis=1)]
            stage_gpu = [self._gpu_of_gpu[int(g)] for g in slowest]
        groups: GroupFlows | None = None
        cp_bw = np.zeros(pp)
        if plan.cp > 1 or plan.ep > 1 or (model.is_moe and expert_rings_apart(plan)):
            groups = self._memo.get(("groups", key), partial(group_flows, plan))
            cp_bw = cp_ring_bandwidths(fabric, flat, groups)[0]
        stages = self._stage_times(plan, key, stage_gpu, stage_bw, cp_bw)
        if plan.ep > 1 and groups is not None:
            stages = self.expert_groups.with_alltoall(plan, key, stages, flat, groups)
        params, optimizer = self._per_stage(plan, key, stage_gpu)
        # every transfer of the iteration in one gather
        (r0, e0, end), last = f.bounds, f.last
        src, dst = flat[f.src], flat[f.dst]
        if dp > 2:  # the DP rings NCCL builds from each group's rank (= replica) order
            ranked = flat[f.ring_pos]
            ring = nccl_rings(ranked, fabric.node_of)
            if ring is not ranked:
                src[r0:e0], dst[r0:e0] = ring.T.ravel(), np.roll(ring, -1, axis=1).T.ravel()
        bw, lat = comm.shared_nic_flows(fabric, src, dst, f.offset, f.size)
        if not bw.all():
            for what, lo, hi in f.parts:  # a DP ring may still avoid it (two-level)
                if not what.startswith("a data-parallel") or self.dp_algorithm == "ring":
                    comm.check_links(fabric, src[lo:hi], dst[lo:hi], what)
        hops = np.zeros((2, pp))
        if last:
            # activation (= gradient) per tp rank: s b h, / tp with sequence parallelism
            # (Megatron get_tensor_shapes); point-to-point: latency + bytes / bandwidth
            elem = BYTES_PER_ELEMENT[training.precision]
            act = unit_tokens(training, plan) * model.hidden_size * elem
            t = lat[:r0] + act / (tp if plan.sequence_parallel else 1) / bw[:r0]
            # a hop takes its slowest tp rank; the slowest DP replica sets the pipeline
            hops[:, :last] = t.reshape(2, last, plan.replicas * tp).max(axis=2)
        dp_sync = gather = np.zeros(pp)
        if dp > 1:
            shape = (dp, pp * tp)
            ring_bw, ring_lat = bw[r0:e0].reshape(shape).T, lat[r0:e0].reshape(shape).T
            dense = self.expert_groups.dense_synced(plan, key, params)
            ops = self._memo.get(("dp ops", key), lambda: step_collectives(training, plan, dense))
            rings = (flat[f.ring_pos], ring_bw, ring_lat)
            dp_sync, gather = self.dp_sync.times(plan, *rings, ops)
            if plan.sharding in GRADIENT_SHARDING:
                exposure = self.dp_sync.sharded_exposure
                stages = exposure(plan, stages, stage_gpu, stage_bw, rings, cp_bw)
        if groups is not None and expert_rings_apart(plan):
            extra = self.expert_groups.expert_sync(plan, key, flat, groups)
            dp_sync, gather = dp_sync + extra[0], gather + extra[1]
        embedding = 0.0
        if tied:  # all-reduce of the word-embedding gradient between its two copies
            grad_bytes = gradient_wire_bytes(training, plan)
            size = padded_vocab_size(model, tp) * model.hidden_size / tp * grad_bytes
            pair_bw, pair_lat = bw[e0:end].reshape(2, -1).T, lat[e0:end].reshape(2, -1).T
            embedding = float(comm.ring_time_from_links(pair_bw, pair_lat, size).max())
        for array in (hops, dp_sync, gather):
            array.flags.writeable = False
        # fresh or cached read-only float arrays of the right shapes: no copies needed
        inputs = PipelineInputs.unchecked(
            pp=pp, vpp=vpp, schedule="interleaved" if vpp > 1 else "1f1b",
            num_micro_batches=num_micro_batches(inst, plan), forward_s=stages.forward_s,
            backward_s=stages.backward_s, fwd_hop_s=hops[0], bwd_hop_s=hops[1],
            dp_sync_s=dp_sync, overlap_grad_reduce=training.overlap_grad_reduce,
            embedding_sync_s=embedding, optimizer_s=optimizer, param_gather_s=gather,
        )  # fmt: skip
        return inputs, stages

    def _prepare(self, plan: Plan) -> tuple[np.ndarray, PipelineInputs, StageTimes]:
        """Placement array (validated if :attr:`validate`) and pipeline inputs."""
        gpus = placement_array(plan)
        if self.validate:
            self._check(plan, _knobs(plan), gpus)
        return (gpus, *self._inputs(plan, gpus))

    def iteration_time(self, plan: Plan) -> float:
        """The analytic iteration time of ``plan``, s: :meth:`evaluate`'s
        ``iteration_time_s`` without the breakdown, memory and MFU (a search's hot path).
        """
        _, x, _ = self._prepare(plan)
        times = pipeline_times(x)
        return finish_iteration(x, times.stage_end_s, times.last_backward_s).total_s

    def evaluate(self, plan: Plan, predictor: Predictor = "analytic") -> Evaluation:
        """Iteration time, throughput, MFU/HFU, memory and time breakdown of ``plan``.

        ``breakdown_s`` (:class:`~pipette_cp.specs.plan.TimeBreakdown`) sums to the
        iteration time: ``compute``, ``tp_comm``, ``cp_comm`` and ``ep_comm`` split the
        busiest stage's forward/backward work, ``pp_comm`` is what the pipeline hops
        add (the time minus the time with free hops), ``bubble`` the rest of the
        pipeline phase, ``dp_comm`` the exposed gradient, embedding and parameter
        syncs, ``optimizer`` the step.  MFU counts model FLOPs, HFU recomputation too,
        both against the summed peak of the GPUs used.
        """
        gpus, x, st = self._prepare(plan)
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
        pp_comm = max(pipe - pipe_free, 0.0)
        breakdown = TimeBreakdown.model_construct(
            compute=st.busy_s - st.busy_tp_s - st.busy_dp_s - st.busy_cp_s - st.busy_ep_s,
            bubble=float(pipe - st.busy_s - pp_comm), pp_comm=pp_comm,
            dp_comm=tail.optimizer_start_s - pipe + tail.param_gather_s + st.busy_dp_s,
            tp_comm=st.busy_tp_s, cp_comm=st.busy_cp_s, ep_comm=st.busy_ep_s,
            optimizer=tail.optimizer_s,
        )  # fmt: skip
        inst, total, n, key = self.instance, tail.total_s, plan.num_gpus, _knobs(plan)
        stages, bounds, by_bound = self._memo.get(("memory", key), lambda: self._memory(plan))
        limit, peak = self._limits(gpus.reshape(plan.pp, -1))
        hw = self._memo.get(
            ("hfu", key), lambda: hardware_flops_per_iteration(inst.model, inst.training, plan)
        )
        # trusted numbers: built without re-validation (the hot path of a search)
        return Evaluation.model_construct(
            iteration_time_s=total,
            tokens_per_s=inst.training.global_batch_size * inst.training.seq_length / total,
            model_tflops_per_gpu=self._model_flops / total / n / TFLOPS,
            hardware_tflops_per_gpu=hw / total / n / TFLOPS,
            mfu=self._model_flops / (total * peak), hfu=hw / (total * peak),
            memory_bytes_by_stage=stages, memory_bytes_max=max(stages),
            memory_bound_bytes_by_stage=bounds, memory_margin_bytes=float((limit - by_bound).min()),
            memory_limit_bytes=float(limit.min()), fits=bool((by_bound <= limit).all()),
            breakdown_s=breakdown, model=predictor,
        )  # fmt: skip

    def _memory(self, plan: Plan) -> tuple[tuple[float, ...], tuple[float, ...], np.ndarray]:
        """Peak memory and its upper bound per stage, tuples, and the bounds as an array."""
        inst = self.instance
        memory = memory_by_stage(inst.model, inst.training, plan)
        bounds = tuple(b.bound_bytes for b in memory)
        array = np.array(bounds)
        array.flags.writeable = False
        return tuple(b.total_bytes for b in memory), bounds, array

    def _limits(self, by_stage: np.ndarray) -> tuple[np.ndarray, float]:
        """Usable memory of each stage's smallest GPU and the summed peak FLOP/s of the
        GPUs (one GPU type: the same for every placement of a shape, computed once)."""

        def make() -> tuple[np.ndarray, float]:
            limit = self._usable[by_stage].min(axis=1)
            limit.flags.writeable = False
            return limit, float(self._peak[by_stage].sum())

        return make() if self._mixed else self._memo.get(("limits", by_stage.shape), make)

    def simulate(self, plan: Plan) -> Timeline:
        """The simulator's timeline of ``plan`` (stage GPUs of DP replica 0)."""
        _, x, _ = self._prepare(plan)
        return simulate_inputs(x, tuple(plan.unit_gpus(s, 0) for s in range(plan.pp)))


def evaluate(
    instance: Instance, plan: Plan, *, profile: LayerProfile | None = None, predictor: Predictor = "analytic"
) -> Evaluation:  # fmt: skip
    """Predict ``plan``'s performance on ``instance`` (see :meth:`Evaluator.evaluate`)."""
    return Evaluator(instance, profile=profile).evaluate(plan, predictor)


def simulate(instance: Instance, plan: Plan, *, profile: LayerProfile | None = None) -> Timeline:
    """The discrete-event timeline of one iteration of ``plan`` (for plots)."""
    return Evaluator(instance, profile=profile).simulate(plan)
