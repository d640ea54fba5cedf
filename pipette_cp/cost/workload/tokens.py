"""Token volumes of mixture-of-experts layers and context parallelism (placement-free).

What one GPU holds and sends per micro-batch, shared by the time and memory models;
the placement-dependent times (all-to-all over the expert groups, the context-parallel
ring) are in :mod:`pipette_cp.cost.network.parallel_groups`.

Conventions (Megatron-Core's alltoall token dispatcher): a unit (one replica of a
stage) holds ``T = seq_length x micro_batch / cp`` tokens of a micro-batch; with
sequence parallelism (required with tp > 1 for experts) each of its tp ranks holds
``T / tp`` of them and routes each to ``top_k`` experts.  Dispatch sends every routed
copy to the expert-parallel rank of its expert (a fraction ``(ep - 1) / ep`` leaves the
GPU under uniform routing), then the ``etp`` ranks of an expert gather their tokens;
combine is the reverse.  Forward runs dispatch + combine once per MoE layer, backward
once more (the gradients), recomputation again.
"""

from __future__ import annotations

import functools

import numpy as np

from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import TrainingSpec
from pipette_cp.units import BYTES_PER_ELEMENT


def unit_tokens(training: TrainingSpec, plan: Plan) -> float:
    """Tokens of one micro-batch on one unit (a replica's stage): ``s b / cp``."""
    return training.seq_length * plan.micro_batch_size / plan.cp


def rank_tokens(training: TrainingSpec, plan: Plan) -> float:
    """Tokens one GPU routes per micro-batch: ``s b / cp``, ``/ tp`` with sequence
    parallelism."""
    shard = plan.tp if plan.sequence_parallel else 1
    return unit_tokens(training, plan) / shard


def expert_tokens(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """Token copies the busiest GPU's local experts compute per micro-batch and MoE layer.

    Dropless: the even share ``rank_tokens x top_k x etp`` (the expert tensor ranks
    gather their tokens) times ``training.moe_load_imbalance``.  With a capacity factor
    the busiest expert takes at most ``capacity x`` its share; padded to capacity
    (``moe_pad_to_capacity``) every expert computes exactly that.
    """
    even = rank_tokens(training, plan) * model.moe_top_k * plan.expert_tp
    if model.moe_capacity_factor is None:
        return even * training.moe_load_imbalance
    if training.moe_pad_to_capacity:
        return even * model.moe_capacity_factor
    return even * min(training.moe_load_imbalance, model.moe_capacity_factor)


def local_experts(model: ModelSpec, plan: Plan) -> int:
    """Routed experts on one GPU: ``num_experts / ep``."""
    return model.num_experts // plan.ep


def dispatch_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """Bytes one GPU sends to each other rank of its expert group in one dispatch (or
    combine) all-to-all, per MoE layer and micro-batch: its routed copies
    ``rank_tokens x top_k x h`` activations spread evenly over the ``ep`` ranks (times
    the load imbalance: the busiest receiver sets the pace)."""
    if plan.ep == 1:
        return 0.0
    elem = BYTES_PER_ELEMENT[training.precision]
    copies = rank_tokens(training, plan) * model.moe_top_k * model.expert_hidden_size * elem
    skew = 1.0 if model.moe_capacity_factor is not None else training.moe_load_imbalance
    return copies / plan.ep * skew


def moe_layers_by_chunk(model: ModelSpec, plan: Plan) -> np.ndarray:
    """MoE layers of every virtual stage (``c * pp + s``), as floats: Megatron assigns
    the layers to the virtual stages in that order (read-only, cached per split)."""
    pattern = (model.is_moe, model.first_k_dense_layers, model.moe_layer_freq, model.num_layers,
               model.hybrid_pattern)  # fmt: skip
    return _moe_by_chunk(pattern, plan.layer_split)


@functools.lru_cache(maxsize=4096)
def _moe_by_chunk(
    pattern: tuple[bool, int, int, int, str | None], split: tuple[int, ...]
) -> np.ndarray:
    is_moe, first, freq, layers, hybrid = pattern
    ends = np.cumsum(split, dtype=np.int64)
    starts = ends - np.asarray(split, dtype=np.int64)
    # a split of more layers than the model (a bound's probe) continues the pattern
    index = np.arange(max(layers, int(ends[-1]) if len(ends) else 0))
    moe = is_moe & (index >= first) & ((index - first) % freq == 0)
    if hybrid is not None:  # the E layers (a probe beyond the pattern repeats its last)
        moe = np.array([hybrid[min(int(i), len(hybrid) - 1)] == "E" for i in index])
    prefix = np.concatenate(([0.0], np.cumsum(moe, dtype=float)))
    out = prefix[ends] - prefix[starts]
    out.flags.writeable = False
    return out


def cp_chunk_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """Bytes of the key/value chunk one GPU passes to the next rank of its
    context-parallel ring in one step: K and V of its ``s b / cp`` tokens for its
    ``kv_heads / tp`` heads, K ``head_size`` and V ``v_head_size`` wide (latent attention:
    192 and 128 for DeepSeek-V3) (Megatron's p2p ring: ``cp - 1`` steps forward; backward
    passes K, V and their gradients, twice the bytes)."""
    if plan.cp == 1:
        return 0.0
    elem = BYTES_PER_ELEMENT[training.precision]
    heads = max(model.kv_heads // plan.tp, 1)
    width = model.head_size + model.v_head_size
    return unit_tokens(training, plan) * heads * width * elem
