"""Parameters per GPU and the bytes of state each keeps (weights, gradients, optimizer).

Megatron's layout (``megatron/training/theoretical_memory_usage.py``): a vocabulary
padded to a multiple of 128 x tp, each layer's matrices split over tp (norms and the
row-parallel biases replicated), the word embedding on the first stage and the LM
head on the last; the framework's bytes per parameter, divided by the data-parallel
shard group as the sharding level says.
"""

from __future__ import annotations

import math

from pipette_cp.cost.framework import resolve_framework
from pipette_cp.cost.kernels import keeps_fp8_tensors
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
    """Parameters of one transformer layer held by one tensor-parallel rank.

    Norms and the biases of the row-parallel layers are replicated on every rank,
    the rest is split (Megatron ColumnParallelLinear / RowParallelLinear).
    """
    replicated = 2 * model.norm_params + (2 * model.hidden_size if model.linear_bias else 0)
    return (model.params_per_layer - replicated) / tp + replicated


def layer_gemm_params_per_gpu(model: ModelSpec, tp: int) -> float:
    """Weights of one layer's GEMMs (QKV, projection, FC1, FC2) on one tensor-parallel rank:
    what runs in FP8 under fp8 training (no norms, no biases)."""
    h, f = model.hidden_size, model.ffn_hidden_size
    q, kv = model.num_attention_heads * model.head_size, model.kv_heads * model.head_size
    fc1 = (2 if model.activation == "swiglu" else 1) * f
    return (h * (q + 2 * kv) + q * h + h * fc1 + f * h) / tp


#: Bytes of the FP8 copies of one GEMM weight element that Transformer Engine keeps: the
#: row-wise copy for the forward and the column-wise one for the data gradient (Hopper
#: transposes it; MXFP8's column-wise blocks differ; only tensor-scaled FP8 on Blackwell
#: could share one layout, which the memory model, without the GPU, does not count).
FP8_WEIGHT_BYTES = 2.0 * FP8_BYTES


def fp8_weight_bytes_per_layer(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """Bytes of the FP8 weight copies one layer keeps on one GPU for the whole step:
    Transformer Engine casts the bf16 weights once per step (Megatron passes
    ``is_first_microbatch``) and keeps the copies beside them ("Performance
    considerations", memory usage: bf16 weight + FP8 weight); 0 without FP8, under
    ZeRO-3 (only the gathered layers have weights) and with torchao (casts each GEMM)."""
    if not keeps_fp8_tensors(training) or plan.sharding == "optim_grads_params":
        return 0.0
    return layer_gemm_params_per_gpu(model, plan.tp) * FP8_WEIGHT_BYTES


def stage_params_per_gpu(model: ModelSpec, plan: Plan, stage: int) -> float:
    """Parameters held by one GPU of ``stage`` (all its chunks).

    The word embedding (vocab-parallel) sits on stage 0, learned positions
    replicated over tp; the last stage holds the final norm and the LM head,
    which is a separate copy of the embedding when tied and pp > 1 (Megatron
    keeps both copies and all-reduces their gradients).
    """
    h = model.hidden_size
    vocab = padded_vocab_size(model, plan.tp)
    params = plan.stage_layers(stage) * layer_params_per_gpu(model, plan.tp)
    if stage == 0:
        positions = model.max_seq_length if model.position_embedding == "learned" else 0
        params += vocab * h / plan.tp + positions * h
    if stage == plan.pp - 1:
        params += model.norm_params
        if not model.tied_embeddings or plan.pp > 1:
            params += vocab * h / plan.tp
    return params


def state_bytes_per_param(training: TrainingSpec, plan: Plan) -> tuple[float, float, float]:
    """(weight, gradient, optimizer-state) bytes per parameter on one GPU.

    Megatron mixed precision: 2 + 4 + 12 = 18 B (Adam) or 2 + 4 + 8 (SGD with
    momentum), or the framework's own (:mod:`pipette_cp.cost.framework`); the
    distributed optimizer divides the optimizer part by dp (by the shard group under
    HSDP), ZeRO-2 the gradients too, ZeRO-3 the weights too (``plan.sharding``)
    (megatron/training/theoretical_memory_usage.py: 18, or 6 + 12/dp).
    """
    fw = resolve_framework(training.framework)
    moments = fw.optimizer_state_bytes * (1.0 if training.optimizer == "adam" else 0.5)
    optimizer = fw.master_weight_bytes + moments
    weights, grads = fw.weight_bytes, fw.gradient_bytes
    sharding, group = plan.sharding, plan.shard_group  # group: dp, or the HSDP shard group
    if sharding != "none":
        optimizer /= group
    if sharding in GRADIENT_SHARDING:  # ZeRO-2 (Rajbhandari et al. 2020): gradients too
        grads /= group
    if sharding == "optim_grads_params":  # ZeRO-3 / FSDP: the parameters too
        # (PyTorch FSDP keeps no compute copy: the fp32 master shard is cast at gather)
        weights = weights / group if fw.keeps_compute_weights else 0.0
    return weights, grads, optimizer
