"""What one sublayer of a hybrid Mamba-Transformer model keeps for its backward.

The terms of :func:`pipette_cp.cost.memory.activations.full_layer_activation_bytes`,
sublayer by sublayer (Korthikanti et al. 2022, Table 2, derived term by term), on the
``s b`` tokens of a GPU; replicated over tp unless sequence parallel, the rest split:

- every sublayer: its pre-norm's input (2 B per element of ``h``) and, with dropout,
  the residual's 1-byte mask;
- ``*``: the QKV input, queries, keys, values and the projection input, and the
  attention core's log-sum-exp (fused) or scores (unfused, none under selective
  recompute), as a dense layer's attention;
- ``-``: the FC1 input and the activation's input and output (FC2 input);
- ``E``: the router, experts, combine and shared experts of
  :func:`pipette_cp.cost.memory.moe_activations.moe_mlp_activation_bytes`;
- ``M`` (Megatron-Core's default memory-efficient path, ``mamba_split_conv1d_scan_combined``,
  which recomputes the convolution in its backward): the ``in_proj`` input, its output
  ``z, x, B, C, dt`` (2 B each), the scan's output before the gated norm (2 B per
  ``d_inner``), the ``out_proj`` input, and per token the fp32 ``dt`` and cumulative
  decay of every head and the norm's reciprocal deviation of every group (assumption:
  the saved tensors of ``mamba_ssm``'s ``MambaSplitConv1dScanCombinedFn``).

Under FP8 / NVFP4 with Transformer Engine a GEMM's kept input is its quantised copy.
Full recomputation keeps the sublayer's input alone (``2 s b h``).  Megatron-Core's named
recompute modules (:func:`hybrid_module_savings`) act on the sublayers that have them:
``core_attn`` on ``*``; ``mlp`` on ``-``; ``moe``, ``moe_act``, ``shared_experts`` and
``layernorm`` on ``E`` (the other sublayers' norms are fused into their first linear,
Transformer Engine's ``LayerNormColumnParallelLinear``, and keep no output of their own).
"""

from __future__ import annotations

from pipette_cp.cost.memory import moe_activations as memory_moe
from pipette_cp.cost.memory import recompute as memory_recompute
from pipette_cp.cost.stack.attention_variants import attention_element_bytes
from pipette_cp.cost.stack.kernels import (
    keeps_quantized_tensors,
    quantized_bytes,
    unfused_activation_extra_bytes,
    unfused_norm_extra_bytes,
    uses_fused_attention,
)
from pipette_cp.cost.workload.flops import fc1_factor, qkv_widths
from pipette_cp.cost.workload.hybrid import present_symbols
from pipette_cp.cost.workload.tokens import expert_tokens, rank_tokens
from pipette_cp.specs.knobs.recompute import selective_modules
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import TrainingSpec

#: Bytes per token and head the Mamba scan keeps in fp32 (``dt`` and its cumulative
#: decay), and per token and group (the gated norm's reciprocal deviation).
SCAN_HEAD_BYTES = 8.0
SCAN_GROUP_BYTES = 4.0


def hybrid_full_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan, symbol: str) -> float:
    """Bytes one sublayer stores for one micro-batch without recomputation (module docstring)."""
    s, b, t = training.seq_length, plan.micro_batch_size, plan.tp
    tokens, h = s * b / plan.cp, model.hidden_size
    shard = t if plan.sequence_parallel else 1
    gemm_in = quantized_bytes(training) if keeps_quantized_tensors(training) else 2.0
    drop = 1.0 if training.dropout else 0.0
    per_h = 2.0 + drop + 2.0 * unfused_norm_extra_bytes(model, training, plan)
    if symbol == "E":
        return tokens * h * per_h / shard + memory_moe.moe_mlp_activation_bytes(
            model, training, plan
        )
    replicated = tokens * h * (per_h + gemm_in) / shard  # and the first GEMM's input
    if symbol == "-":
        f = model.ffn_hidden_size
        inner = (4.0 if model.activation == "swiglu" else 2.0) + gemm_in
        inner += unfused_activation_extra_bytes(model, training)
        return replicated + tokens * f * inner / t
    if symbol == "M":
        heads, groups = model.mamba_num_heads or 0, model.mamba_num_groups
        widths = 2.0 * model.mamba_in_proj_width + (2.0 + gemm_in) * model.mamba_inner
        fp32 = SCAN_HEAD_BYTES * heads + SCAN_GROUP_BYTES * groups
        return replicated + tokens * (widths + fp32) / t
    q_width, kv_width, v_width = qkv_widths(model)
    fused = uses_fused_attention(training, plan)
    proj_in = gemm_in + (2.0 if fused and gemm_in != 2.0 and not training.fp8_attention else 0.0)
    out_width = model.num_attention_heads * model.v_head_size
    qkv = attention_element_bytes(training) * (q_width + kv_width + v_width)
    split = tokens * (qkv + proj_in * out_width) / t
    if fused:
        core = 4.0 * model.num_attention_heads * (s / plan.cp) * b / t
    elif plan.recompute == "selective":
        core = 0.0
    else:
        core = memory_recompute.unfused_core_bytes(model, training, plan)
    return replicated + split + core


def hybrid_kept_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan, symbol: str) -> float:
    """Bytes one sublayer keeps for one micro-batch until its backward."""
    if plan.recompute == "full":
        tokens = training.seq_length * plan.micro_batch_size / plan.cp
        layer_input = 2.0 * tokens * model.hidden_size
        return layer_input / plan.tp if plan.sequence_parallel else layer_input
    full = hybrid_full_bytes(model, training, plan, symbol)
    return full - hybrid_module_savings(model, training, plan, symbol)


def hybrid_module_savings(
    model: ModelSpec, training: TrainingSpec, plan: Plan, symbol: str
) -> float:
    """Bytes the named recompute modules take off one sublayer (the module docstring), as
    :func:`pipette_cp.cost.memory.recompute.module_savings` counts them for a whole layer:
    the MoE block recomputed keeps its input alone; otherwise the pre-MLP norm's output
    (``layernorm``), the shared experts' terms and the experts' activation inputs (bf16,
    ``moe_act``); the MLP's inputs and inner terms (``mlp``); an unfused attention core
    kept after all when ``core_attn`` is left out (negative); 0 without named modules."""
    if plan.recompute_modules is None:
        return 0.0
    modules = selective_modules(plan)
    tokens, t = training.seq_length * plan.micro_batch_size / plan.cp, plan.tp
    h, routed = model.hidden_size, rank_tokens(training, plan)
    gemm_in = quantized_bytes(training) if keeps_quantized_tensors(training) else 2.0
    if symbol == "*" and "core_attn" not in modules and not uses_fused_attention(training, plan):
        return -memory_recompute.unfused_core_bytes(model, training, plan)
    if symbol == "-" and "mlp" in modules:
        rows = tokens / t if plan.sequence_parallel else tokens
        inner = 2.0 * fc1_factor(model) + gemm_in + unfused_activation_extra_bytes(model, training)
        return rows * h * gemm_in + tokens * model.ffn_hidden_size * inner / t
    if symbol != "E":
        return 0.0
    if "moe" in modules:  # the block keeps its input alone
        return memory_moe.moe_mlp_activation_bytes(model, training, plan) - 2.0 * h * routed
    saved = 2.0 * h * routed if "layernorm" in modules else 0.0
    if "shared_experts" in modules:
        saved += memory_moe.shared_expert_activation_bytes(model, training, plan)
    if "moe_act" in modules and gemm_in == 2.0:
        width = model.expert_width / plan.expert_tp
        saved += expert_tokens(model, training, plan) * width * gemm_in
    return saved


def largest_hybrid_full_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """:func:`hybrid_full_bytes` of the largest sublayer the model has."""
    return max(hybrid_full_bytes(model, training, plan, k) for k in present_symbols(model))
