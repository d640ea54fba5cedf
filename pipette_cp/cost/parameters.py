"""Parameters per GPU and the bytes of state each keeps (weights, gradients, optimizer).

Megatron's layout (``megatron/training/theoretical_memory_usage.py``): a vocabulary
padded to a multiple of 128 x tp, each layer's matrices split over tp (norms and the
row-parallel biases replicated), the word embedding on the first stage and the LM
head on the last; the framework's bytes per parameter, divided by the data-parallel
shard group as the sharding level says.

Mixture-of-experts layers (Megatron-Core ``MoELayer``) hold two kinds of parameters:
dense ones (attention, norms, the router ``TopKRouter``, replicated over tp, and the
shared experts ``SharedExpertMLP``, split over tp like a dense MLP) and the routed
experts (``TEGroupedMLP``): ``num_experts / ep`` local experts, each an MLP of
``expert_width`` split over the expert tensor-parallel size ``etp``.  The distributed
optimizer shards the dense state over the data- and context-parallel ranks
(``plan.shard_group``) and the expert state over the expert data-parallel ranks
(``plan.expert_dp``; Megatron-Core ``get_megatron_optimizer``, the expert parameter
groups on the expert data-parallel group).
"""

from __future__ import annotations

import math

import numpy as np

from pipette_cp.cost.framework import resolve_framework
from pipette_cp.cost.kernels import keeps_fp8_tensors
from pipette_cp.cost.moe import local_experts, moe_layers_by_chunk
from pipette_cp.specs import model_counts as counts
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import GRADIENT_SHARDING, TrainingSpec
from pipette_cp.units import FP8_BYTES

#: Megatron pads the vocabulary to a multiple of this times tp
#: (``--make-vocab-size-divisible-by``, default 128).
VOCAB_DIVISOR = 128


def padded_vocab_size(model: ModelSpec, tp: int) -> int:
    """Vocabulary padded as Megatron does (multiple of 128 x tp).

    >>> from pipette_cp.specs.model import ModelSpec
    >>> m = ModelSpec(name="x", num_layers=2, hidden_size=64, num_attention_heads=4,
    ...               ffn_hidden_size=256, vocab_size=50257, max_seq_length=128)
    >>> padded_vocab_size(m, 8)
    51200
    """
    # Megatron-LM megatron/training/tokenizer: _vocab_size_with_padding
    multiple = VOCAB_DIVISOR * tp
    return math.ceil(model.vocab_size / multiple) * multiple


def layer_params_per_gpu(model: ModelSpec, tp: int) -> float:
    """Parameters of one transformer layer of a dense model held by one tensor-parallel
    rank (:class:`~pipette_cp.errors.UnsupportedError` for a mixture-of-experts model:
    see :func:`largest_layer_params_per_gpu`).

    Norms and the biases of the row-parallel layers are replicated on every rank,
    the rest is split (Megatron ColumnParallelLinear / RowParallelLinear).
    """
    replicated = 2 * model.norm_params + (2 * model.hidden_size if model.linear_bias else 0)
    return (model.params_per_layer - replicated) / tp + replicated


def _dense_layer_params(model: ModelSpec, tp: int) -> float:
    """:func:`layer_params_per_gpu` of a dense block, also of a mixture-of-experts model."""
    replicated = 2 * model.norm_params + (2 * model.hidden_size if model.linear_bias else 0)
    return (model.dense_layer_params - replicated) / tp + replicated


def moe_layer_param_split(model: ModelSpec, plan: Plan) -> tuple[float, float]:
    """(dense, routed-expert) parameters of one mixture-of-experts layer on one GPU.

    Dense: attention and the shared experts split over tp (the row-parallel biases,
    the norms, the router and the shared-expert gate replicated, as in
    :func:`layer_params_per_gpu`).  Experts: ``num_experts / ep`` MLPs of
    ``expert_width``, their matrices split over ``etp`` (the FC2 bias replicated).
    """
    h, bias = model.hidden_size, model.linear_bias
    shared = model.num_shared_experts > 0
    gate = h if model.shared_expert_gate else 0
    replicated = 2 * model.norm_params + (h if bias else 0) + (h if bias and shared else 0)
    split = model.attention_params + counts.block_norms(model) + model.shared_expert_params - gate
    dense = (split - replicated) / plan.tp + replicated + gate + model.router_params
    fc2_bias = h if bias else 0
    expert = (model.expert_params - fc2_bias) / plan.expert_tp + fc2_bias
    return dense, local_experts(model, plan) * expert


def chunk_layer_kinds(model: ModelSpec, plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """(dense, mixture-of-experts) layers of every virtual stage ``c * pp + s``."""
    layers = np.asarray(plan.layer_split, dtype=float)
    moe = moe_layers_by_chunk(model, plan) if model.is_moe else np.zeros_like(layers)
    return layers - moe, moe


def stage_layer_kinds(model: ModelSpec, plan: Plan, stage: int) -> tuple[int, int]:
    """(dense, mixture-of-experts) layers of ``stage`` over all its chunks."""
    if not model.is_moe:
        return plan.stage_layers(stage), 0
    dense, moe = chunk_layer_kinds(model, plan)
    chunks = [c * plan.pp + stage for c in range(plan.vpp)]
    return int(dense[chunks].sum()), int(moe[chunks].sum())


def largest_layer_params_per_gpu(model: ModelSpec, plan: Plan) -> float:
    """Parameters of the largest layer on one GPU (a dense layer, or a mixture-of-experts
    layer's dense and local expert parameters): :func:`layer_params_per_gpu` when dense."""
    if not model.is_moe:
        return layer_params_per_gpu(model, plan.tp)
    dense = _dense_layer_params(model, plan.tp) if model.num_dense_layers else 0.0
    return max(dense, sum(moe_layer_param_split(model, plan)))


def _attention_gemm(model: ModelSpec) -> int:
    h = model.hidden_size
    q, kv = model.num_attention_heads * model.head_size, model.kv_heads * model.head_size
    return h * (q + 2 * kv) + q * h


def _mlp_gemm(model: ModelSpec, width: int) -> int:
    fc1 = (2 if model.activation == "swiglu" else 1) * width
    return model.hidden_size * fc1 + width * model.hidden_size


def layer_gemm_params_per_gpu(model: ModelSpec, tp: int) -> float:
    """Weights of one dense layer's GEMMs (QKV, projection, FC1, FC2) on one tensor-parallel
    rank: what runs in FP8 under fp8 training (no norms, no biases)."""
    return (_attention_gemm(model) + _mlp_gemm(model, model.ffn_hidden_size)) / tp


def moe_layer_gemm_params_per_gpu(model: ModelSpec, plan: Plan) -> float:
    """Weights of one mixture-of-experts layer's FP8 GEMMs on one GPU: attention and the
    shared experts over tp, the local experts over etp (the router stays in bf16)."""
    shared = _mlp_gemm(model, model.shared_expert_width) if model.num_shared_experts else 0
    experts = local_experts(model, plan) * _mlp_gemm(model, model.expert_width)
    return (_attention_gemm(model) + shared) / plan.tp + experts / plan.expert_tp


def largest_layer_gemm_params_per_gpu(model: ModelSpec, plan: Plan) -> float:
    """:func:`layer_gemm_params_per_gpu` of the largest layer kind of ``model``."""
    dense = layer_gemm_params_per_gpu(model, plan.tp)
    if not model.is_moe:
        return dense
    return max(dense if model.num_dense_layers else 0.0, moe_layer_gemm_params_per_gpu(model, plan))


#: Bytes of the FP8 copies of one GEMM weight element that Transformer Engine keeps: the
#: row-wise copy for the forward and the column-wise one for the data gradient (Hopper
#: transposes it; MXFP8's column-wise blocks differ; only tensor-scaled FP8 on Blackwell
#: could share one layout, which the memory model, without the GPU, does not count).
FP8_WEIGHT_BYTES = 2.0 * FP8_BYTES


def _keeps_fp8_weights(training: TrainingSpec, plan: Plan) -> bool:
    return keeps_fp8_tensors(training) and plan.sharding != "optim_grads_params"


def fp8_weight_bytes_per_layer(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """Bytes of the FP8 weight copies one dense layer keeps on one GPU for the whole step:
    Transformer Engine casts the bf16 weights once per step (Megatron passes
    ``is_first_microbatch``) and keeps the copies beside them ("Performance
    considerations", memory usage: bf16 weight + FP8 weight); 0 without FP8, under
    ZeRO-3 (only the gathered layers have weights) and with torchao (casts each GEMM)."""
    if not _keeps_fp8_weights(training, plan):
        return 0.0
    return layer_gemm_params_per_gpu(model, plan.tp) * FP8_WEIGHT_BYTES


def stage_fp8_weight_bytes(
    model: ModelSpec, training: TrainingSpec, plan: Plan, stage: int
) -> float:
    """The FP8 weight copies of all the layers of ``stage`` on one GPU: dense layers as
    :func:`fp8_weight_bytes_per_layer`, mixture-of-experts layers their attention,
    shared-expert and local expert GEMMs (TE ``GroupedLinear`` keeps FP8 copies too)."""
    dense_layers, moe_layers = stage_layer_kinds(model, plan, stage)
    kept = dense_layers * fp8_weight_bytes_per_layer(model, training, plan)
    if moe_layers and _keeps_fp8_weights(training, plan):
        kept += moe_layers * moe_layer_gemm_params_per_gpu(model, plan) * FP8_WEIGHT_BYTES
    return kept


def stage_param_split(model: ModelSpec, plan: Plan, stage: int) -> tuple[float, float]:
    """(dense, routed-expert) parameters held by one GPU of ``stage`` (all its chunks).

    Dense: the layers of the stage's virtual stages ``c * pp + stage`` by kind (dense
    blocks as :func:`layer_params_per_gpu`, mixture-of-experts blocks as
    :func:`moe_layer_param_split`), the word embedding (vocab-parallel) on stage 0 with
    learned positions replicated over tp, and on the last stage the final norm and the
    LM head, a separate copy of the embedding when tied and pp > 1 (Megatron keeps both
    copies and all-reduces their gradients).  Expert: the local routed experts.
    Multi-token prediction modules are not counted.
    """
    h = model.hidden_size
    vocab = padded_vocab_size(model, plan.tp)
    dense_layers, moe_layers = stage_layer_kinds(model, plan, stage)
    params = dense_layers * _dense_layer_params(model, plan.tp)
    experts = 0.0
    if moe_layers:
        moe_dense, moe_experts = moe_layer_param_split(model, plan)
        params += moe_layers * moe_dense
        experts = moe_layers * moe_experts
    if stage == 0:
        positions = model.max_seq_length if model.position_embedding == "learned" else 0
        params += vocab * h / plan.tp + positions * h
    if stage == plan.pp - 1:
        params += model.norm_params
        if not model.tied_embeddings or plan.pp > 1:
            params += vocab * h / plan.tp
    return params, experts


def stage_params_per_gpu(model: ModelSpec, plan: Plan, stage: int) -> float:
    """Parameters held by one GPU of ``stage``: the sum of :func:`stage_param_split`."""
    dense, experts = stage_param_split(model, plan, stage)
    return dense + experts


def _state_bytes(training: TrainingSpec, plan: Plan, group: int) -> tuple[float, float, float]:
    fw = resolve_framework(training.framework)
    moments = fw.optimizer_state_bytes * (1.0 if training.optimizer == "adam" else 0.5)
    optimizer = fw.master_weight_bytes + moments
    weights, grads = fw.weight_bytes, fw.gradient_bytes
    sharding = plan.sharding
    if sharding != "none":
        optimizer /= group
    if sharding in GRADIENT_SHARDING:  # ZeRO-2 (Rajbhandari et al. 2020): gradients too
        grads /= group
    if sharding == "optim_grads_params":  # ZeRO-3 / FSDP: the parameters too
        # (PyTorch FSDP keeps no compute copy: the fp32 master shard is cast at gather)
        weights = weights / group if fw.keeps_compute_weights else 0.0
    return weights, grads, optimizer


def state_bytes_per_param(training: TrainingSpec, plan: Plan) -> tuple[float, float, float]:
    """(weight, gradient, optimizer-state) bytes per dense parameter on one GPU.

    Megatron mixed precision: 2 + 4 + 12 = 18 B (Adam) or 2 + 4 + 8 (SGD with
    momentum), or the framework's own (:mod:`pipette_cp.cost.framework`); the
    distributed optimizer divides the optimizer part by the data- and context-parallel
    ranks, dp x cp (by the shard group under HSDP), ZeRO-2 the gradients too, ZeRO-3
    the weights too (``plan.sharding``) (megatron/training/theoretical_memory_usage.py:
    18, or 6 + 12/dp).
    """
    return _state_bytes(training, plan, plan.shard_group)


def expert_shard_group(plan: Plan) -> int:
    """Ranks that share one copy of the sharded routed-expert state: the expert
    data-parallel size ``tp cp dp / (ep etp)``; under HSDP divided by the number of
    optimizer instances ``dp cp / shard_group`` (Megatron-Core's intra-partial expert
    data-parallel group with ``--num-distributed-optimizer-instances``), at least 1.
    A layout whose ``ep etp`` does not divide the stage's ranks counts as 1."""
    group = max(plan.expert_dp, 1)
    if plan.hybrid:
        group //= plan.replicas // plan.shard_group
    return max(group, 1)


def expert_state_bytes_per_param(training: TrainingSpec, plan: Plan) -> tuple[float, float, float]:
    """:func:`state_bytes_per_param` of a routed-expert parameter: sharded over
    :func:`expert_shard_group` instead of the data- and context-parallel ranks."""
    return _state_bytes(training, plan, expert_shard_group(plan))
