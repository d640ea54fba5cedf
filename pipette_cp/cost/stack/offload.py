"""Megatron-Core's fine-grained activation offloading (``plan.offload_modules``): what
leaves the GPU and what the transfers cost.

``--fine-grained-activation-offloading --offload-modules ...`` (Megatron-Core's
``fine_grained_activation_offloading`` guide): each named module's saved-for-backward
inputs are copied to pinned host memory once its forward has run, and copied back before
its backward, on a side stream that overlaps the layers' compute.  By module, the terms
of :mod:`pipette_cp.cost.memory.activations` and
:mod:`pipette_cp.cost.memory.moe_activations` they take off the GPU (per layer and
micro-batch):

- ``attn_norm`` and ``mlp_norm``: the input of the norm before the attention, or before the
  MLP (2 B x h per token, ``/ tp`` with sequence parallelism);
- ``core_attn``: the attention core's Q, K and V (2 B each, column-parallel widths
  ``/ tp``) and, under FP8 / NVFP4 with a fused kernel, its bf16 output;
- ``attn_proj``: the output projection's saved input (the quantised copy under FP8 /
  NVFP4, else the bf16 attention output);
- ``expert_fc1``: the routed copies' FC1 input on the busiest GPU;
- ``moe_act``: the experts' activation input (FC1's output, 2 B per element).

The layer in its backward holds everything again (the temporary working set of
:mod:`pipette_cp.cost.memory.peak` counts one whole layer), so nothing is added for the
reload.  The transfers run over the host link at
:data:`pipette_cp.cost.stack.frameworks.HOST_LINK_BYTES_PER_S` (PCIe, an assumption that
errs slow on Grace-coupled GPUs, whose NVLink-C2C is faster), each layer's copy hidden
behind that layer's forward (to host) or backward (back), the rest exposed
(:func:`pipette_cp.cost.compute.model_chunks.layer_times`).
"""

from __future__ import annotations

from pipette_cp.cost.stack.attention_variants import attention_element_bytes
from pipette_cp.cost.stack.kernels import (
    keeps_quantized_tensors,
    quantized_bytes,
    uses_fused_attention,
)
from pipette_cp.cost.workload.flops import fc1_factor, qkv_widths
from pipette_cp.cost.workload.tokens import expert_tokens, rank_tokens, unit_tokens
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import OffloadModule, TrainingSpec

#: The offload modules of a mixture-of-experts layer's MLP (a dense layer has none).
EXPERT_MODULES: tuple[OffloadModule, ...] = ("expert_fc1", "moe_act")


def _module_bytes(
    model: ModelSpec, training: TrainingSpec, plan: Plan, module: OffloadModule, moe: bool
) -> float:
    """Bytes ``module`` takes off the GPU for one layer and micro-batch (module
    docstring); 0 for an expert module of a dense layer."""
    tokens, t = unit_tokens(training, plan), plan.tp
    quantized = keeps_quantized_tensors(training)
    gemm_in = quantized_bytes(training) if quantized else 2.0
    out_width = model.num_attention_heads * model.v_head_size
    if module in ("attn_norm", "mlp_norm"):
        return 2.0 * model.hidden_size * rank_tokens(training, plan)
    if module == "core_attn":  # Q, K and V, 2 B each (1 B under FP8 attention)
        widths = attention_element_bytes(training) * sum(qkv_widths(model))
        fused = uses_fused_attention(training, plan) and not training.fp8_attention
        fused_output = 2.0 * out_width if quantized and fused else 0.0
        return tokens * (widths + fused_output) / t
    if module == "attn_proj":
        return tokens * gemm_in * out_width / t
    if not moe:
        return 0.0
    copies = expert_tokens(model, training, plan)
    if module == "expert_fc1":
        return copies * model.expert_hidden_size * gemm_in
    return copies * 2.0 * fc1_factor(model) * model.expert_width / plan.expert_tp  # moe_act


def offload_savings(model: ModelSpec, training: TrainingSpec, plan: Plan, moe: bool) -> float:
    """Bytes one layer (a mixture-of-experts one with ``moe``) no longer keeps on the GPU
    for one micro-batch: the sum over ``plan.offload_modules``; 0 without offloading."""
    modules = plan.offload_modules or ()
    return sum(_module_bytes(model, training, plan, m, moe) for m in modules)
