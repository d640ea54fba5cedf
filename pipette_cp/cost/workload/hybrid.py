"""What the sublayers of a hybrid Mamba-Transformer model hold, by symbol (their GEMMs and
FLOPs: :mod:`pipette_cp.cost.workload.flops`).

A hybrid model (:mod:`pipette_cp.specs.model_hybrid`) stacks single sublayers: ``M``
(Mamba-2 mixer), ``*`` (attention), ``-`` (MLP), ``E`` (mixture-of-experts MLP).  Its
costs are those of each symbol times how many of them a virtual stage holds
(:func:`symbols_by_chunk`), Megatron assigning the pattern's layers to the virtual
stages in order.

The Mamba-2 mixer on one tensor-parallel rank (Megatron-Core ``MambaMixer``: heads
and groups split over tp, ``in_proj`` column- and ``out_proj`` row-parallel):

- ``in_proj``: ``T x h`` by ``h x (2 d_inner + 2 G N + H) / t``; ``out_proj``:
  ``T x d_inner / t`` by ``d_inner / t x h``; these run in FP8 / NVFP4 under a
  quantised recipe (Transformer Engine linears);
- the SSD scan (Dao and Gu 2024, sec. 6, the chunked algorithm of
  ``mamba_chunk_scan_combined``, chunks of
  :data:`~pipette_cp.cost.workload.flops.SSD_CHUNK` tokens) as the batched
  products it runs: ``C B^T`` per chunk and group (``Q x Q x N``), the masked
  products with ``x`` per head (``Q x P x Q``), the chunk states ``B^T x``
  (``N x P x Q``) and the states' contribution ``C S`` (``Q x P x N``); bf16 under
  every recipe;
- element-wise: the depth-wise convolution with its SiLU over ``x, B, C``, the gated
  RMSNorm over ``d_inner`` (read ``y`` and ``z``, write), the pre-norm and residual.
"""

from __future__ import annotations

import functools

import numpy as np

from pipette_cp.cost.workload.flops import SYMBOLS, fc1_factor
from pipette_cp.cost.workload.tokens import local_experts
from pipette_cp.specs import model_counts as counts
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan


def symbols_by_chunk(model: ModelSpec, plan: Plan) -> dict[str, np.ndarray]:
    """Layers of each symbol in every virtual stage ``c * pp + s`` (floats, read-only)."""
    assert model.hybrid_pattern is not None
    return _by_chunk(model.hybrid_pattern, plan.layer_split)


@functools.lru_cache(maxsize=4096)
def _by_chunk(pattern: str, split: tuple[int, ...]) -> dict[str, np.ndarray]:
    ends = np.cumsum(split, dtype=np.int64)
    starts = ends - np.asarray(split, dtype=np.int64)
    # a split of more layers than the pattern (a bound's probe) repeats its last symbol
    length = max(len(pattern), int(ends[-1]) if len(ends) else 0)
    symbols = np.array(list(pattern + pattern[-1] * (length - len(pattern))))
    out = {}
    for symbol in SYMBOLS:
        prefix = np.concatenate(([0.0], np.cumsum(symbols == symbol, dtype=float)))
        counts_ = prefix[ends] - prefix[starts]
        counts_.flags.writeable = False
        out[symbol] = counts_
    return out


def stage_symbols(model: ModelSpec, plan: Plan, stage: int) -> dict[str, int]:
    """Layers of each symbol on ``stage`` over all its chunks."""
    chunks = [c * plan.pp + stage for c in range(plan.vpp)]
    return {k: int(v[chunks].sum()) for k, v in symbols_by_chunk(model, plan).items()}


def present_symbols(model: ModelSpec) -> tuple[str, ...]:
    """The symbols the pattern uses, in :data:`SYMBOLS` order."""
    return tuple(s for s in SYMBOLS if s in (model.hybrid_pattern or ""))


# ------------------------------------------------------------------ parameters
def hybrid_param_split(model: ModelSpec, plan: Plan, symbol: str) -> tuple[float, float]:
    """(dense, routed-expert) parameters of one sublayer on one GPU.

    Split over tp: the Mamba projections and convolution and its per-head vectors and
    gated norm (Megatron-Core shards them with the heads), the attention projections, the
    MLP and the shared experts; replicated: the pre-norm and the router.  The routed
    experts: ``num_experts / ep`` of them, split over etp.
    """
    t, h = plan.tp, model.hidden_size
    pre_norm = counts.norm(model, h)
    if symbol == "E":
        shared, latent = model.shared_expert_params, counts.latent_projections(model)
        experts = local_experts(model, plan) * model.expert_params / plan.expert_tp
        return pre_norm + model.router_params + latent + shared / t, experts
    body = model.hybrid_layer_params(symbol) - pre_norm
    return pre_norm + body / t, 0.0


def hybrid_gemm_params_per_gpu(model: ModelSpec, plan: Plan, symbol: str) -> float:
    """Weights of one sublayer's quantised GEMMs on one GPU (no norms, router or scan)."""
    t, h = plan.tp, model.hidden_size
    if symbol == "M":
        return h * (model.mamba_in_proj_width + model.mamba_inner) / t
    if symbol == "*":
        return counts.attention(model) / t
    per_width = (fc1_factor(model) + 1) * h
    if symbol == "-":
        return model.ffn_hidden_size * per_width / t
    latent_width = (fc1_factor(model) + 1) * model.expert_hidden_size
    routed = local_experts(model, plan) * model.expert_width * latent_width / plan.expert_tp
    return model.shared_expert_width * per_width / t + routed + counts.latent_projections(model)
