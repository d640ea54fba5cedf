"""What one transformer layer computes and moves on one GPU, dense or mixture-of-experts.

:func:`layer_work` lists a layer's GEMMs (but the attention core's), its memory-bound
traffic and its TP collectives, timed by :func:`pipette_cp.cost.compute.model_chunks.layer_times`
with the GEMM roofline.  A dense layer: QKV, projection, FC1 and FC2.  A
mixture-of-experts layer keeps the dense layer's attention and replaces its MLP;
placement-free, per micro-batch, on the busiest GPU of an expert-parallel group (the
step waits for it).  Token volumes as :mod:`pipette_cp.cost.workload.tokens` counts them
(Megatron-Core's alltoall token dispatcher, sequence parallelism with tp > 1): a GPU
routes ``R = s b / (cp tp)`` tokens, its local experts compute ``X`` token copies
(:func:`~pipette_cp.cost.workload.tokens.expert_tokens`).

- **router** (``R x h x E``) in bf16 even under FP8 (a plain PyTorch linear outside
  Transformer Engine; Megatron can run it in fp32, which this does not model), its
  softmax and top-k (fp32 logits), the auxiliary load-balancing loss and the z-loss
  (:data:`ROUTER_BYTES_PER_LOGIT`);
- **permute / unpermute** of the GPU's ``R x top_k`` routed copies before dispatch and
  after combine (read + write of ``h`` activations each);
- **routed experts**: SwiGLU (or GeLU) FC1 of ``h x fc1 W / etp`` and FC2 of
  ``W / etp x h`` over ``X`` rows, as one grouped GEMM of the ``E / ep`` local experts
  (``training.moe_grouped_gemm``: one launch, :class:`~pipette_cp.cost.workload.flops.Gemm` with
  ``batch`` = local experts and ``m`` = rows per expert, so tile and wave quantisation
  are per expert) or one GEMM per expert (each pays the calibrated per-call fixed cost);
- **shared experts**: a dense MLP of width ``shared_expert_width`` split over tp, over
  the ``s b / cp`` gathered tokens, with its all-gather and reduce-scatter like the
  dense MLP's, and the optional sigmoid gate (a GEMV over ``h``, memory-bound);
- **expert tensor parallelism** (``etp > 1``): the all-gather of the routed tokens
  inside the expert-tensor group before the experts and the reduce-scatter after,
  ``X x h`` activations each.

Not here: the expert-parallel all-to-all (dispatch and combine), which depends on the
placement (:mod:`pipette_cp.cost.network.parallel_groups`, from :func:`~pipette_cp.cost.workload.tokens.dispatch_bytes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipette_cp.cost.compute.context_ring import per_rank_training
from pipette_cp.cost.stack.kernels import (
    activation_bytes,
    cast_bytes_per_element,
    keeps_quantized_tensors,
    norm_bytes,
    quantization_cast_bytes,
)
from pipette_cp.cost.workload.flops import (
    ATTENTION_CORE,
    ATTENTION_PROJECTIONS,
    Gemm,
    fc1_factor,
    layer_gemms,
)
from pipette_cp.cost.workload.latent_attention import (
    attention_cast_elements,
    latent_norm_elements,
    rope_elements,
)
from pipette_cp.cost.workload.tokens import expert_tokens, local_experts, rank_tokens
from pipette_cp.errors import SpecError, UnsupportedError
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import TrainingSpec
from pipette_cp.units import BYTES_PER_ELEMENT

#: HBM bytes per router logit (``R x E``), forward, fp32: softmax reads and writes the
#: logits (4 + 4 B), top-k reads the probabilities (4 B) (assumption: Megatron-Core's
#: router with fp32 probabilities, unfused).
ROUTER_BYTES_PER_LOGIT = 12.0
#: Extra bytes per logit of the auxiliary load-balancing loss (reads the probabilities
#: once for the per-expert sums) and of the z-loss (reads the logits once for their
#: logsumexp), each only when its coefficient is non-zero (assumption).
AUX_LOSS_BYTES_PER_LOGIT = 4.0
Z_LOSS_BYTES_PER_LOGIT = 4.0
#: The attention GEMMs a MoE layer shares with the dense layer (its MLP is replaced).
ATTENTION_GEMMS = ATTENTION_PROJECTIONS


@dataclass(frozen=True)
class LayerWork:
    """One layer's work on one GPU per micro-batch (forward) besides the attention core;
    MoE: on the busiest GPU."""

    #: the layer GEMMs (FP8 under fp8 training): QKV and projection, then FC1 and FC2
    #: (dense) or the routed experts (grouped: 2, else 2 per local expert) and the
    #: shared experts
    gemms: tuple[Gemm, ...]
    #: the router GEMM (bf16 under every precision); None in a dense layer
    router: Gemm | None
    #: HBM bytes of the memory-bound kernels: norms, bias-dropout-adds, RoPE, the
    #: activation and (MoE) the router, permute/unpermute and shared-expert gate kernels
    elementwise_bytes: float
    #: TP collectives (all-gather or reduce-scatter) of the ``s b h / cp`` activation:
    #: 4 in a dense layer; 2 of attention, 2 more for the shared experts in a MoE layer
    activation_collectives: int
    #: bytes of one expert-tensor-parallel all-gather (and of the reduce-scatter) of the
    #: routed tokens, ``X h`` (0 with etp = 1 and in a dense layer)
    expert_collective_bytes: float
    #: the MLP's share of ``elementwise_bytes``: the activation and (MoE) the router,
    #: permute/unpermute and shared-expert gate kernels (what recomputing it redoes)
    mlp_elementwise_bytes: float = 0.0
    #: whether the layer has an attention core (a hybrid model's sublayers but ``*``: no)
    attention: bool = True
    #: bf16 GEMMs under every precision besides the router (a Mamba mixer's SSD scan)
    scan_gemms: tuple[Gemm, ...] = ()


def _elementwise_forward_bytes(
    model: ModelSpec, training: TrainingSpec, plan: Plan, activation_elements: float
) -> float:
    """Bytes moved by the memory-bound kernels of one layer's forward (fused as Megatron)
    but the MoE router's and permutations; ``activation_elements``: what the activation
    reads (``T f / t`` in a dense layer)."""
    s, b, t = training.seq_length, plan.micro_batch_size, plan.tp
    tokens, h = s * b // plan.cp, model.hidden_size
    drop = 1.0 if training.dropout else 0.0
    rows = tokens * h / (t if plan.sequence_parallel else 1)
    # Two norms (cost.kernels.norm_bytes: fused, read + write 2 B), two
    # bias-dropout-add (x, residual, out, mask).
    total = rows * (2 * norm_bytes(model, training, plan) + 2 * (6.0 + drop))
    # The activation (cost.kernels.activation_bytes): fused bias-GeLU reads and writes
    # T f/t, bias-SwiGLU reads 2 T f/t and writes T f/t; unfused kernels move more.
    total += activation_elements * activation_bytes(model, training)
    if model.position_embedding == "rope":  # read + write 2 B (cost.latent_attention)
        total += 4.0 * rope_elements(model, tokens, t)
    # latent attention's two latent norms over the duplicated down-projections' rows
    total += latent_norm_elements(model, tokens, plan) * norm_bytes(model, training, plan)
    return total


def expert_rows(model: ModelSpec, training: TrainingSpec, plan: Plan) -> int:
    """Rows each local expert's GEMMs run over on the busiest GPU: its even share of
    :func:`~pipette_cp.cost.workload.tokens.expert_tokens` (rounded up to whole tokens)."""
    return math.ceil(expert_tokens(model, training, plan) / local_experts(model, plan))


def expert_gemms(model: ModelSpec, training: TrainingSpec, plan: Plan) -> tuple[Gemm, ...]:
    """Forward GEMMs of the local routed experts: one grouped FC1 and FC2 (batched over
    the local experts) or, without ``moe_grouped_gemm``, FC1 and FC2 per expert."""
    h, width, etp = model.expert_hidden_size, model.expert_width, plan.expert_tp  # LatentMoE
    rows, local = expert_rows(model, training, plan), local_experts(model, plan)
    fc1_n, fc2_k = fc1_factor(model) * width // etp, width // etp
    if training.moe_grouped_gemm:
        return (
            Gemm("expert_fc1", rows, fc1_n, h, local),
            Gemm("expert_fc2", rows, h, fc2_k, local),
        )
    return (Gemm("expert_fc1", rows, fc1_n, h), Gemm("expert_fc2", rows, h, fc2_k)) * local


def latent_gemms(model: ModelSpec, training: TrainingSpec, plan: Plan) -> tuple[Gemm, ...]:
    """LatentMoE's projections of the GPU's routed tokens, down to the latent before the
    dispatch and back up after the combine (weights whole on every tensor-parallel rank,
    an assumption); none without a latent."""
    latent, h = model.moe_latent_size, model.hidden_size
    if not latent:
        return ()
    routed = math.ceil(rank_tokens(training, plan))
    return Gemm("latent_down", routed, latent, h), Gemm("latent_up", routed, h, latent)


def shared_gemms(model: ModelSpec, training: TrainingSpec, plan: Plan) -> tuple[Gemm, ...]:
    """Forward GEMMs of the shared experts (one MLP, column- then row-parallel over tp)."""
    width, t = model.shared_expert_width, plan.tp
    if not width:
        return ()
    tokens, h = training.seq_length * plan.micro_batch_size // plan.cp, model.hidden_size
    return (
        Gemm("shared_fc1", tokens, fc1_factor(model) * width // t, h),
        Gemm("shared_fc2", tokens, h, width // t),
    )


def layer_work(model: ModelSpec, training: TrainingSpec, plan: Plan, moe: bool) -> LayerWork:
    """A dense layer's work, or (``moe``) a mixture-of-experts layer's on the busiest GPU
    (see the module docstring); :class:`SpecError` for ``moe`` with a dense model."""
    s, b, t = training.seq_length, plan.micro_batch_size, plan.tp
    if not moe:
        gemms = tuple(
            g
            for g in layer_gemms(model, s, b, t, plan.cp, plan.sequence_parallel)
            if g.name not in ATTENTION_CORE
        )
        activation = s * b // plan.cp * model.ffn_hidden_size / t
        moved = _elementwise_forward_bytes(model, training, plan, activation)
        return LayerWork(gemms, None, moved, 4, 0.0, activation * activation_bytes(model, training))
    if not model.is_moe:
        raise SpecError("model.num_experts", model.num_experts, "a dense model has no "
                        "mixture-of-experts layer to time (moe=True)")  # fmt: skip
    h, t, elem = model.hidden_size, plan.tp, BYTES_PER_ELEMENT[training.precision]
    routed = rank_tokens(training, plan)  # R
    copies = expert_tokens(model, training, plan)  # X
    tokens = training.seq_length * plan.micro_batch_size // plan.cp
    logits = routed * model.num_experts
    per_logit = ROUTER_BYTES_PER_LOGIT
    per_logit += AUX_LOSS_BYTES_PER_LOGIT if model.moe_router_aux_loss_coeff else 0.0
    per_logit += Z_LOSS_BYTES_PER_LOGIT if model.moe_z_loss_coeff else 0.0
    # permute before dispatch and unpermute after combine: read + write every copy (of
    # the latent width under LatentMoE)
    permute = 2.0 * 2.0 * routed * model.moe_top_k * model.expert_hidden_size * elem
    # the gate: a GEMV reading the input, then the output scaled (read + write)
    gate = 3.0 * routed * h * elem if model.shared_expert_gate else 0.0
    activation = copies * model.expert_width / plan.expert_tp
    activation += tokens * model.shared_expert_width / t
    moved = _elementwise_forward_bytes(model, training, plan, activation)
    mlp = latent_gemms(model, training, plan) + expert_gemms(model, training, plan)
    mlp += shared_gemms(model, training, plan)
    return LayerWork(
        gemms=attention_gemms(model, training, plan) + mlp,
        router=Gemm("router", math.ceil(routed), model.num_experts, h),
        elementwise_bytes=moved + logits * per_logit + permute + gate,
        activation_collectives=4 if model.shared_expert_width else 2,
        expert_collective_bytes=copies * model.expert_hidden_size * elem
        if plan.expert_tp > 1
        else 0.0,
        mlp_elementwise_bytes=(
            logits * per_logit + permute + gate + activation * activation_bytes(model, training)
        ),
    )


def layer_cast_bytes(
    model: ModelSpec, training: TrainingSpec, plan: Plan, moe: bool
) -> tuple[float, float]:
    """HBM bytes of one layer's casts to FP8 or NVFP4, (forward, backward).  Dense:
    :func:`pipette_cp.cost.stack.kernels.quantization_cast_bytes` over a context-parallel
    rank's tokens.  MoE, counted alike: the inputs of QKV, projection and the MLP's
    (:func:`moe_mlp_cast_elements`) in forward, their output gradients in backward;
    without kept quantised weights (torchao) also every local weight each way.  The
    router stays bf16 (no cast)."""
    if not moe:
        return quantization_cast_bytes(model, per_rank_training(training, plan), plan)
    tokens = training.seq_length * plan.micro_batch_size // plan.cp
    attn_fwd, attn_bwd, attn_weights = attention_cast_elements(model, tokens, plan)
    mlp_fwd, mlp_bwd, mlp_weights = moe_mlp_cast_elements(model, training, plan)
    forward, backward = attn_fwd + mlp_fwd, attn_bwd + mlp_bwd
    if not keeps_quantized_tensors(training):
        weights = attn_weights + mlp_weights
        forward, backward = forward + weights, backward + weights
    per_element = cast_bytes_per_element(training)
    return forward * per_element, backward * per_element


def moe_mlp_cast_elements(
    model: ModelSpec, training: TrainingSpec, plan: Plan
) -> tuple[float, float, float]:
    """Elements the casts of one MoE MLP touch on one GPU, (forward inputs, backward output
    gradients, weights): the routed FC1/FC2 over ``X`` rows of the experts' width (the
    latent under LatentMoE), the shared FC1/FC2 over the rank's tokens (their FC1 input
    before the sequence-parallel all-gather) and LatentMoE's projections over the routed
    tokens."""
    tokens = training.seq_length * plan.micro_batch_size // plan.cp
    h, e, t, etp = model.hidden_size, model.expert_hidden_size, plan.tp, plan.expert_tp
    shared, width, n1 = model.shared_expert_width, model.expert_width, fc1_factor(model)
    copies = expert_tokens(model, training, plan)
    hidden = h / t if plan.sequence_parallel else float(h)
    forward = copies * (e + width / etp)
    backward = copies * (n1 * width / etp + e)
    weights = local_experts(model, plan) * (n1 + 1) * width * e / etp
    if shared:
        forward += tokens * (hidden + shared / t)
        backward += tokens * (n1 * shared / t + hidden)
        weights += (n1 + 1) * shared * h / t
    if latent := model.moe_latent_size:
        routed = rank_tokens(training, plan)
        forward, backward = forward + routed * (h + latent), backward + routed * (latent + h)
        weights += 2 * h * latent
    return forward, backward, weights


def attention_gemms(model: ModelSpec, training: TrainingSpec, plan: Plan) -> tuple[Gemm, ...]:
    """The QKV and output-projection GEMMs of a MoE layer (the dense layer's)."""
    s, b = training.seq_length, plan.micro_batch_size
    gemms = layer_gemms(model, s, b, plan.tp, plan.cp, plan.sequence_parallel)
    return tuple(g for g in gemms if g.name in ATTENTION_GEMMS)


def check_profile(model: ModelSpec, plan: Plan) -> None:
    """Refuse measured layer times where they do not describe the layers.

    Raises
    ------
    UnsupportedError
        A mixture-of-experts model (a profile measures the dense layer only), or
        ``plan.cp > 1`` (a profile measures whole sequences, without the K/V ring).
    """
    if model.is_hybrid:
        raise UnsupportedError("model.hybrid_pattern", model.hybrid_pattern, "a LayerProfile "
                               "measures a transformer layer, not a hybrid model's sublayers: "
                               "drop the profile to use the analytic model")  # fmt: skip
    if model.is_moe:
        raise UnsupportedError("model.num_experts", model.num_experts, "a LayerProfile "
                               "measures the dense layer only, not the mixture-of-experts "
                               "layers (router, experts, token permutation): drop the "
                               "profile to use the analytic model")  # fmt: skip
    if plan.cp > 1:
        raise UnsupportedError("plan.cp", plan.cp, "a LayerProfile measures layers over "
                               "whole sequences, without the context-parallel split and "
                               "K/V ring: drop the profile to use the analytic model")  # fmt: skip
