"""What Megatron-Core's named recomputed modules add to a layer's backward: their forward
again (:func:`module_recompute_s`), besides the attention core that the plain
``selective`` recomputes (:func:`pipette_cp.cost.compute.model_chunks.layer_times`).

Each module's forward is timed as the layer's (:mod:`pipette_cp.cost.compute.layer_work`):
its GEMMs by name at the roofline (FP8 under fp8 training, the router in bf16), its
memory-bound kernels at the HBM rate and its tensor-parallel collectives over the stage's
link (hidden under the compute with ``tp_comm_overlap`` as the layer's are):

- ``mlp``: FC1 and FC2, the activation, the norm Transformer Engine fuses into FC1, the
  all-gather before FC1 and the reduce-scatter after FC2;
- ``moe``: the router, the experts and the shared experts, the router's softmax and
  top-k, the permutations and activations, the expert tensor-parallel collectives and
  the shared experts' (the expert-parallel all-to-alls run again as well:
  :func:`pipette_cp.cost.evaluator.expert_groups.alltoalls_per_layer`);
- ``shared_experts``: their GEMMs, activation and collectives; ``moe_act``: the experts'
  activation; ``layernorm``: the pre-MLP norm of a MoE layer, latent attention's input
  norm; ``mla_up_proj``: the up-projections and the rotary embedding.

The casts to FP8 of the recomputed GEMMs' inputs are not counted (as the layer's are,
they would add a few per cent of these GEMMs' time).
"""

from __future__ import annotations

from collections.abc import Iterable

from pipette_cp.cost.compute.gemm import gemm_time_s, hbm_time_s, quantized_gemm_time_s
from pipette_cp.cost.compute.layer_work import LayerWork
from pipette_cp.cost.compute.stage_extras import tp_collective_time_s
from pipette_cp.cost.stack.calibration import GpuCalibration
from pipette_cp.cost.stack.kernels import activation_bytes, norm_bytes, uses_quantized_gemms
from pipette_cp.cost.workload.flops import MODULE_GEMMS, Gemm
from pipette_cp.cost.workload.latent_attention import rope_elements
from pipette_cp.cost.workload.tokens import expert_tokens, unit_tokens
from pipette_cp.specs.gpu import GpuSpec
from pipette_cp.specs.knobs.recompute import selective_modules
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import TrainingSpec


def _gemms_s(
    gemms: Iterable[Gemm], training: TrainingSpec, gpu: GpuSpec, cal: GpuCalibration
) -> float:
    """The layer GEMMs' time, in FP8 or NVFP4 under quantised training."""
    if uses_quantized_gemms(training):
        return sum(quantized_gemm_time_s(g, gpu, cal, training) for g in gemms)
    return sum(gemm_time_s(g, gpu, cal) for g in gemms)


def module_recompute_s(
    model: ModelSpec, training: TrainingSpec, gpu: GpuSpec, plan: Plan, cal: GpuCalibration,
    work: LayerWork, tp_bandwidth_bytes_per_s: float, moe: bool,
) -> tuple[float, float]:  # fmt: skip
    """(time, of which exposed communication) one layer's backward spends redoing the
    forward of ``plan.recompute_modules`` other than ``core_attn`` (the module
    docstring), per micro-batch; (0, 0) without named modules."""
    if plan.recompute_modules is None:
        return 0.0, 0.0
    modules = selective_modules(plan)
    if moe and "moe" in modules:
        modules -= {"shared_experts", "moe_act"}  # inside the recomputed MoE block
    names = {name for m in modules for name in MODULE_GEMMS.get(m, ())}
    if not moe:
        names -= set(MODULE_GEMMS["moe"])
    tokens, t, h = unit_tokens(training, plan), plan.tp, model.hidden_size
    rows = tokens * h / (t if plan.sequence_parallel else 1)
    norm = norm_bytes(model, training, plan)
    moved, collectives, expert_comm = 0.0, 0, 0.0
    compute = _gemms_s([g for g in work.gemms if g.name in names], training, gpu, cal)
    if "mlp" in modules and not moe:
        moved += work.mlp_elementwise_bytes + rows * norm
        collectives += 2
    if moe and "moe" in modules:
        assert work.router is not None
        compute += gemm_time_s(work.router, gpu, cal)  # in bf16
        moved += work.mlp_elementwise_bytes
        collectives += 2 if model.shared_expert_width else 0
        gathered = work.expert_collective_bytes
        expert_comm = 2 * tp_collective_time_s(gathered, plan.expert_tp, tp_bandwidth_bytes_per_s)
    if moe and "shared_experts" in modules and model.shared_expert_width:
        moved += tokens * model.shared_expert_width / t * activation_bytes(model, training)
        collectives += 2
    if moe and "moe_act" in modules:
        width = model.expert_width / plan.expert_tp
        moved += expert_tokens(model, training, plan) * width * activation_bytes(model, training)
    if "layernorm" in modules:
        moved += rows * norm * ((moe and "moe" not in modules) + model.is_mla)
    if "mla_up_proj" in modules and model.is_mla:
        moved += 4.0 * rope_elements(model, tokens, t)
    compute += hbm_time_s(moved, gpu, cal)
    act_bytes = 2.0 * tokens * h
    comm = collectives * tp_collective_time_s(act_bytes, t, tp_bandwidth_bytes_per_s)
    exposed = max(0.0, comm - compute) if training.tp_comm_overlap else comm
    return compute + exposed + expert_comm, exposed + expert_comm
