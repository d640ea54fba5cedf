"""What one GPU keeps between a layer's forward and its backward, by micro-batch: the
activation terms of :mod:`pipette_cp.cost.memory.peak`.

- :func:`activation_bytes_per_layer` and :func:`moe_activation_bytes_per_layer`: a dense
  or mixture-of-experts layer (Korthikanti et al. 2022, Table 2, derived term by term;
  under FP8 the GEMM inputs Transformer Engine keeps in FP8; the MoE terms of
  :mod:`pipette_cp.cost.memory.moe_activations`; torchtitan's per-op checkpointing:
  :mod:`pipette_cp.cost.memory.recompute`), of the ``s b / cp`` tokens of a GPU;
- :func:`full_layer_activation_bytes`: a layer without any recomputation (also the
  working set of the layer being back-propagated);
- :func:`embedding_activation_bytes` and :func:`last_stage_head_bytes`: the first and
  last stage's extras (the multi-token prediction modules on the last);
- :func:`logits_bytes`: the last stage's vocabulary-parallel logits.
"""

from __future__ import annotations

from pipette_cp.cost.memory import moe_activations as memory_moe
from pipette_cp.cost.memory import recompute as memory_recompute
from pipette_cp.cost.memory.hybrid_activations import hybrid_kept_bytes
from pipette_cp.cost.stack.attention_variants import attention_element_bytes
from pipette_cp.cost.stack.frameworks import resolve_framework
from pipette_cp.cost.stack.kernels import (
    LOGITS_KEPT_BYTES,
    keeps_quantized_tensors,
    quantized_bytes,
    unfused_activation_extra_bytes,
    unfused_norm_extra_bytes,
    uses_fused_attention,
)
from pipette_cp.cost.stack.offload import offload_savings
from pipette_cp.cost.workload.flops import qkv_widths
from pipette_cp.cost.workload.latent_attention import latent_activation_bytes
from pipette_cp.cost.workload.lora import adapter_activation_bytes
from pipette_cp.cost.workload.parameters import layer_gemm_params_per_gpu, padded_vocab_size
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import TrainingSpec


def full_layer_activation_bytes(
    model: ModelSpec, training: TrainingSpec, plan: Plan, moe: bool = False
) -> float:
    """Bytes one layer (a mixture-of-experts one with ``moe``) stores for one micro-batch
    without any recomputation; ``s b / cp`` tokens on each GPU."""
    s, b, t = training.seq_length, plan.micro_batch_size, plan.tp
    tokens = s * b / plan.cp
    h, f = model.hidden_size, model.ffn_hidden_size
    q_width, kv_width, v_width = qkv_widths(model)  # v_head_dim with latent attention
    out_width = model.num_attention_heads * model.v_head_size
    drop = 1.0 if training.dropout else 0.0
    fused = uses_fused_attention(training, plan)
    # The bytes of a GEMM input kept for the weight gradient: 2, or under FP8 with
    # Transformer Engine the FP8 column-wise copy, 1 ("Performance considerations",
    # memory usage: TE saves the quantized input for backward; torchao keeps bf16).
    gemm_in = quantized_bytes(training) if keeps_quantized_tensors(training) else 2.0
    qkv_in, proj_kept, fc1_in, fc2_in = (_lora_input_bytes(training, m, gemm_in) for m in LINEARS)
    # Korthikanti et al. 2022 sec. 4.1: 2 norm inputs (2sbh each), QKV and FC1 inputs
    # (2sbh each), two 1-byte dropout masks (sbh each) -> 10sbh; replicated over tp
    # unless sequence parallel.  A norm written in PyTorch keeps more (cost.kernels).  A
    # MoE layer has no FC1 (its router and shared experts keep the norm output: memory_moe).
    fc1_in, norm_extra = (0.0 if moe else fc1_in), unfused_norm_extra_bytes(model, training, plan)
    per_h = 4.0 + qkv_in + fc1_in + 2.0 * drop + 2.0 * norm_extra
    # latent attention: the latents' norm inputs and outputs (cost.latent_attention)
    replicated = tokens * (h * per_h + latent_activation_bytes(model))
    if plan.sequence_parallel:
        replicated /= t
    # Same source, split over tp: Q, K (2 B each), V (2 B), output-projection input
    # (2 B) -> 8sbh for MHA; widths from the q/kv head counts (GQA).  Under FP8 the fused
    # attention keeps its bf16 output (the projection input) beside the FP8 copy.
    # FP8 attention keeps Q, K, V and its output in FP8 (cost.stack.attention_variants).
    proj_in = proj_kept + (
        2.0 if fused and proj_kept != 2.0 and not training.fp8_attention else 0.0
    )
    qkv = attention_element_bytes(training) * (q_width + kv_width + v_width)
    attention = tokens * (qkv + proj_in * out_width)
    # Same source: GeLU input and output (2 x 2 x 4h -> 16sbh); SwiGLU stores the
    # gate and up projections (2 x 2f) and its output (2f), the FC2 input.
    mlp = 0.0  # a MoE layer's MLP terms: memory_moe
    if not moe:
        mlp = tokens * f * ((4.0 if model.activation == "swiglu" else 2.0) + fc2_in)
        mlp += tokens * f * unfused_activation_extra_bytes(model, training)  # unfused SwiGLU
    split = (attention + mlp) / t
    # Same source: softmax output (2as^2b), dropout mask (as^2b) and output (2as^2b);
    # FlashAttention keeps only the fp32 log-sum-exp per row (4 B x a s b).  With cp a
    # GPU scores its s/cp queries against all s keys (unfused: Megatron-Core runs cp only
    # with TE attention, so this errs high); TE's ring attention keeps the log-sum-exp.
    heads = model.num_attention_heads
    if fused:
        core = 4.0 * heads * (s / plan.cp) * b / t
    elif plan.recompute == "selective":
        core = 0.0  # core_attn recomputed (without it: memory_recompute.module_savings)
    else:
        core = memory_recompute.unfused_core_bytes(model, training, plan)
    total = replicated + split + core
    if moe:
        return total + memory_moe.moe_mlp_activation_bytes(model, training, plan)
    # LoRA: the adapters' intermediates, the frozen weights' column-wise quantised copy
    lora = adapter_activation_bytes(model, training, plan)
    return total + lora + frozen_weight_copy_bytes(model, training, plan)


#: The linears of a dense layer in the order :func:`_lora_input_bytes` is asked for them.
LINEARS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


def _lora_input_bytes(training: TrainingSpec, linear: str, gemm_in: float) -> float:
    """Bytes per element of a linear's input kept for backward: ``gemm_in`` (its weight
    gradient's input: 2, or Transformer Engine's quantised copy); under LoRA a frozen
    linear needs none, and an adapted one keeps the bf16 input its adapter's A needs
    for A's weight gradient (Hu et al. 2021: only A and B are trained)."""
    if training.lora is None:
        return gemm_in
    return 2.0 if linear in training.lora.target_modules else 0.0


def frozen_weight_copy_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """Under LoRA with FP8 or NVFP4 (Transformer Engine), the column-wise quantised copy of
    one dense layer's frozen GEMM weights that each micro-batch's forward casts and keeps
    for the data gradient (Megatron-Bridge's PEFT recipes turn Transformer Engine's weight
    cache off, ``disable_parameter_transpose_cache``, in ``set_llama3_common_peft_configs``
    of ``scripts/performance/configs/llama/llama3_llm_finetune.py``): one quantised byte
    per weight, per micro-batch in flight; 0 otherwise."""
    if training.lora is None or not keeps_quantized_tensors(training):
        return 0.0
    return layer_gemm_params_per_gpu(model, plan.tp) * quantized_bytes(training)


def activation_bytes_per_layer(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """Bytes one dense transformer layer keeps for one micro-batch until its backward
    (the dense layers of a mixture-of-experts model too; its MoE layers:
    :func:`moe_activation_bytes_per_layer`).

    Korthikanti et al. 2022, Table 2, derived term by term: no TP
    ``sbh(34 + 5as/h)``, TP ``sbh(10 + 24/t + 5as/(ht))``, TP+SP
    ``sbh(34/t + 5as/(ht))``; selective recompute or FlashAttention drop the
    ``5as/h`` term; full recompute keeps the layer input, ``2sbh`` (``/t`` with
    sequence parallelism).  Context parallelism divides every term by cp.

    >>> from pipette_cp.specs.model import ModelSpec
    >>> from pipette_cp.specs.training import TrainingSpec
    >>> from pipette_cp.specs.layouts import make_plan
    >>> m = ModelSpec(name="gpt", num_layers=4, hidden_size=1024, num_attention_heads=16,
    ...               ffn_hidden_size=4096, vocab_size=51200, max_seq_length=2048)
    >>> tr = TrainingSpec(global_batch_size=8, seq_length=2048)
    >>> p = make_plan(num_layers=4, dp=1, pp=1, tp=1, micro_batch_size=1, flash_attention=False)
    >>> sbh = 2048 * 1024
    >>> activation_bytes_per_layer(m, tr, p) == sbh * (34 + 5 * 16 * 2048 / 1024)
    True
    """
    return kept_layer_bytes(model, training, plan, moe=False)


def moe_activation_bytes_per_layer(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """Bytes one mixture-of-experts layer keeps for one micro-batch until its backward:
    the attention part of :func:`activation_bytes_per_layer` and, instead of the dense
    MLP's terms, :func:`pipette_cp.cost.memory.moe_activations.moe_mlp_activation_bytes`; full
    recompute keeps the layer input alone."""
    return kept_layer_bytes(model, training, plan, moe=True)


def kept_layer_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan, moe: bool) -> float:
    if plan.recompute == "full":
        # Korthikanti et al. 2022 Table 2, full recompute: the layer input, 2sbh.
        tokens = training.seq_length * plan.micro_batch_size / plan.cp
        layer_input = 2.0 * tokens * model.hidden_size
        return layer_input / plan.tp if plan.sequence_parallel else layer_input
    if (plan.recompute == "selective" and not moe and uses_fused_attention(training, plan)
            and resolve_framework(training.framework).op_selective_recompute):  # fmt: skip
        return memory_recompute.op_selective_layer_bytes(model, training, plan)  # torchtitan's
    kept = full_layer_activation_bytes(model, training, plan, moe)
    if plan.recompute_modules is not None:  # Megatron-Core's named modules
        kept -= memory_recompute.module_savings(model, training, plan, moe)
    return kept - offload_savings(model, training, plan, moe)  # fine-grained offloading


def embedding_activation_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """Per in-flight micro-batch extras of the first stage (``s b / cp`` tokens a GPU)."""
    s, b = training.seq_length / plan.cp, plan.micro_batch_size
    mask = s * b * model.hidden_size / (plan.tp if plan.sequence_parallel else 1)
    # Megatron theoretical_memory_usage.py: input ids (8sb, int64, replicated over
    # tp) and the embedding dropout mask (sbh, 1 B) per in-flight micro-batch.
    return 8.0 * s * b + (mask if training.dropout else 0.0)


def last_stage_head_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """Final-norm input and LM-head input, 2sbh each (Megatron theoretical memory, pp=1),
    of the ``s b / cp`` tokens of a GPU; and of each multi-token prediction module (on the
    last stage: cost.boundary) its block's kept bytes (a layer of the last layer's kind)
    and the inputs of its enorm, hnorm (2sbh each), eh_proj (4sbh), final norm and of the
    shared head (2sbh each)."""
    sbh = training.seq_length / plan.cp * plan.micro_batch_size * model.hidden_size
    shard = plan.tp if plan.sequence_parallel else 1
    if not model.mtp_layers:
        return 4.0 * sbh / shard
    if model.is_hybrid:  # the sublayers of mtp_hybrid_pattern
        block = sum(
            hybrid_kept_bytes(model, training, plan, k) for k in model.mtp_hybrid_pattern or ""
        )
    else:
        block = kept_layer_bytes(model, training, plan, model.is_moe_layer(model.num_layers - 1))
    return 4.0 * sbh / shard + model.mtp_layers * (block + 12.0 * sbh / shard)


def logits_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """Vocabulary-parallel logits of one micro-batch on the last stage.

    The LM head writes ``s b V/t`` bf16 logits (2 B; ``/ cp``: a GPU's tokens) and the
    cross-entropy keeps an fp32 copy (4 B) for its backward (Megatron
    ``_VocabParallelCrossEntropy``: ``logits.float()``, exp in place, saved for
    backward): 6 B per element at the peak.  A framework with its own unfused loss says
    what it keeps (``Framework.loss_logit_bytes``: torchtitan's eager fp32 loss, 12 B).
    Under 1F1B the last stage runs each micro-batch's backward right after its forward,
    so one micro-batch of logits is alive: of the main head and of every multi-token
    prediction depth (each computes its loss in the forward, kept for the backward).
    """
    vocab = padded_vocab_size(model, plan.tp)
    kept = LOGITS_KEPT_BYTES[training.fused_cross_entropy]  # 2 B when the loss is fused
    own = resolve_framework(training.framework).loss_logit_bytes
    if own is not None and not training.fused_cross_entropy:  # the framework's own loss
        kept = own
    heads = 1 + model.mtp_layers
    return heads * kept * training.seq_length / plan.cp * plan.micro_batch_size * vocab / plan.tp
