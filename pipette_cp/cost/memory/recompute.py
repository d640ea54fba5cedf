"""What a layer keeps under selective recomputation: Megatron-Core's named modules, or a
framework's own selective recomputation.

**Megatron-Core's modules** (``--recompute-granularity selective --recompute-modules``,
``TransformerConfig.recompute_modules``; :func:`module_savings`).  ``core_attn``, the
default, is the plan's plain ``selective`` (:mod:`pipette_cp.cost.memory.activations`: the
unfused attention core's scores are not kept).  The others drop, from the layer terms of
:mod:`~pipette_cp.cost.memory.activations` and :mod:`~pipette_cp.cost.memory.moe_activations`
(Megatron-Core's Transformer Engine layer spec, which fuses a dense layer's norms into the
next GEMM; "core_attn", "mlp", "moe" and "shared_experts" checkpoint their module,
keeping its input; "moe_act", "layernorm" and "mla_up_proj" discard their output and
recompute it before the backward):

- ``mlp``: a dense layer's MLP keeps its input (the residual the fused norm reads,
  counted already): FC1's saved input and the inner terms (FC1 output, FC2 input) go;
- ``mla_up_proj``: latent attention's up-projected and rotated Q, K and V;
- ``layernorm``: the output of the norms that are modules of their own, the pre-MLP
  norm of a mixture-of-experts layer (the router's input, 2 B x h per routed token) and
  latent attention's input norm (the down-projections' saved input, under bf16; under
  FP8 the GEMM keeps its own FP8 copy, which stays: errs high);
- ``moe``: the whole MoE block (router, experts, combine, shared experts) keeps its
  input alone (2 B x h per routed token);
- ``shared_experts``: the shared experts' terms;
- ``moe_act``: the experts' activation output, FC2's input (2 B per element under bf16;
  under FP8, FC2's FP8 copy stays: errs high).

The layer being back-propagated still holds everything again (the temporary working
set of :mod:`pipette_cp.cost.memory.peak` is the full layer either way).

**A framework's own selective recomputation.**

The plan's ``selective`` is Megatron's (``--recompute-granularity selective``: the
attention core recomputed, every other activation kept; :mod:`pipette_cp.cost.memory.peak`).
torchtitan's ``selective`` (``activation_checkpoint.selective_ac_option = "op"``, its
train_configs' default) is PyTorch's per-op selective activation checkpointing of every
transformer block with torchtitan's policy (``torchtitan/parallelisms/parallelize_llama.py``
``_custom_policy`` at 9dec370): it saves the outputs of the ops in its ``_save_list``
(``aten.mm``, the SDPA flash and efficient kernels, the TP reduce-scatter, ``abs`` and
``max``) except every second ``mm`` of a block, and recomputes everything else in the
backward.  A block runs its matmuls in the order Q, K, V, output projection, then the MLP
(SwiGLU: gate, up, down; else FC1, FC2), so it keeps (:func:`op_selective_layer_bytes`):

- its input (the checkpoint's input, 2 B x h; ``/ tp`` with sequence parallelism);
- the outputs of the odd-numbered matmuls (2 B each: Q, V, the gate or FC1 and, with
  SwiGLU, the down projection), column-parallel widths ``/ tp``, a row-parallel output the
  full ``h`` (before its reduce-scatter);
- the fused attention's output (2 B x the query width ``/ tp``) and its fp32
  log-sum-exp (4 B per head);
- with tensor parallelism, the outputs of the two sequence-parallel reduce-scatters
  (2 B x h / tp each).

Under torchao's Float8 the same set is taken (assumption: torchtitan's FP8 runs measured
the memory of their BF16 twins, 76.8 and 61.8 GiB against 77.0 and 62.0); the time model
keeps Megatron's selective recomputation for it (:mod:`pipette_cp.cost.compute.model_chunks`).
"""

from __future__ import annotations

from pipette_cp.cost.memory import moe_activations as memory_moe
from pipette_cp.cost.stack.kernels import (
    keeps_quantized_tensors,
    quantized_bytes,
    unfused_activation_extra_bytes,
    uses_fused_attention,
)
from pipette_cp.cost.workload.flops import fc1_factor, qkv_widths
from pipette_cp.cost.workload.tokens import expert_tokens, rank_tokens, unit_tokens
from pipette_cp.specs.knobs.recompute import selective_modules
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import TrainingSpec

#: Bytes of one saved bf16 element and of one fp32 log-sum-exp entry.
_BF16, _LSE = 2.0, 4.0


def op_selective_layer_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """Bytes one dense layer keeps for one micro-batch under torchtitan's per-op selective
    checkpointing (module docstring), ``s b / cp`` tokens on each GPU."""
    t = plan.tp
    tokens = training.seq_length * plan.micro_batch_size / plan.cp
    h, f, d = model.hidden_size, model.ffn_hidden_size, model.head_size
    q, kv = model.num_attention_heads * d, model.kv_heads * d
    # (width per token on this rank) of every matmul output, in the block's call order
    mlp = [f / t, f / t, float(h)] if fc1_factor(model) == 2 else [f / t, float(h)]
    outputs = [q / t, kv / t, kv / t, float(h), *mlp]
    kept = sum(outputs[::2])  # the 1st, 3rd, 5th, ... matmul of the block
    layer_input = h / t if plan.sequence_parallel else float(h)
    scattered = 2.0 * h / t if t > 1 and plan.sequence_parallel else 0.0
    per_token = _BF16 * (layer_input + kept + q / t + scattered)
    return tokens * (per_token + _LSE * model.num_attention_heads / t)


def unfused_core_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """The unfused attention core's kept bytes of one layer (Korthikanti et al. 2022:
    softmax output 2 B, dropout mask 1 B and output 2 B per score; 2 B without dropout),
    the ``s/cp`` queries of a GPU against all ``s`` keys, split over tp."""
    s, drop = training.seq_length, 1.0 if training.dropout else 0.0
    heads = model.num_attention_heads
    return heads * (s / plan.cp) * s * plan.micro_batch_size * (2.0 + 3.0 * drop) / plan.tp


def module_savings(model: ModelSpec, training: TrainingSpec, plan: Plan, moe: bool) -> float:
    """Bytes Megatron-Core's ``plan.recompute_modules`` keep out of one layer's stored
    activations (a mixture-of-experts layer with ``moe``) beyond the plain ``selective``
    (the module docstring); negative when ``core_attn`` is left out and the unfused
    attention core is kept after all."""
    if plan.recompute_modules is None:
        return 0.0
    modules = selective_modules(plan)
    tokens, t = unit_tokens(training, plan), plan.tp
    h, routed = model.hidden_size, rank_tokens(training, plan)
    rows = tokens / t if plan.sequence_parallel else tokens  # replicated terms' tokens
    gemm_in = quantized_bytes(training) if keeps_quantized_tensors(training) else 2.0
    saved = 0.0
    if "core_attn" not in modules and not uses_fused_attention(training, plan):
        saved -= unfused_core_bytes(model, training, plan)
    if "mlp" in modules and not moe:
        inner = (2.0 * fc1_factor(model) + gemm_in) + unfused_activation_extra_bytes(
            model, training
        )
        saved += rows * h * gemm_in + tokens * model.ffn_hidden_size * inner / t
    if "mla_up_proj" in modules and model.is_mla:
        saved += tokens * 2 * sum(qkv_widths(model)) / t
    if "layernorm" in modules:
        if moe and "moe" not in modules:  # the pre-MLP norm's output, the router's input
            saved += 2.0 * h * routed
        if model.is_mla and gemm_in == 2.0:  # the input norm's output (bf16 only)
            saved += rows * h * gemm_in
    if moe and "moe" in modules:  # the MoE block keeps its input alone
        return saved + memory_moe.moe_mlp_activation_bytes(model, training, plan) - 2.0 * h * routed
    if moe and "shared_experts" in modules:
        saved += memory_moe.shared_expert_activation_bytes(model, training, plan)
    if moe and "moe_act" in modules and gemm_in == 2.0:
        width = model.expert_width / plan.expert_tp
        saved += expert_tokens(model, training, plan) * width * gemm_in
    return saved
