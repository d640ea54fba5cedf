"""Peak memory of one GPU of each pipeline stage: what nvidia-smi would show.

Parts (all bytes, for the most loaded GPU of the stage):

- weights, gradients, optimizer state: Megatron mixed-precision Adam keeps a
  bf16/fp16 weight (2 B), an fp32 main gradient (4 B) and an fp32 master copy
  plus two fp32 moments (12 B) per parameter, 18 B in all; the distributed
  optimizer (ZeRO-1) shards the 12 B over the dp x cp ranks (routed experts: over the
  expert data-parallel ranks).  FP8 training (Transformer Engine) keeps the same state
  plus FP8 copies of the layer GEMM weights (:mod:`pipette_cp.cost.memory.state`).  LoRA
  fine-tuning keeps the frozen base weights alone and the adapters' full state
  (:mod:`pipette_cp.cost.workload.lora`).
- activations: per layer per micro-batch (:mod:`pipette_cp.cost.memory.activations`:
  Korthikanti et al. 2022, Table 2, derived term by term), times the layers of the
  stage, times the micro-batches in flight under (interleaved) 1F1B; plus the embedding's
  inputs on the first stage and the final norm's (and the multi-token prediction
  modules') on the last.  A GPU keeps ``s b / cp`` tokens of every term.
- logits: the last stage's vocabulary-parallel logits, bf16 and fp32 copies.
- temporary: the working set of the layer being back-propagated (gradients of
  its activations, and its re-materialised activations under recompute), the
  pipeline send/receive buffers, the MoE dispatch buffers and the context-parallel ring's
  (PyTorch-native terms: :mod:`pipette_cp.cost.memory.fsdp2`).
- runtime: CUDA context, NCCL buffers and workspaces, a constant outside the caching
  allocator (:data:`pipette_cp.cost.stack.calibration.MEMORY_CALIBRATION`, fitted on BLOOM, or
  the framework's own).
- allocator: the caching allocator's reserve and fragmentation, a fraction of the memory
  allocated per micro-batch (same calibration).

Their sum is the predicted peak; :attr:`MemoryBreakdown.reserved_bytes`, the sum without
the runtime, the caching allocator's reserved peak (what torchtitan logs).  ``fits`` is judged on an upper bound, the peak
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

import numpy as np

from pipette_cp.cost.memory import fsdp2 as memory_fsdp2
from pipette_cp.cost.memory import moe_activations as memory_moe
from pipette_cp.cost.memory import state
from pipette_cp.cost.memory.activations import (
    activation_bytes_per_layer,
    embedding_activation_bytes,
    full_layer_activation_bytes,
    kept_layer_bytes,
    last_stage_head_bytes,
    logits_bytes,
    moe_activation_bytes_per_layer,
)
from pipette_cp.cost.memory.hybrid_activations import hybrid_kept_bytes, largest_hybrid_full_bytes
from pipette_cp.cost.memory.limits import (
    in_flight_microbatches,
    num_microbatches,
    usable_memory_bytes,
)
from pipette_cp.cost.memory.state import state_bytes_per_param
from pipette_cp.cost.stack.calibration import MEMORY_CALIBRATION, MemoryCalibration
from pipette_cp.cost.stack.frameworks import gradient_bytes, resolve_framework
from pipette_cp.cost.stack.kernels import uses_quantized_gemms
from pipette_cp.cost.workload import lora, parameters
from pipette_cp.cost.workload.bf16_layers import bf16_layers_by_chunk, bf16_training
from pipette_cp.cost.workload.hybrid import present_symbols, symbols_by_chunk
from pipette_cp.cost.workload.parameters import (
    layer_params_per_gpu,
    padded_vocab_size,
    stage_params_per_gpu,
)
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import GRADIENT_SHARDING, TrainingSpec

__all__ = [  # the memory model's public names (some defined in the modules it builds on)
    "MemoryBreakdown", "activation_bytes_per_layer", "in_flight_microbatches",
    "layer_params_per_gpu", "logits_bytes", "memory_by_stage", "moe_activation_bytes_per_layer",
    "num_microbatches", "padded_vocab_size", "stage_memory", "stage_params_per_gpu",
    "state_bytes_per_param", "usable_memory_bytes",
]  # fmt: skip


@dataclass(frozen=True)
class MemoryBreakdown:
    """Peak memory of one GPU, by part, bytes."""

    weights: float
    gradients: float
    optimizer_state: float
    activations: float
    logits: float
    temporary: float
    #: outside the caching allocator: CUDA context, NCCL buffers, workspaces (a constant)
    runtime: float
    #: the caching allocator's reserve and fragmentation
    allocator: float = 0.0
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
            + self.allocator
        )

    @property
    def reserved_bytes(self) -> float:
        """The caching allocator's predicted reserved peak (PyTorch's
        ``reserved_bytes.all.peak``): :attr:`total_bytes` without :attr:`runtime` (the
        allocator's reserve stays), bytes."""
        return self.total_bytes - self.runtime

    def as_dict(self) -> dict[str, float]:
        """The parts by name (for reports; they sum to the peak), bytes."""
        parts = asdict(self)
        del parts["margin"]
        return parts


def _temporary_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """Transient working set on top of what is stored (assumptions, err high)."""
    s, b = training.seq_length / plan.cp, plan.micro_batch_size
    full = full_layer_activation_bytes(model, training, plan)
    if model.is_hybrid:  # the largest sublayer
        full = largest_hybrid_full_bytes(model, training, plan)
    elif model.is_moe:  # the largest layer kind of the model
        moe = full_layer_activation_bytes(model, training, plan, moe=True)
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
        temp += layer * gradient_bytes(training, plan).buffer
        if plan.sharding == "optim_grads_params":
            temp += 2 * layer * fw.weight_bytes
    if uses_quantized_gemms(training) and not state.fp8_weight_bytes_per_layer(
        model, training, plan
    ):
        # quantised weights not kept: those of the layer being computed (both layouts)
        gemm = parameters.largest_layer_gemm_params_per_gpu(model, plan)
        temp += gemm * state.quantized_weight_bytes(training)
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
    #: a hybrid model's kept bytes per sublayer, by symbol
    symbol_bytes: tuple[tuple[str, float], ...] = ()
    #: by layer kind, what a layer kept in bf16 keeps beyond its quantised twin
    bf16_bytes: tuple[tuple[str, float], ...] = ()


def _shared(
    model: ModelSpec, training: TrainingSpec, plan: Plan, calibration: MemoryCalibration
) -> _Shared:
    fw = resolve_framework(training.framework)
    constant = calibration.runtime_bytes if fw.runtime_bytes is None else fw.runtime_bytes
    return _Shared(
        state_bytes_per_param(training, plan),
        state.expert_state_bytes_per_param(training, plan), num_microbatches(training, plan),
        activation_bytes_per_layer(model, training, plan),
        moe_activation_bytes_per_layer(model, training, plan) if model.is_moe else 0.0,
        embedding_activation_bytes(model, training, plan),
        last_stage_head_bytes(model, training, plan), logits_bytes(model, training, plan),
        _temporary_bytes(model, training, plan), constant, calibration.allocator_fraction,
        fw.memory_margin,
        tuple((k, hybrid_kept_bytes(model, training, plan, k)) for k in present_symbols(model)),
        _bf16_bytes(model, training, plan),
    )  # fmt: skip


def _bf16_bytes(
    model: ModelSpec, training: TrainingSpec, plan: Plan
) -> tuple[tuple[str, float], ...]:
    """By kind of the layers kept in bf16 (:mod:`pipette_cp.cost.workload.bf16_layers`),
    their kept bytes less their quantised twin's."""

    def kept(kind: str, t: TrainingSpec) -> float:
        if model.is_hybrid:
            return hybrid_kept_bytes(model, t, plan, kind)
        return kept_layer_bytes(model, t, plan, kind == "moe")

    plain = bf16_training(training)
    kinds = bf16_layers_by_chunk(model, training, plan)
    return tuple((k, kept(k, plain) - kept(k, training)) for k in kinds)


def _stage(
    model: ModelSpec, training: TrainingSpec, plan: Plan, stage: int, shared: _Shared
) -> MemoryBreakdown:
    (w_b, g_b, o_b), (we_b, ge_b, oe_b) = shared.state_per_param, shared.expert_state_per_param
    params, experts = parameters.stage_param_split(model, plan, stage)  # MTP included
    # LoRA: the base weights frozen (weights alone), the adapters trained (cost.workload.lora)
    adapters = lora.stage_adapter_params(model, training, plan, stage)
    trained, trained_experts = (adapters, 0.0) if training.lora else (params, experts)
    units = in_flight_microbatches(plan, stage, shared.microbatches) * plan.vpp
    # Interleaving: each in-flight unit is one chunk's micro-batch; with an uneven
    # split, count the stage's largest chunk for every unit (err high).
    # The layers of each kind by chunk (Megatron's virtual-stage order).
    chunks = np.arange(plan.vpp) * plan.pp + stage
    if model.is_hybrid:  # each symbol's sublayers
        by_symbol = symbols_by_chunk(model, plan)
        per_chunk = np.sum([by_symbol[k][chunks] * kept for k, kept in shared.symbol_bytes], axis=0)
    elif model.is_moe:  # dense and MoE layers
        dense, moe = parameters.chunk_layer_kinds(model, plan)
        per_chunk = dense[chunks] * shared.per_layer + moe[chunks] * shared.moe_per_layer
    else:
        per_chunk = np.asarray(plan.layer_split, dtype=float)[chunks] * shared.per_layer
    if shared.bf16_bytes:  # layers kept in bf16 keep bf16 GEMM inputs
        bf16 = bf16_layers_by_chunk(model, training, plan)
        per_chunk = per_chunk + np.sum([bf16[k][chunks] * d for k, d in shared.bf16_bytes], axis=0)
    activations = units * float(np.max(per_chunk))
    if stage == 0:
        activations += math.ceil(units / plan.vpp) * shared.embedding
    logits = 0.0
    if stage == plan.pp - 1:
        activations += shared.head
        logits = shared.logits
    # PyTorch-native pipeline buffers, FSDP2 gathers, DTensor TP, ring (memory_fsdp2).
    # The loss's logits and the last layer's backward working set are summed, though the
    # loss's backward frees its tensors first: the reserved peaks of torchtitan's fit rows
    # say the caching allocator does not reuse them (the larger of the two alone puts its
    # 70B rows 20-25 % below their measurements).
    extra = memory_fsdp2.stage_extra_bytes(model, training, plan, stage, shared.microbatches)
    temporary = shared.temporary + extra
    # Runtime: CUDA context + NCCL + workspaces (constant) and the caching allocator's
    # reserve, a fraction of the memory churned every micro-batch (fitted on BLOOM).
    dynamic = activations + logits + temporary  # MemoryBreakdown.dynamic_bytes
    allocator = shared.allocator_fraction * dynamic
    margin = shared.margin_fraction * dynamic
    fp8_weights = state.stage_fp8_weight_bytes(model, training, plan, stage)
    return MemoryBreakdown(
        weights=(params + adapters) * w_b + experts * we_b + fp8_weights,
        gradients=trained * g_b + trained_experts * ge_b,
        optimizer_state=trained * o_b + trained_experts * oe_b,
        activations=activations,
        logits=logits,
        temporary=temporary,
        runtime=shared.runtime_constant,
        allocator=allocator,
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
