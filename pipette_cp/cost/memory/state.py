"""Bytes of state per parameter on one GPU: weights, gradients, optimizer state, and the FP8
weight copies Transformer Engine keeps, by the framework and the sharding level.

The parameter counts themselves are :mod:`pipette_cp.cost.workload.parameters`; the
framework's bytes per parameter are :mod:`pipette_cp.cost.stack.frameworks`.
"""

from __future__ import annotations

import numpy as np

from pipette_cp.cost.stack.frameworks import (
    gradient_bytes,
    optimizer_state_bytes,
    resolve_framework,
)
from pipette_cp.cost.stack.kernels import keeps_quantized_tensors, quantized_bytes
from pipette_cp.cost.workload.bf16_layers import bf16_layers_by_chunk
from pipette_cp.cost.workload.hybrid import hybrid_gemm_params_per_gpu, stage_symbols
from pipette_cp.cost.workload.parameters import (
    expert_shard_group,
    layer_gemm_params_per_gpu,
    moe_layer_gemm_params_per_gpu,
    stage_layer_kinds,
)
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import GRADIENT_SHARDING, TrainingSpec


def quantized_weight_bytes(training: TrainingSpec) -> float:
    """Bytes of the quantised copies of one GEMM weight element that Transformer Engine
    keeps: the row-wise copy for the forward and the column-wise one for the data
    gradient (Hopper transposes it; MXFP8's and NVFP4's column-wise blocks differ; only
    tensor-scaled FP8 on Blackwell could share one layout, which the memory model,
    without the GPU, does not count): 2 x 1 B under FP8, 2 x 0.5625 B under NVFP4."""
    return 2.0 * quantized_bytes(training)


def _keeps_fp8_weights(training: TrainingSpec, plan: Plan) -> bool:
    """Whether the quantised weight copies live for the whole step: Transformer Engine's
    weight cache, not under ZeRO-3 nor under LoRA (Megatron-Bridge's PEFT recipes set
    ``disable_parameter_transpose_cache``: the frozen weights are cast every micro-batch,
    the column-wise copy kept for the data gradient as an activation,
    :func:`pipette_cp.cost.memory.activations.frozen_weight_copy_bytes`)."""
    return (
        keeps_quantized_tensors(training)
        and plan.sharding != "optim_grads_params"
        and training.lora is None
    )


def fp8_weight_bytes_per_layer(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """Bytes of the FP8 weight copies one dense layer keeps on one GPU for the whole step:
    Transformer Engine casts the bf16 weights once per step (Megatron passes
    ``is_first_microbatch``) and keeps the copies beside them ("Performance
    considerations", memory usage: bf16 weight + FP8 weight); 0 without FP8, under
    ZeRO-3 (only the gathered layers have weights) and with torchao (casts each GEMM)."""
    if not _keeps_fp8_weights(training, plan):
        return 0.0
    return layer_gemm_params_per_gpu(model, plan.tp) * quantized_weight_bytes(training)


def stage_fp8_weight_bytes(
    model: ModelSpec, training: TrainingSpec, plan: Plan, stage: int
) -> float:
    """The FP8 weight copies of all the layers of ``stage`` on one GPU: dense layers as
    :func:`fp8_weight_bytes_per_layer`, mixture-of-experts layers their attention,
    shared-expert and local expert GEMMs (TE ``GroupedLinear`` keeps FP8 copies too).

    With FP8 primary weights (``plan.fp8_param_gather``, Megatron's ``--fp8-param-gather``:
    Transformer Engine's ``fp8_model_init``) those FP8 tensors are the weights: the
    GEMM weights have no bf16 copy, so this is net of the bf16 bytes the stage's
    parameters count for them (the row-wise data in the distributed optimizer's FP8
    buffer and the column-wise copy TE derives after the gather: 2 x 1 B instead of
    2 B + 2 x 1 B per GEMM weight).  Norms, biases, embeddings and the output layer
    stay bf16."""
    if model.is_hybrid:  # each sublayer's quantised GEMMs (cost.workload.hybrid)
        keeps = _keeps_fp8_weights(training, plan)
        gemms = sum(n * hybrid_gemm_params_per_gpu(model, plan, k)
                    for k, n in stage_symbols(model, plan, stage).items() if n and keeps)  # fmt: skip
        kept = gemms * quantized_weight_bytes(training)
        dense_layers = moe_layers = 0
    else:
        dense_layers, moe_layers = stage_layer_kinds(model, plan, stage)
        kept = dense_layers * fp8_weight_bytes_per_layer(model, training, plan)
    if moe_layers and _keeps_fp8_weights(training, plan):
        kept += (
            moe_layers
            * moe_layer_gemm_params_per_gpu(model, plan)
            * quantized_weight_bytes(training)
        )
    if kept and (bf16 := bf16_layers_by_chunk(model, training, plan)):  # no copies of theirs
        chunks = np.arange(plan.vpp) * plan.pp + stage
        kept -= quantized_weight_bytes(training) * sum(
            bf16[k][chunks].sum() * _gemm_params(model, plan, k) for k in bf16
        )
    if plan.fp8_param_gather and kept:
        kept -= (
            kept
            / quantized_weight_bytes(training)
            * resolve_framework(training.framework).weight_bytes
        )
    return kept


def _gemm_params(model: ModelSpec, plan: Plan, kind: str) -> float:
    """Quantised GEMM weights of one layer of ``kind`` on one GPU (bf16_layers' kinds)."""
    if model.is_hybrid:
        return hybrid_gemm_params_per_gpu(model, plan, kind)
    if kind == "moe":
        return moe_layer_gemm_params_per_gpu(model, plan)
    return layer_gemm_params_per_gpu(model, plan.tp)


def _state_bytes(training: TrainingSpec, plan: Plan, group: int) -> tuple[float, float, float]:
    fw = resolve_framework(training.framework)
    optimizer = sum(optimizer_state_bytes(training, plan))  # master weights and moments
    weights, grads = fw.weight_bytes, gradient_bytes(training, plan).buffer
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
    momentum), or the framework's own (:mod:`pipette_cp.cost.stack.frameworks`; bf16
    main gradients, ``plan.grad_reduce_in_bf16``: 2 B of gradient); the
    distributed optimizer divides the optimizer part by the data- and context-parallel
    ranks, dp x cp (by the shard group under HSDP), ZeRO-2 the gradients too, ZeRO-3
    the weights too (``plan.sharding``) (megatron/training/theoretical_memory_usage.py:
    18, or 6 + 12/dp).
    """
    return _state_bytes(training, plan, plan.shard_group)


def expert_state_bytes_per_param(training: TrainingSpec, plan: Plan) -> tuple[float, float, float]:
    """:func:`state_bytes_per_param` of a routed-expert parameter: sharded over
    :func:`expert_shard_group` instead of the data- and context-parallel ranks."""
    return _state_bytes(training, plan, expert_shard_group(plan))
