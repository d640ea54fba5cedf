"""What the data-parallel group communicates: once per step, and (ZeRO-2/3) per micro-batch.

Megatron reduces the gradients in fp32 under bf16 (``arguments.py``): an
all-reduce, or with the distributed optimizer a reduce-scatter, then after the
step an all-gather of the bf16 parameters (unless ``overlap_param_gather``).
Sharding the gradients too (ZeRO-2, ``optim_grads``; Rajbhandari et al. 2020)
reduce-scatters every micro-batch's gradients layer by layer in the backward;
ZeRO-3 (``optim_grads_params``) also all-gathers each layer's weights before its
forward and again before its backward.  Those per-micro-batch collectives overlap
the layer's compute; what the compute cannot hide is exposed
(:func:`exposed_per_layer`).  The ring times come from the evaluator, over the
measured links of the placement.
"""

from __future__ import annotations

import numpy as np

from pipette_cp.cost import comm
from pipette_cp.cost.compute import LayerTimes
from pipette_cp.cost.framework import resolve_framework
from pipette_cp.cost.memory import layer_params_per_gpu
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import GRADIENT_SHARDING, TrainingSpec
from pipette_cp.units import BYTES_PER_ELEMENT

Ops = list[tuple[comm.Collective, np.ndarray]]


def gradient_wire_bytes(training: TrainingSpec) -> float:
    """Bytes per gradient element on the wire: under bf16 the framework's gradient
    buffer (Megatron reduces its fp32 buffer: 4; a framework keeping two copies, such as
    DeepSpeed's BF16 optimizer, reduces the fp32 one), under fp16 the 2-byte gradients."""
    if training.precision == "bf16":
        return min(resolve_framework(training.framework).gradient_bytes, 4.0)
    return float(BYTES_PER_ELEMENT[training.precision])


def _bytes(training: TrainingSpec) -> tuple[float, float]:
    """(parameter, gradient) bytes per element on the wire."""
    return float(BYTES_PER_ELEMENT[training.precision]), gradient_wire_bytes(training)


def step_collectives(training: TrainingSpec, plan: Plan, params: np.ndarray) -> Ops:
    """The once-per-step collectives of every (stage, tp rank) ring, bytes (two entries:
    the gradient sync, then the parameter gather; absent ones have zero bytes)."""
    elem, grad = _bytes(training)
    sizes = np.repeat(params, plan.tp)
    none = np.zeros_like(sizes)
    if plan.sharding in GRADIENT_SHARDING:
        # ZeRO-2 still gathers the updated parameters after the step; ZeRO-3 gathers
        # them layer by layer when they are used (per_layer_collectives)
        gather = sizes * elem if plan.sharding == "optim_grads" else none
        return [("reduce_scatter", none), ("all_gather", gather)]
    sync: comm.Collective = "reduce_scatter" if plan.distributed_optimizer else "all_reduce"
    gather_on = plan.distributed_optimizer and not training.overlap_param_gather
    return [(sync, sizes * grad), ("all_gather", sizes * elem if gather_on else none)]


def per_layer_collectives(model: ModelSpec, training: TrainingSpec, plan: Plan) -> Ops:
    """ZeRO-2/3: one layer's gradient reduce-scatter and weight all-gather, bytes, per
    (stage, tp rank) ring."""
    elem, grad = _bytes(training)
    layer = np.full(plan.pp * plan.tp, layer_params_per_gpu(model, plan.tp))
    return [("reduce_scatter", layer * grad), ("all_gather", layer * elem)]


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
