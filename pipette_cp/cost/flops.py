"""FLOP counts: the GEMMs of one transformer layer on one tensor-parallel (and
context-parallel) rank, the model FLOPs of an iteration (for MFU) and the executed ones
with recomputation (for HFU).

Mixture-of-experts models count what a token activates (the MFU convention of
Megatron-Core MoE and DeepSeek-V3: FLOPs of the activated parameters): the router,
its ``top_k`` routed experts and the shared experts of every MoE layer, the dense MLP of
every dense layer; capacity padding, dropped tokens and load imbalance are not model
FLOPs.  Context parallelism splits the work of a sequence without changing it.

Their timing lives in :mod:`pipette_cp.cost.compute`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import TrainingSpec

#: The GEMMs of the attention core (what selective recomputation redoes).
ATTENTION_CORE = ("scores", "context")
_ALL = ("qkv", *ATTENTION_CORE, "proj", "fc1", "fc2")


@dataclass(frozen=True)
class Gemm:
    """One (possibly batched) matrix product ``[m x k] @ [k x n]`` in 2-byte elements."""

    name: str
    m: int
    n: int
    k: int
    batch: int = 1

    @property
    def flops(self) -> float:
        """2 m n k per product (a multiply and an add)."""
        return 2.0 * self.m * self.n * self.k * self.batch

    def backward(self) -> tuple[Gemm, Gemm]:
        """Data-gradient and weight-gradient products (same FLOPs each)."""
        return (
            Gemm(f"{self.name}.dgrad", self.m, self.k, self.n, self.batch),
            Gemm(f"{self.name}.wgrad", self.k, self.n, self.m, self.batch),
        )


def fc1_factor(model: ModelSpec) -> int:
    """Output columns of FC1 per unit of MLP width: 2 for SwiGLU (gate and up), else 1."""
    return 2 if model.activation == "swiglu" else 1


def layer_gemms(
    model: ModelSpec, seq_length: int, micro_batch_size: int, tp: int, cp: int = 1
) -> tuple[Gemm, ...]:
    """Forward GEMMs of one transformer layer on one tensor-parallel rank.

    Megatron's layer: QKV (column-parallel), scores ``Q K^T`` and context ``P V``
    per head (batched over ``b a / t`` heads), output projection (row-parallel),
    FC1 (column-parallel; SwiGLU doubles its width) and FC2 (row-parallel).  With
    context parallelism (``cp``) a rank holds ``s / cp`` of every sequence: the
    projections run over ``s b / cp`` rows, and its queries attend over the whole
    sequence's keys (``s / cp x s`` scores: 1/cp of the attention; Megatron's
    load-balanced chunks give each rank 1/cp of the causal work too).
    """
    h, f, d, s = model.hidden_size, model.ffn_hidden_size, model.head_size, seq_length
    tokens, queries = s * micro_batch_size // cp, s // cp
    q_width, kv_width = model.num_attention_heads * d, model.kv_heads * d
    heads = micro_batch_size * model.num_attention_heads // tp
    fc1_width = fc1_factor(model) * f
    return (
        Gemm("qkv", tokens, (q_width + 2 * kv_width) // tp, h),
        Gemm("scores", queries, s, d, heads),
        Gemm("context", queries, d, s, heads),
        Gemm("proj", tokens, h, q_width // tp),
        Gemm("fc1", tokens, fc1_width // tp, h),
        Gemm("fc2", tokens, h, f // tp),
    )


def layer_forward_flops(
    model: ModelSpec, seq_length: int, micro_batch_size: int = 1, tp: int = 1
) -> float:
    """Forward FLOPs of one layer on one rank; ``24 b s h^2 + 4 b s^2 h`` for GPT.

    Narayanan et al. 2021 sec. 5.1 (ffn = 4h, MHA); attention counted in full
    (no causal halving), as Megatron's FLOP counters do.
    """
    return sum(g.flops for g in layer_gemms(model, seq_length, micro_batch_size, tp))


def moe_mlp_active_flops(model: ModelSpec, seq_length: int) -> float:
    """Forward FLOPs per sequence of one mixture-of-experts MLP as a token activates it:
    the router (``2 s h E``), ``top_k`` routed experts and the shared experts (``2 s``
    per weight of each, SwiGLU's three matrices or GeLU's two), the shared-expert gate
    (``2 s h``)."""
    s, h = seq_length, model.hidden_size
    per_width = (fc1_factor(model) + 1) * h  # weights per unit of MLP width
    router = 2.0 * s * h * model.num_experts
    routed = 2.0 * s * model.moe_top_k * model.expert_width * per_width
    shared = 2.0 * s * model.shared_expert_width * per_width
    gate = 2.0 * s * h if model.shared_expert_gate else 0.0
    return router + routed + shared + gate


def moe_layer_forward_flops(model: ModelSpec, seq_length: int) -> float:
    """Forward FLOPs per sequence of one mixture-of-experts layer (active parameters):
    attention as in a dense layer plus :func:`moe_mlp_active_flops`."""
    attention = ("qkv", *ATTENTION_CORE, "proj")
    gemms = layer_gemms(model, seq_length, 1, 1)
    return sum(g.flops for g in gemms if g.name in attention) + moe_mlp_active_flops(
        model, seq_length
    )


def _layers_forward_flops(model: ModelSpec, seq_length: int) -> float:
    """Forward FLOPs per sequence of every transformer layer (MoE layers active)."""
    dense = model.num_dense_layers * layer_forward_flops(model, seq_length)
    return dense + model.num_moe_layers * moe_layer_forward_flops(model, seq_length)


def model_flops_per_iteration(model: ModelSpec, training: TrainingSpec) -> float:
    """Model FLOPs of one iteration (for MFU): forward + backward, no recompute.

    ``3 x (L x layer forward + logits)`` per sequence; for GPT this is
    ``72 B s L h^2 (1 + s/(6h) + V/(12 L h))`` (Narayanan et al. 2021, eq. 3
    without recomputation), i.e. ~6 N FLOPs per token plus attention.  A
    mixture-of-experts model: ~6 N_active per token plus attention (its MoE layers by
    :func:`moe_layer_forward_flops`, its dense layers as a dense model's).
    """
    s = training.seq_length
    # Logits GEMM, 2 s h V per sequence (Narayanan et al. 2021).
    logits = 2.0 * s * model.hidden_size * model.vocab_size
    if model.is_moe:
        per_seq = _layers_forward_flops(model, s) + logits
    else:
        per_seq = model.num_layers * layer_forward_flops(model, s) + logits
    return 3.0 * per_seq * training.global_batch_size


def hardware_flops_per_iteration(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """Executed FLOPs of one iteration (for HFU): model FLOPs plus recomputation.

    Full recompute adds one layer forward, ``96 B s L h^2 (1 + s/(6h) + V/(16 L h))``
    for GPT (Narayanan et al. 2021, eq. 3); selective adds the attention core.  A
    mixture-of-experts model's full recompute redoes its layers' active FLOPs.
    """
    redone = {"full": _ALL, "selective": ATTENTION_CORE, "none": ()}[plan.recompute]
    gemms = layer_gemms(model, training.seq_length, 1, 1)
    if model.is_moe and plan.recompute == "full":
        extra = _layers_forward_flops(model, training.seq_length)
    else:
        extra = sum(g.flops for g in gemms if g.name in redone) * model.num_layers
    return model_flops_per_iteration(model, training) + extra * training.global_batch_size
