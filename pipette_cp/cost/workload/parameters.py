"""Parameters per GPU, dense and routed-expert, by stage and layer kind (the bytes of state
each keeps are :mod:`pipette_cp.cost.memory.state`).

Megatron's layout (``megatron/training/theoretical_memory_usage.py``): a vocabulary
padded to a multiple of 128 x tp, each layer's matrices split over tp (norms and the
row-parallel biases replicated), the word embedding on the first stage and the LM
head on the last.

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

from pipette_cp.cost.workload.hybrid import (
    hybrid_gemm_params_per_gpu,
    hybrid_param_split,
    present_symbols,
    stage_symbols,
)
from pipette_cp.cost.workload.latent_attention import attention_weight_elements, duplicated_params
from pipette_cp.cost.workload.tokens import local_experts, moe_layers_by_chunk
from pipette_cp.specs import model_counts as counts
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan

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
    the rest is split (Megatron ColumnParallelLinear / RowParallelLinear); with latent
    attention also its down-projections and latent norms
    (:func:`~pipette_cp.cost.workload.latent_attention.duplicated_params`).
    """
    replicated = _replicated_params(model)
    return (model.params_per_layer - replicated) / tp + replicated  # raises for MoE


def _replicated_attention_params(model: ModelSpec) -> int:
    """Attention and block-norm parameters of one layer every tensor-parallel rank holds
    whole: the two block norms, latent attention's duplicated part, and the output
    projection's bias."""
    bias = model.hidden_size if model.linear_bias else 0
    return 2 * model.norm_params + duplicated_params(model) + bias


def _replicated_params(model: ModelSpec) -> int:
    """Parameters of one dense block every tensor-parallel rank holds whole: those of
    :func:`_replicated_attention_params` and the FC2 bias."""
    return _replicated_attention_params(model) + (model.hidden_size if model.linear_bias else 0)


def _dense_layer_params(model: ModelSpec, tp: int) -> float:
    """:func:`layer_params_per_gpu` of a dense block, also of a mixture-of-experts model."""
    replicated = _replicated_params(model)
    return (model.dense_layer_params - replicated) / tp + replicated


def moe_layer_param_split(model: ModelSpec, plan: Plan) -> tuple[float, float]:
    """(dense, routed-expert) parameters of one mixture-of-experts layer on one GPU.

    Dense: attention and the shared experts split over tp (the row-parallel biases,
    the norms, latent attention's down-projections and latent norms, the router and the
    shared-expert gate replicated, as in :func:`layer_params_per_gpu`).  Experts:
    ``num_experts / ep`` MLPs of ``expert_width``, their matrices split over ``etp`` (the
    FC2 bias replicated).
    """
    h, bias = model.hidden_size, model.linear_bias
    shared = model.num_shared_experts > 0
    gate = h if model.shared_expert_gate else 0
    replicated = _replicated_attention_params(model) + (h if bias and shared else 0)
    split = model.attention_params + counts.block_norms(model) + model.shared_expert_params - gate
    latent = counts.latent_projections(model)  # LatentMoE's, replicated like the router
    dense = (split - replicated) / plan.tp + replicated + gate + model.router_params + latent
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
    if model.is_hybrid:
        return max(sum(hybrid_param_split(model, plan, k)) for k in present_symbols(model))
    if not model.is_moe:
        return layer_params_per_gpu(model, plan.tp)
    dense = _dense_layer_params(model, plan.tp) if model.num_dense_layers else 0.0
    return max(dense, sum(moe_layer_param_split(model, plan)))


def _mlp_gemm(model: ModelSpec, width: int, hidden: int | None = None) -> int:
    fc1, h = (2 if model.activation == "swiglu" else 1) * width, hidden or model.hidden_size
    return h * fc1 + width * h


def layer_gemm_params_per_gpu(model: ModelSpec, tp: int) -> float:
    """Weights of one dense layer's GEMMs (QKV, projection, FC1, FC2; with latent attention
    its down-projections whole, :func:`~pipette_cp.cost.workload.latent_attention.
    attention_cast_elements`) on one tensor-parallel rank: what runs in FP8 under fp8
    training (no norms, no biases)."""
    return attention_weight_elements(model, tp) + _mlp_gemm(model, model.ffn_hidden_size) / tp


def moe_layer_gemm_params_per_gpu(model: ModelSpec, plan: Plan) -> float:
    """Weights of one mixture-of-experts layer's FP8 GEMMs on one GPU: attention (as in
    :func:`layer_gemm_params_per_gpu`) and the shared experts over tp, the local experts
    over etp (the router stays in bf16)."""
    shared = _mlp_gemm(model, model.shared_expert_width) if model.num_shared_experts else 0
    experts = local_experts(model, plan) * _mlp_gemm(model, model.expert_width,
                                                     model.expert_hidden_size)  # fmt: skip
    attention = attention_weight_elements(model, plan.tp) + counts.latent_projections(model)
    return attention + shared / plan.tp + experts / plan.expert_tp


def largest_layer_gemm_params_per_gpu(model: ModelSpec, plan: Plan) -> float:
    """:func:`layer_gemm_params_per_gpu` of the largest layer kind of ``model``."""
    if model.is_hybrid:
        return max(hybrid_gemm_params_per_gpu(model, plan, k) for k in present_symbols(model))
    dense = layer_gemm_params_per_gpu(model, plan.tp)
    if not model.is_moe:
        return dense
    return max(dense if model.num_dense_layers else 0.0, moe_layer_gemm_params_per_gpu(model, plan))


def stage_param_split(model: ModelSpec, plan: Plan, stage: int) -> tuple[float, float]:
    """(dense, routed-expert) parameters held by one GPU of ``stage`` (all its chunks).

    Dense: the layers of the stage's virtual stages ``c * pp + stage`` by kind (dense
    blocks as :func:`layer_params_per_gpu`, mixture-of-experts blocks as
    :func:`moe_layer_param_split`), the word embedding (vocab-parallel) on stage 0 with
    learned positions replicated over tp, and on the last stage the final norm and the
    LM head, a separate copy of the embedding when tied and pp > 1 (Megatron keeps both
    copies and all-reduces their gradients), and the multi-token prediction modules
    (:func:`mtp_param_split`).  Expert: the local routed experts (and the MTP blocks').
    """
    h = model.hidden_size
    vocab = padded_vocab_size(model, plan.tp)
    params = experts = 0.0
    if model.is_hybrid:  # each sublayer by its symbol (cost.workload.hybrid)
        for symbol, n in stage_symbols(model, plan, stage).items():
            if n:
                dense, routed = hybrid_param_split(model, plan, symbol)
                params, experts = params + n * dense, experts + n * routed
        dense_layers = moe_layers = 0
    else:
        dense_layers, moe_layers = stage_layer_kinds(model, plan, stage)
    params += dense_layers * _dense_layer_params(model, plan.tp)
    if moe_layers:
        moe_dense, moe_experts = moe_layer_param_split(model, plan)
        params += moe_layers * moe_dense
        experts += moe_layers * moe_experts
    if stage == 0:
        positions = model.max_seq_length if model.position_embedding == "learned" else 0
        params += vocab * h / plan.tp + positions * h
    if stage == plan.pp - 1:
        params += model.norm_params
        if not model.tied_embeddings or plan.pp > 1:
            params += vocab * h / plan.tp
    mtp_dense, mtp_experts = mtp_param_split(model, plan, stage)
    return params + mtp_dense, experts + mtp_experts


def mtp_param_split(model: ModelSpec, plan: Plan, stage: int) -> tuple[float, float]:
    """(dense, routed-expert) parameters of the multi-token prediction modules on one GPU
    of ``stage``: all on the last stage, 0 elsewhere (:mod:`pipette_cp.cost.compute.stage_extras`).

    A module: its block split as the model's blocks of the last layer's kind (a
    mixture-of-experts block as :func:`moe_layer_param_split`, a dense one as
    :func:`layer_params_per_gpu`), ``eh_proj`` (``2h x h``) over tp, the three norms
    replicated; plus the word embedding (vocab-parallel) when the last stage holds no
    copy of it (pp > 1 and untied: tied weights already have the copy).
    """
    if not model.mtp_layers or stage != plan.pp - 1:
        return 0.0, 0.0
    h, t = model.hidden_size, plan.tp
    if model.is_hybrid:  # the sublayers of mtp_hybrid_pattern
        parts = [hybrid_param_split(model, plan, k) for k in model.mtp_hybrid_pattern or ""]
        dense, experts = sum(p[0] for p in parts), sum(p[1] for p in parts)
    elif model.is_moe_layer(model.num_layers - 1):
        dense, experts = moe_layer_param_split(model, plan)
    else:
        dense, experts = _dense_layer_params(model, t), 0.0
    dense += 2 * h * h / t + 3 * model.norm_params
    untied = plan.pp > 1 and not model.tied_embeddings
    embedding = padded_vocab_size(model, t) * h / t if untied else 0.0
    return model.mtp_layers * dense + embedding, model.mtp_layers * experts


def stage_params_per_gpu(model: ModelSpec, plan: Plan, stage: int) -> float:
    """Parameters held by one GPU of ``stage``: the sum of :func:`stage_param_split`."""
    dense, experts = stage_param_split(model, plan, stage)
    return dense + experts


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
