"""Time of the (memory-bound) optimizer step on one GPU of a pipeline stage."""

from __future__ import annotations

from pipette_cp.cost.compute.gemm import hbm_time_s as _hbm_time_s
from pipette_cp.cost.stack.calibration import calibration_for
from pipette_cp.cost.stack.frameworks import (
    gradient_bytes,
    host_optimizer_time_s,
    optimizer_update_bytes,
)
from pipette_cp.cost.workload.lora import trained_param_split
from pipette_cp.cost.workload.parameters import expert_shard_group
from pipette_cp.specs.gpu import GpuSpec
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import TrainingSpec


def optimizer_step_time_s(
    model: ModelSpec, training: TrainingSpec, gpu: GpuSpec, plan: Plan, stage: int
) -> float:
    """Time of the (memory-bound) optimizer step on one GPU of ``stage``.

    Fused Adam over the local shard reads the fp32 gradient, master weight and two
    moments and writes the last three plus the bf16 weight (30 B/param; SGD with
    momentum 22 B; :func:`~pipette_cp.cost.stack.frameworks.optimizer_update_bytes`),
    the gradient-norm pass reads the gradient (4 B), and the
    gradient buffer of every local parameter is zeroed (4 B; bf16 main gradients 2 B:
    :func:`~pipette_cp.cost.stack.frameworks.gradient_bytes`).  An offloaded optimizer
    (``plan.optimizer_offload_fraction``) updates the rest of the shard on the device and
    adds the host's part (:func:`~pipette_cp.cost.stack.frameworks.host_optimizer_time_s`).
    The distributed optimizer updates 1/(dp cp) of the dense parameters, 1/expert_dp of
    the experts'.  Under LoRA only the adapters are trained
    (:func:`~pipette_cp.cost.workload.lora.trained_param_split`): the step and the
    gradient zeroing touch them alone.
    """
    cal = calibration_for(gpu)
    dense, experts = trained_param_split(model, training, plan, stage)  # MTP modules included
    params = dense + experts
    # the distributed optimizer: dense state over dp x cp, the experts' over expert dp
    shard = dense / plan.shard_group + experts / expert_shard_group(plan) \
        if plan.distributed_optimizer else params  # fmt: skip
    update = optimizer_update_bytes(training, plan)
    grad = gradient_bytes(training, plan).step  # fp32 main gradients: 4 B
    if offloaded := plan.optimizer_offload_fraction:  # the host updates that share
        hbm = (1.0 - offloaded) * shard * update + shard * grad + grad * params
        return _hbm_time_s(hbm, gpu, cal) + host_optimizer_time_s(offloaded * shard)
    return _hbm_time_s(shard * (update + grad) + grad * params, gpu, cal)
