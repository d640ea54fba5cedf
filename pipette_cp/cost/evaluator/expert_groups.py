"""The evaluator's costs of the expert groups (:class:`ExpertGroupCosts`, a part the
:class:`~pipette_cp.cost.evaluator.evaluate.Evaluator` holds).

Per MoE layer and micro-batch the forward pass runs two all-to-alls (dispatch and
combine), the backward pass two more (their gradients), full recomputation two more
again; none is overlapped (Megatron-Core's alltoall dispatcher without
``--overlap-moe-expert-parallel-comm``).  Their time per stage comes from the
placement (:func:`~pipette_cp.cost.network.parallel_groups.alltoall_times_s`) and is added to every
virtual stage in proportion to its MoE layers.  The routed experts' gradients are
reduced over the expert data-parallel rings when those differ from the dense ones
(``ep > 1`` or ``etp != tp``), after the dense gradients (one stream).  The flex
dispatcher (DeepEP) sends a token once to every other node that holds one of its
experts (:func:`~pipette_cp.cost.network.parallel_groups.node_dedup_factor`).
"""

from __future__ import annotations

import numpy as np

from pipette_cp.cost.evaluator.caches import KnobMemo
from pipette_cp.cost.evaluator.layout_rules import num_micro_batches
from pipette_cp.cost.evaluator.stage_times import StageTimes
from pipette_cp.cost.network import collectives as comm
from pipette_cp.cost.network.alltoall_nodes import group_nodes_of
from pipette_cp.cost.network.data_parallel import gradient_wire_bytes, param_wire_bytes
from pipette_cp.cost.network.parallel_groups import (
    GroupFlows,
    expert_dp_rings,
    expert_members,
    node_dedup_factor,
    stage_alltoall_times_s,
)
from pipette_cp.cost.workload.lora import trained_param_split
from pipette_cp.cost.workload.tokens import dispatch_bytes, moe_layers_by_chunk, rank_tokens
from pipette_cp.specs.instance import Instance
from pipette_cp.specs.knobs.recompute import selective_modules
from pipette_cp.specs.plan import Plan
from pipette_cp.units import BYTES_PER_ELEMENT


def expert_rings_apart(plan: Plan) -> bool:
    """Whether the experts' gradients are reduced over other rings than the dense ones."""
    return plan.ep > 1 or plan.expert_tp != plan.tp


def alltoalls_per_layer(plan: Plan) -> tuple[float, float]:
    """(forward, backward) all-to-alls per MoE layer and micro-batch: the backward runs
    the dispatch and combine again when it recomputes the MoE block (full recomputation,
    or Megatron-Core's ``moe`` module)."""
    again = plan.recompute == "full" or "moe" in selective_modules(plan)
    return 2.0, 4.0 if again else 2.0


def peer_bytes(instance: Instance, plan: Plan) -> float:
    """Bytes one GPU sends to each other rank of its expert group per all-to-all: its
    share of its routed copies (alltoall), or all its tokens (allgather dispatcher)."""
    model, training = instance.model, instance.training
    if training.moe_token_dispatcher == "allgather":
        elem = BYTES_PER_ELEMENT[training.precision]
        return rank_tokens(training, plan) * model.hidden_size * elem
    return dispatch_bytes(model, training, plan)


class ExpertGroupCosts:
    """The expert groups' costs of the plans of one instance on ``fabric``: the parameter
    split between dense and routed-expert weights, the all-to-alls of every stage and the
    expert data-parallel rings' collectives (``algorithm``: see
    :class:`~pipette_cp.cost.evaluator.evaluate.Evaluator`), with the evaluator's ``memo``
    of placement-free costs (``key``: the plan's
    :func:`~pipette_cp.cost.evaluator.layout_rules.knobs_key`)."""

    def __init__(
        self, instance: Instance, fabric: comm.Fabric, algorithm: comm.Algorithm, memo: KnobMemo
    ) -> None:
        self.instance, self.fabric, self.algorithm, self.memo = instance, fabric, algorithm, memo

    def with_alltoall(
        self, plan: Plan, key: tuple, stages: StageTimes, flat: np.ndarray, groups: GroupFlows
    ) -> StageTimes:
        """``stages`` with every virtual stage's all-to-alls added (``busy_ep_s``: the
        busiest stage's share)."""
        inst = self.instance
        scale: np.ndarray | float = 1.0
        members, nodes = expert_members(flat, groups), None
        if inst.training.moe_token_dispatcher == "flex":  # DeepEP: once per remote node
            nodes = group_nodes_of(self.fabric, members)
            spread = nodes.distinct.reshape(plan.pp, -1)
            scale = node_dedup_factor(inst.model.num_experts, inst.model.moe_top_k, spread)
        nbytes = self.memo.get(("peer bytes", key), lambda: peer_bytes(inst, plan))
        a2a = stage_alltoall_times_s(self.fabric, members, plan.pp, nbytes, scale, nodes)
        moe = self.memo.get(("moe layers", key), lambda: moe_layers_by_chunk(inst.model, plan))
        rows = self.memo.get(("chunk stages", key), lambda: _chunk_stages(plan))
        per_layer = a2a[rows] * moe
        n_fwd, n_bwd = alltoalls_per_layer(plan)
        forward = stages.forward_s + n_fwd * per_layer
        backward = stages.backward_s + n_bwd * per_layer
        m = num_micro_batches(inst, plan)
        busy = m * (forward + backward).reshape(plan.vpp, -1).sum(axis=0)
        ep = m * ((n_fwd + n_bwd) * per_layer).reshape(plan.vpp, -1).sum(axis=0)
        top = int(np.argmax(busy))
        for array in (forward, backward):
            array.flags.writeable = False
        return stages._replace(
            forward_s=forward, backward_s=backward, busy_s=float(busy[top]),
            busy_ep_s=float(ep[top]),
        )  # fmt: skip

    def param_split(self, plan: Plan, key: tuple) -> np.ndarray:
        """(pp, 2): dense and routed-expert parameters per GPU of every stage that are
        trained, all of them but under LoRA (the adapters: cost.workload.lora) (cached)."""
        model, training = self.instance.model, self.instance.training

        def make() -> np.ndarray:
            split = [trained_param_split(model, training, plan, s) for s in range(plan.pp)]
            out = np.array(split)
            out.flags.writeable = False
            return out

        return self.memo.get(("split", key), make)

    def dense_synced(self, plan: Plan, key: tuple, params: np.ndarray) -> np.ndarray:
        """Parameters per GPU of every stage that the dense DP rings reduce: all of them,
        or the dense ones where the experts have rings of their own."""
        if not (self.instance.model.is_moe and expert_rings_apart(plan)):
            return params
        return self.param_split(plan, key)[:, 0].copy()

    def expert_sync(
        self, plan: Plan, key: tuple, flat: np.ndarray, groups: GroupFlows
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each stage's expert gradient sync and (distributed optimizer) parameter gather
        over its expert data-parallel rings, all stages at once, s."""
        pp, training = plan.pp, self.instance.training
        zeros = np.zeros(pp)
        if plan.expert_dp <= 1 or not self.instance.model.is_moe:
            return zeros, zeros
        rings = expert_dp_rings(flat, groups)
        per = rings.shape[0] // pp
        grad_bytes, param_bytes = self.memo.get(
            ("expert ring bytes", key), lambda: self._expert_ring_bytes(plan, key, per)
        )
        what = "an expert data-parallel gradient sync"

        def run(op: comm.Collective, nbytes: np.ndarray) -> np.ndarray:
            t = comm.collective_times_s(self.fabric, rings, nbytes, op, self.algorithm, what)
            return t.reshape(pp, per).max(axis=1)

        if not plan.distributed_optimizer:
            return run("all_reduce", grad_bytes), zeros
        gather = zeros if training.overlap_param_gather else run("all_gather", param_bytes)
        return run("reduce_scatter", grad_bytes), gather

    def _expert_ring_bytes(self, plan: Plan, key: tuple, per: int) -> tuple[np.ndarray, np.ndarray]:
        """Gradient and parameter bytes of every expert data-parallel ring (``per`` rings
        a stage), read-only."""
        training = self.instance.training
        experts = np.repeat(self.param_split(plan, key)[:, 1], per)
        grad, elem = gradient_wire_bytes(training, plan), param_wire_bytes(training, plan)
        out = experts * grad, experts * elem
        for array in out:
            array.flags.writeable = False
        return out


def _chunk_stages(plan: Plan) -> np.ndarray:
    """The pipeline stage of every virtual stage (``c * pp + s``), read-only."""
    out = np.arange(plan.pp * plan.vpp) % plan.pp
    out.flags.writeable = False
    return out
