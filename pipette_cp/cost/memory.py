"""Peak memory of one GPU of each pipeline stage: what nvidia-smi would show.

Parts (all bytes, for the most loaded GPU of the stage):

- weights, gradients, optimizer state: Megatron mixed-precision Adam keeps a
  bf16/fp16 weight (2 B), an fp32 main gradient (4 B) and an fp32 master copy
  plus two fp32 moments (12 B) per parameter, 18 B in all; the distributed
  optimizer (ZeRO-1) shards the 12 B over the dp x cp ranks (routed experts: over the
  expert data-parallel ranks).  FP8 training (Transformer Engine) keeps the same state
  plus FP8 copies of the layer GEMM weights (:mod:`pipette_cp.cost.parameters`).
- activations: per layer per micro-batch (Korthikanti et al. 2022, Table 2,
  derived term by term so that GQA, SwiGLU and any FFN width follow; under FP8 the
  GEMM inputs Transformer Engine keeps in FP8; MoE layers the terms of
  :mod:`pipette_cp.cost.memory_moe` instead of the dense MLP's), times the layers of the
  stage, times the micro-batches in flight under (interleaved) 1F1B; plus the embedding's
  inputs on the first stage and the final norm's on the last.  A GPU keeps ``s b / cp``
  tokens of every term (context parallelism; unfused attention scores ``s/cp x s``).
  torchtitan's ``selective`` is its per-op checkpointing (:mod:`~pipette_cp.cost.memory_recompute`).
- logits: the last stage's vocabulary-parallel logits, bf16 and fp32 copies.
- temporary: the working set of the layer being back-propagated (gradients of
  its activations, and its re-materialised activations under recompute), the
  pipeline send/receive buffers, the MoE dispatch buffers and the context-parallel ring's.
- runtime: CUDA context, NCCL buffers and allocator reserve/fragmentation
  (:data:`pipette_cp.cost.calibration.MEMORY_CALIBRATION`, fitted on BLOOM).

Their sum is the predicted peak.  ``fits`` is judged on an upper bound, the peak
plus the framework's calibrated ``memory_margin`` (a fraction of the memory
allocated per micro-batch: activations, logits and temporaries, where the
under-predictions of the published runs that ran out of memory concentrate),
against the GPU's memory less a headroom (``training.memory_headroom_bytes`` or ``_fraction``).  Where
the sources leave a choice the model errs high.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import NamedTuple

from pipette_cp.cost import memory_fsdp2, memory_moe, memory_recompute, parameters
from pipette_cp.cost.boundary import mtp_param_split
from pipette_cp.cost.calibration import MEMORY_CALIBRATION, MemoryCalibration
from pipette_cp.cost.framework import resolve_framework
from pipette_cp.cost.kernels import (
    LOGITS_KEPT_BYTES,
    keeps_fp8_tensors,
    unfused_activation_extra_bytes,
    unfused_norm_extra_bytes,
    uses_fp8,
    uses_fused_attention,
)
from pipette_cp.cost.latent_attention import latent_activation_bytes
from pipette_cp.cost.memory_limits import (
    in_flight_microbatches,
    num_microbatches,
    usable_memory_bytes,  # noqa: F401 (re-exported)
)
from pipette_cp.cost.parameters import (
    layer_params_per_gpu,  # noqa: F401 (re-exported)
    padded_vocab_size,
    stage_params_per_gpu,  # noqa: F401 (re-exported)
    state_bytes_per_param,
)
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import GRADIENT_SHARDING, TrainingSpec
from pipette_cp.units import FP8_BYTES


@dataclass(frozen=True)
class MemoryBreakdown:
    """Peak memory of one GPU, by part, bytes."""

    weights: float
    gradients: float
    optimizer_state: float
    activations: float
    logits: float
    temporary: float
    runtime: float
    #: the calibrated allowance on top of the peak (not a part: :attr:`bound_bytes`)
    margin: float = 0.0

    @property
    def dynamic_bytes(self) -> float:
        """What is allocated and freed every micro-batch: activations, logits, temporaries."""
        return self.activations + self.logits + self.temporary

    @property
    def bound_bytes(self) -> float:
        """The upper bound ``fits`` is judged on: the predicted peak plus the margin."""
        return self.total_bytes + self.margin

    @property
    def total_bytes(self) -> float:
        """The predicted peak: the sum of every part, bytes."""
        return (
            self.weights
            + self.gradients
            + self.optimizer_state
            + self.activations
            + self.logits
            + self.temporary
            + self.runtime
        )

    def as_dict(self) -> dict[str, float]:
        """The parts by name (for reports; they sum to the peak), bytes."""
        parts = asdict(self)
        del parts["margin"]
        return parts


# -------------------------------------------------------------------- activations
def _full_layer_activation_bytes(
    model: ModelSpec, training: TrainingSpec, plan: Plan, moe: bool = False
) -> float:
    """Bytes one layer (a mixture-of-experts one with ``moe``) stores for one micro-batch
    without any recomputation; ``s b / cp`` tokens on each GPU."""
    s, b, t = training.seq_length, plan.micro_batch_size, plan.tp
    tokens = s * b / plan.cp
    h, f = model.hidden_size, model.ffn_hidden_size
    q_width = model.num_attention_heads * model.head_size
    kv_width = model.kv_heads * model.head_size
    # value and attention-output widths (v_head_dim with latent attention)
    v_width = model.kv_heads * model.v_head_size
    out_width = model.num_attention_heads * model.v_head_size
    drop = 1.0 if training.dropout else 0.0
    fused = uses_fused_attention(training, plan)
    # The bytes of a GEMM input kept for the weight gradient: 2, or under FP8 with
    # Transformer Engine the FP8 column-wise copy, 1 ("Performance considerations",
    # memory usage: TE saves the quantized input for backward; torchao keeps bf16).
    gemm_in = float(FP8_BYTES) if keeps_fp8_tensors(training) else 2.0
    # Korthikanti et al. 2022 sec. 4.1: 2 norm inputs (2sbh each), QKV and FC1 inputs
    # (2sbh each), two 1-byte dropout masks (sbh each) -> 10sbh; replicated over tp
    # unless sequence parallel.  A norm written in PyTorch keeps more (cost.kernels).  A
    # MoE layer has no FC1 (its router and shared experts keep the norm output: memory_moe).
    fc1_in, norm_extra = (0.0 if moe else gemm_in), unfused_norm_extra_bytes(model, training, plan)
    per_h = 4.0 + gemm_in + fc1_in + 2.0 * drop + 2.0 * norm_extra
    # latent attention: the latents' norm inputs and outputs (cost.latent_attention)
    replicated = tokens * (h * per_h + latent_activation_bytes(model))
    if plan.sequence_parallel:
        replicated /= t
    # Same source, split over tp: Q, K (2 B each), V (2 B), output-projection input
    # (2 B) -> 8sbh for MHA; widths from the q/kv head counts (GQA).  Under FP8 the fused
    # attention keeps its bf16 output (the projection input) beside the FP8 copy.
    proj_in = gemm_in + (2.0 if fused and gemm_in != 2.0 else 0.0)
    attention = tokens * (2 * q_width + 2 * kv_width + 2 * v_width + proj_in * out_width)
    # Same source: GeLU input and output (2 x 2 x 4h -> 16sbh); SwiGLU stores the
    # gate and up projections (2 x 2f) and its output (2f), the FC2 input.
    mlp = 0.0  # a MoE layer's MLP terms: memory_moe
    if not moe:
        mlp = tokens * f * ((4.0 if model.activation == "swiglu" else 2.0) + gemm_in)
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
        core = 0.0
    else:
        core = heads * (s / plan.cp) * s * b * (2.0 + 3.0 * drop) / t
    total = replicated + split + core
    return (total + memory_moe.moe_mlp_activation_bytes(model, training, plan)) if moe else total


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
    return _kept_layer_bytes(model, training, plan, moe=False)


def moe_activation_bytes_per_layer(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """Bytes one mixture-of-experts layer keeps for one micro-batch until its backward:
    the attention part of :func:`activation_bytes_per_layer` and, instead of the dense
    MLP's terms, :func:`pipette_cp.cost.memory_moe.moe_mlp_activation_bytes`; full
    recompute keeps the layer input alone."""
    return _kept_layer_bytes(model, training, plan, moe=True)


def _kept_layer_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan, moe: bool) -> float:
    if plan.recompute == "full":
        # Korthikanti et al. 2022 Table 2, full recompute: the layer input, 2sbh.
        tokens = training.seq_length * plan.micro_batch_size / plan.cp
        layer_input = 2.0 * tokens * model.hidden_size
        return layer_input / plan.tp if plan.sequence_parallel else layer_input
    if (plan.recompute == "selective" and not moe and uses_fused_attention(training, plan)
            and resolve_framework(training.framework).op_selective_recompute):  # fmt: skip
        return memory_recompute.op_selective_layer_bytes(model, training, plan)  # torchtitan's
    return _full_layer_activation_bytes(model, training, plan, moe)


def _embedding_activation_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """Per in-flight micro-batch extras of the first stage (``s b / cp`` tokens a GPU)."""
    s, b = training.seq_length / plan.cp, plan.micro_batch_size
    mask = s * b * model.hidden_size / (plan.tp if plan.sequence_parallel else 1)
    # Megatron theoretical_memory_usage.py: input ids (8sb, int64, replicated over
    # tp) and the embedding dropout mask (sbh, 1 B) per in-flight micro-batch.
    return 8.0 * s * b + (mask if training.dropout else 0.0)


def _last_stage_head_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """Final-norm input and LM-head input, 2sbh each (Megatron theoretical memory, pp=1),
    of the ``s b / cp`` tokens of a GPU; and of each multi-token prediction module (on the
    last stage: cost.boundary) its block's kept bytes (a layer of the last layer's kind)
    and the inputs of its enorm, hnorm (2sbh each), eh_proj (4sbh), final norm and of the
    shared head (2sbh each)."""
    sbh = training.seq_length / plan.cp * plan.micro_batch_size * model.hidden_size
    shard = plan.tp if plan.sequence_parallel else 1
    if not model.mtp_layers:
        return 4.0 * sbh / shard
    block = _kept_layer_bytes(model, training, plan, model.is_moe_layer(model.num_layers - 1))
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


def _temporary_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """Transient working set on top of what is stored (assumptions, err high)."""
    s, b = training.seq_length / plan.cp, plan.micro_batch_size
    full = _full_layer_activation_bytes(model, training, plan)
    if model.is_moe:  # the largest layer kind of the model
        moe = _full_layer_activation_bytes(model, training, plan, moe=True)
        full = max(full, moe) if model.num_dense_layers else moe
    # Backward of one layer: gradients of its activations are alive at once with the
    # stored activations; bounded by one layer's full activation size (assumption).
    temp = full
    # Full recompute re-materialises one layer's activations before its backward
    # (Korthikanti et al. 2022 sec. 5: the working set of one layer).
    if plan.recompute == "full":
        temp += full
    if plan.sharding in GRADIENT_SHARDING:
        # ZeRO-2/3: one layer's full gradient before its reduce-scatter; ZeRO-3 also the
        # gathered weights of the layer in use and of the one prefetched (2 layers; FSDP
        # prefetches one unit ahead: Zhao et al. 2023, "PyTorch FSDP", sec. 3.3).
        fw = resolve_framework(training.framework)
        layer = parameters.largest_layer_params_per_gpu(model, plan)
        temp += layer * fw.gradient_bytes
        if plan.sharding == "optim_grads_params":
            temp += 2 * layer * fw.weight_bytes
    if uses_fp8(training) and not parameters.fp8_weight_bytes_per_layer(model, training, plan):
        # FP8 weights not kept: those of the layer being computed (row- and column-wise)
        gemm = parameters.largest_layer_gemm_params_per_gpu(model, plan)
        temp += gemm * parameters.FP8_WEIGHT_BYTES
    if plan.pp > 1:
        # Pipeline send and receive buffers of activations and their gradients,
        # 2sbh each (/t with sequence parallelism): one pair per direction.
        shard = plan.tp if plan.sequence_parallel else 1
        temp += 4 * 2.0 * s * b * model.hidden_size / shard
    # One MoE layer's dispatch/combine buffers; the context-parallel ring's K/V chunks.
    temp += memory_moe.moe_temporary_bytes(model, training, plan)
    return temp + memory_moe.cp_temporary_bytes(model, training, plan)


def stage_memory(
    model: ModelSpec,
    training: TrainingSpec,
    plan: Plan,
    stage: int,
    calibration: MemoryCalibration = MEMORY_CALIBRATION,
) -> MemoryBreakdown:
    """Peak memory of the most loaded GPU of pipeline ``stage`` (0-based).

    Parameters
    ----------
    model, training, plan
        The model, the job and the layout.
    stage
        Pipeline stage, ``0 <= stage < plan.pp``.
    calibration
        Runtime constant and allocator fraction (default: the fitted table).

    Returns
    -------
    MemoryBreakdown
        Bytes by part; ``total_bytes`` is the predicted nvidia-smi peak,
        ``bound_bytes`` the upper bound with the framework's calibrated margin.
    """
    assert 0 <= stage < plan.pp, f"stage {stage} outside 0..{plan.pp - 1}"
    return _stage(model, training, plan, stage, _shared(model, training, plan, calibration))


class _Shared(NamedTuple):
    """The terms every stage of a plan shares (computed once per plan), bytes."""

    state_per_param: tuple[float, float, float]
    expert_state_per_param: tuple[float, float, float]
    microbatches: int
    per_layer: float
    moe_per_layer: float
    embedding: float
    head: float
    logits: float
    temporary: float
    runtime_constant: float
    allocator_fraction: float
    margin_fraction: float


def _shared(
    model: ModelSpec, training: TrainingSpec, plan: Plan, calibration: MemoryCalibration
) -> _Shared:
    fw = resolve_framework(training.framework)
    constant = calibration.runtime_bytes if fw.runtime_bytes is None else fw.runtime_bytes
    return _Shared(
        state_bytes_per_param(training, plan),
        parameters.expert_state_bytes_per_param(training, plan), num_microbatches(training, plan),
        activation_bytes_per_layer(model, training, plan),
        moe_activation_bytes_per_layer(model, training, plan) if model.is_moe else 0.0,
        _embedding_activation_bytes(model, training, plan),
        _last_stage_head_bytes(model, training, plan), logits_bytes(model, training, plan),
        _temporary_bytes(model, training, plan), constant, calibration.allocator_fraction,
        fw.memory_margin,
    )  # fmt: skip


def _stage(
    model: ModelSpec, training: TrainingSpec, plan: Plan, stage: int, shared: _Shared
) -> MemoryBreakdown:
    (w_b, g_b, o_b), (we_b, ge_b, oe_b) = shared.state_per_param, shared.expert_state_per_param
    params, experts = parameters.stage_param_split(model, plan, stage)
    mtp_dense, mtp_experts = mtp_param_split(model, plan, stage)  # multi-token prediction
    params, experts = params + mtp_dense, experts + mtp_experts
    units = in_flight_microbatches(plan, stage, shared.microbatches) * plan.vpp
    # Interleaving: each in-flight unit is one chunk's micro-batch; with an uneven
    # split, count the stage's largest chunk for every unit (err high).
    if model.is_moe:  # dense and MoE layers by chunk (Megatron's virtual-stage order)
        chunk = memory_moe.largest_chunk_bytes(
            model, plan, stage, shared.per_layer, shared.moe_per_layer
        )
        activations = units * chunk
    else:
        chunk_layers = max(plan.layer_split[c * plan.pp + stage] for c in range(plan.vpp))
        activations = units * chunk_layers * shared.per_layer
    if stage == 0:
        activations += math.ceil(units / plan.vpp) * shared.embedding
    logits = 0.0
    if stage == plan.pp - 1:
        activations += shared.head
        logits = shared.logits
    # Runtime: CUDA context + NCCL + workspaces (constant) and the caching allocator's
    # reserve, a fraction of the memory churned every micro-batch (fitted on BLOOM).
    # PyTorch-native pipeline buffers, FSDP2 gathers, DTensor TP, ring (memory_fsdp2)
    extra = memory_fsdp2.stage_extra_bytes(model, training, plan, stage, shared.microbatches)
    temporary = shared.temporary + extra
    dynamic = activations + logits + temporary  # MemoryBreakdown.dynamic_bytes
    runtime = shared.runtime_constant + shared.allocator_fraction * dynamic
    margin = shared.margin_fraction * dynamic
    fp8_weights = parameters.stage_fp8_weight_bytes(model, training, plan, stage)
    return MemoryBreakdown(
        weights=params * w_b + experts * we_b + fp8_weights,
        gradients=params * g_b + experts * ge_b,
        optimizer_state=params * o_b + experts * oe_b,
        activations=activations,
        logits=logits,
        temporary=temporary,
        runtime=runtime,
        margin=margin,
    )


def memory_by_stage(
    model: ModelSpec,
    training: TrainingSpec,
    plan: Plan,
    calibration: MemoryCalibration = MEMORY_CALIBRATION,
) -> tuple[MemoryBreakdown, ...]:
    """:func:`stage_memory` of every pipeline stage, stage 0 first."""
    shared = _shared(model, training, plan, calibration)
    return tuple(_stage(model, training, plan, s, shared) for s in range(plan.pp))
