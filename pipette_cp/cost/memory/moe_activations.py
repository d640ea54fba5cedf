"""Activation terms of mixture-of-experts layers and of context parallelism (per GPU).

Used by :mod:`pipette_cp.cost.memory.peak`; every term is bytes for one micro-batch on the
busiest GPU, placement-free.  Token volumes come from :mod:`pipette_cp.cost.workload.tokens`: a
unit holds ``s b / cp`` tokens, a GPU routes ``rank_tokens`` of them (``/ tp`` with
sequence parallelism) and its local experts compute ``expert_tokens`` copies (top k,
gathered over etp, times the load imbalance or the capacity).

A mixture-of-experts layer keeps, instead of the dense MLP's terms (Megatron-Core
``MoELayer`` with ``TopKRouter``, the alltoall or allgather token dispatcher and
``TEGroupedMLP``; stored activations 2 B as in Korthikanti et al. 2022, GEMM inputs
1 B under Transformer Engine FP8):

- router: its input, the pre-MLP norm's output (2 B x h, the router GEMM's saved input,
  shared with the shared experts' FC1), the fp32 logits and scores (4 + 4 B per expert:
  the softmax keeps its output, the z-/aux-loss the logits; errs high when unused), the
  bool routing map (1 B per expert) and the top-k probabilities and indices (4 + 8 B
  per copy, the permutation's row map);
- experts: the permuted token copies the local experts compute: FC1 input (h), FC1
  output (the activation's input, ``2 expert_width / etp`` for SwiGLU, else
  ``expert_width / etp``, 2 B) and FC2 input (``expert_width / etp``), as the dense MLP of
  Korthikanti et al. counts them;
- combine: the un-permutation keeps the expert outputs for the gradient of the routing
  probabilities (``rank_tokens x top_k x h`` after the alltoall combine,
  ``expert_tokens x h`` with the allgather dispatcher) where the framework applies the
  probabilities there; nothing where it applies them in the experts' activation
  (``Framework.moe_probs_in_activation``: the ``megatron-bridge`` profile);
- shared experts: a dense MLP of ``shared_expert_width`` split over tp (its FC1 input is
  the router's input, an extra FP8 copy under FP8).

The transient dispatch and combine buffers (all-to-all send and receive, the sorted
copy by local expert; or the gathered tokens of the allgather dispatcher) and the
context-parallel ring's key/value buffers are working set (:func:`moe_temporary_bytes`,
:func:`cp_temporary_bytes`).  Selective recomputation is Megatron's default
(``--recompute-modules core_attn``): the MoE terms stay, unless Megatron-Core's ``moe``,
``shared_experts``, ``moe_act`` or ``layernorm`` modules are recomputed
(:func:`pipette_cp.cost.memory.recompute.module_savings`).
"""

from __future__ import annotations

from pipette_cp.cost.stack.frameworks import resolve_framework
from pipette_cp.cost.stack.kernels import (
    keeps_quantized_tensors,
    quantized_bytes,
    unfused_activation_extra_bytes,
)
from pipette_cp.cost.workload.tokens import cp_chunk_bytes, expert_tokens, rank_tokens, unit_tokens
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import TrainingSpec
from pipette_cp.units import BYTES_PER_ELEMENT

#: Router bytes per routed token and expert: fp32 logits and scores, bool routing map.
ROUTER_BYTES_PER_EXPERT = 4.0 + 4.0 + 1.0
#: Router bytes per routed copy (token x top k): fp32 probability, int64 index.
ROUTER_BYTES_PER_COPY = 4.0 + 8.0


def _gemm_in(training: TrainingSpec) -> float:
    """Bytes of a GEMM input kept for the weight gradient (FP8 under Transformer Engine)."""
    return quantized_bytes(training) if keeps_quantized_tensors(training) else 2.0


def _mlp_bytes_per_width(model: ModelSpec, training: TrainingSpec) -> float:
    """Bytes one token keeps per element of an MLP's inner width: FC1 output (2 x 2 B for
    SwiGLU's gate and up, 2 B for GeLU), FC2 input, unfused SwiGLU's SiLU output."""
    fc1_out = 4.0 if model.activation == "swiglu" else 2.0
    return fc1_out + _gemm_in(training) + unfused_activation_extra_bytes(model, training)


def router_activation_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """The router's kept tensors on one GPU (its input, logits, scores, map, top k)."""
    per_token = (
        2.0 * model.hidden_size
        + ROUTER_BYTES_PER_EXPERT * model.num_experts
        + ROUTER_BYTES_PER_COPY * model.moe_top_k
    )
    return rank_tokens(training, plan) * per_token


def expert_activation_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """The local experts' kept tensors on the busiest GPU: FC1 input, FC1 output and FC2
    input of every token copy they compute."""
    width = model.expert_width / plan.expert_tp
    per_copy = (
        _gemm_in(training) * model.expert_hidden_size
        + _mlp_bytes_per_width(model, training) * width
    )
    return expert_tokens(model, training, plan) * per_copy


def latent_activation_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """LatentMoE's projections: the up-projection's input (the combined latent, a GEMM
    input) and, under a quantised recipe, the down-projection's quantised copy of the
    router's input; 0 without a latent."""
    if not model.moe_latent_size:
        return 0.0
    quantized = quantized_bytes(training) if keeps_quantized_tensors(training) else 0.0
    per_token = _gemm_in(training) * model.moe_latent_size + quantized * model.hidden_size
    return rank_tokens(training, plan) * per_token


def combine_activation_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """The expert outputs the un-permutation keeps (2 B x h per copy); 0 where the experts
    apply the routing probabilities in their activation."""
    if resolve_framework(training.framework).moe_probs_in_activation:
        return 0.0
    if training.moe_token_dispatcher == "allgather":
        copies = expert_tokens(model, training, plan)
    else:
        copies = rank_tokens(training, plan) * model.moe_top_k
    return 2.0 * model.expert_hidden_size * copies


def shared_expert_activation_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """The shared experts, a dense MLP of ``shared_expert_width`` over tp (Korthikanti et
    al. 2022's MLP terms); under FP8 their FC1 keeps an FP8 copy of its input."""
    if not model.num_shared_experts:
        return 0.0
    fp8_in = quantized_bytes(training) if keeps_quantized_tensors(training) else 0.0
    inputs = rank_tokens(training, plan) * model.hidden_size * fp8_in
    inner = unit_tokens(training, plan) * model.shared_expert_width / plan.tp
    return inputs + inner * _mlp_bytes_per_width(model, training)


def moe_mlp_activation_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """What a mixture-of-experts layer keeps for its MLP part, in place of the dense MLP's
    FC1 input and inner terms: router, experts, combine and shared experts."""
    return (
        router_activation_bytes(model, training, plan)
        + latent_activation_bytes(model, training, plan)
        + expert_activation_bytes(model, training, plan)
        + combine_activation_bytes(model, training, plan)
        + shared_expert_activation_bytes(model, training, plan)
    )


def moe_temporary_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """Transient dispatch buffers of one MoE layer (assumption, errs high): alltoall, the
    send buffer of the permuted copies, the receive buffer and the copy sorted by local
    expert; allgather, the tokens gathered over the ``ep x etp`` ranks and the local
    experts' permuted input.  Backward runs the same buffers for the gradients."""
    if not model.is_moe:
        return 0.0
    elem = BYTES_PER_ELEMENT[training.precision]
    routed = rank_tokens(training, plan)
    computed = expert_tokens(model, training, plan)
    if training.moe_token_dispatcher == "allgather":
        tokens = routed * plan.ep * plan.expert_tp + computed
    else:
        tokens = routed * model.moe_top_k + 2.0 * computed
    return tokens * model.expert_hidden_size * elem


def cp_temporary_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """The context-parallel ring's buffers at the backward peak (Transformer Engine's p2p
    ring attention, Megatron's default ``--cp-comm-type p2p``): the key/value chunk and
    its gradient, each double-buffered (send and receive), 4 chunks."""
    return 4.0 * cp_chunk_bytes(model, training, plan)
