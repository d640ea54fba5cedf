"""What the data-parallel group communicates: once per step, and (ZeRO-2/3) per micro-batch.

Megatron reduces the gradients in fp32 under bf16 (``arguments.py``; in bf16 with
``--grad-reduce-in-bf16``, :func:`gradient_wire_bytes`): an
all-reduce, or with the distributed optimizer a reduce-scatter, then after the
step an all-gather of the bf16 parameters (FP8 with ``--fp8-param-gather``:
:func:`param_wire_bytes`; unless ``overlap_param_gather``).
Sharding the gradients too (ZeRO-2, ``optim_grads``; Rajbhandari et al. 2020)
reduce-scatters every micro-batch's gradients layer by layer in the backward;
ZeRO-3 (``optim_grads_params``) also all-gathers each layer's weights before its
forward and again before its backward.  Those per-micro-batch collectives overlap
the layer's compute; what the compute cannot hide is exposed
(:func:`exposed_per_layer`).  The ring times come from the evaluator, over the
measured links of the placement.

Hybrid sharding (HSDP, ``plan.dp_shard_size``) runs the sharded collectives inside
each shard group of consecutive DP ranks and adds, once per step, an all-reduce of
each gradient shard across the groups that hold the same shard (Megatron's
distributed-optimizer instances; PyTorch's HYBRID_SHARD does it every backward
unless gradients are accumulated without sync, the case assumed here).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import numpy as np

from pipette_cp.cost.compute.model_chunks import LayerTimes
from pipette_cp.cost.memory.peak import layer_params_per_gpu
from pipette_cp.cost.network import collectives as comm
from pipette_cp.cost.stack.frameworks import gradient_bytes
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import GRADIENT_SHARDING, TrainingSpec
from pipette_cp.units import BYTES_PER_ELEMENT, FP8_BYTES

#: Which ranks of a DP ring take part: all of them, each HSDP shard group, or each set of
#: ranks holding the same shard (one per shard group).
Group = Literal["all", "shard", "replica"]


class DpOp(NamedTuple):
    """One collective of every (stage, tp rank) DP ring: bytes per ring, its group, and
    its phase (0: the gradient sync before the step, 1: the parameter gather after it;
    per-layer ops: 0 the reduce-scatter, 1 the all-gather)."""

    collective: comm.Collective
    nbytes: np.ndarray
    group: Group = "all"
    phase: int = 0


Ops = list[DpOp]


def gradient_wire_bytes(training: TrainingSpec, plan: Plan | None = None) -> float:
    """Bytes per gradient element on the wire
    (:func:`pipette_cp.cost.stack.frameworks.gradient_bytes`, ``wire``): Megatron reduces
    its fp32 main gradients (4) unless they are bf16 (``plan.grad_reduce_in_bf16``: 2);
    under fp16 the 2-byte gradients.  The evaluator, the expert rings and the placement
    masters all read it."""
    return gradient_bytes(training, plan).wire


def param_wire_bytes(training: TrainingSpec, plan: Plan | None = None) -> float:
    """Bytes per parameter element of the distributed optimizer's (and ZeRO's) parameter
    all-gather: the compute weights' (bf16, fp16: 2), or with FP8 primary weights
    (``plan.fp8_param_gather``, Megatron's ``--fp8-param-gather``: "perform the param
    all-gather in fp8") 1.  Every parameter is counted at 1 B although the norms,
    biases, embeddings and output layer gather in bf16: a few per cent of a layer stage's
    parameters, more on the first and last stage of a large vocabulary (assumption, errs
    low there).  The evaluator, the expert rings and the placement masters read it."""
    if plan is not None and plan.fp8_param_gather:
        return float(FP8_BYTES)
    return float(BYTES_PER_ELEMENT[training.precision])


def _bytes(training: TrainingSpec, plan: Plan) -> tuple[float, float]:
    """(parameter, gradient) bytes per element on the wire."""
    return param_wire_bytes(training, plan), gradient_wire_bytes(training, plan)


def step_collectives(training: TrainingSpec, plan: Plan, params: np.ndarray) -> Ops:
    """The once-per-step collectives of every (stage, tp rank) ring, bytes: the gradient
    sync (phase 0; under HSDP within the shard groups, then across them) and the
    parameter gather (phase 1); absent ones have zero bytes."""
    elem, grad = _bytes(training, plan)
    sizes = np.repeat(params, plan.tp)
    none = np.zeros_like(sizes)
    within: Group = "shard" if plan.hybrid else "all"
    # HSDP: each shard's gradient all-reduced across the shard groups, once per step
    across = [DpOp("all_reduce", sizes * grad / plan.shard_group, "replica")] if plan.hybrid else []
    if plan.sharding in GRADIENT_SHARDING:
        # ZeRO-2 still gathers the updated parameters after the step; ZeRO-3 gathers
        # them layer by layer when they are used (per_layer_collectives)
        gather = sizes * elem if plan.sharding == "optim_grads" else none
        return [*across, DpOp("all_gather", gather, within, 1)]
    sync: comm.Collective = "reduce_scatter" if plan.distributed_optimizer else "all_reduce"
    gather_on = plan.distributed_optimizer and not training.overlap_param_gather
    after = DpOp("all_gather", sizes * elem if gather_on else none, within, 1)
    return [DpOp(sync, sizes * grad, within), *across, after]


def per_layer_collectives(model: ModelSpec, training: TrainingSpec, plan: Plan) -> Ops:
    """ZeRO-2/3: one layer's gradient reduce-scatter and weight all-gather, bytes, per
    (stage, tp rank) ring."""
    elem, grad = _bytes(training, plan)
    layer = np.full(plan.pp * plan.tp, layer_params_per_gpu(model, plan.tp))
    within: Group = "shard" if plan.hybrid else "all"
    return [
        DpOp("reduce_scatter", layer * grad, within),
        DpOp("all_gather", layer * elem, within, 1),
    ]


def exposed_per_layer(
    plan: Plan, times: LayerTimes, reduce_scatter_s: float, all_gather_s: float
) -> tuple[float, float]:
    """(forward, backward) time per layer and micro-batch that the layer's compute does
    not hide: ``max(0, comm - compute)``; linear in the layers, so the split models
    stay exact, and convex in the collective times, so the placement masters' cuts
    stay valid."""
    gathers = 1.0 if plan.sharding == "optim_grads_params" else 0.0
    forward = max(0.0, gathers * all_gather_s - times.forward_s)
    backward = max(0.0, gathers * all_gather_s + reduce_scatter_s - times.backward_s)
    return forward, backward


def hybrid_times_s(
    fabric: comm.Fabric, plan: Plan, rings: np.ndarray, nbytes: np.ndarray,
    collective: comm.Collective, group: Group, algorithm: comm.Algorithm,
) -> np.ndarray:  # fmt: skip
    """Per stage, an HSDP collective over every shard group (consecutive DP ranks of each
    ring) or every replica set (one rank per shard group), all at once: the slowest."""
    k, dp = rings.shape  # one ring per (stage, tp rank), in replica order
    blocks = rings.reshape(k, dp // plan.shard_group, plan.shard_group)
    groups = blocks if group == "shard" else blocks.transpose(0, 2, 1)
    per = groups.shape[1]
    t = comm.collective_times_s(
        fabric, groups.reshape(k * per, -1), np.repeat(nbytes, per), collective, algorithm,
        "a hybrid-sharded data-parallel collective",
    )  # fmt: skip
    return t.reshape(plan.pp, plan.tp * per).max(axis=1)
