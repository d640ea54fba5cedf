"""What multi-head latent attention changes in a layer's traffic, collectives and memory.

Megatron-Core's ``MLASelfAttention`` (DeepSeek-V2, arXiv:2405.04434 sec. 2.1; V3,
arXiv:2412.19437 sec. 2.1.1), as its Transformer Engine layer spec builds it:

- ``linear_q_down_proj`` and ``linear_kv_down_proj`` are ``TELinear`` with
  ``parallel_mode='duplicated'``: every tensor-parallel rank holds the whole matrix and,
  with sequence parallelism, projects its own ``s / tp`` rows (no all-gather before them);
- the latents then go through their norms (``q_layernorm``, ``kv_layernorm``, fused into
  the up-projections as ``TELayerNormColumnParallelLinear``) and the column-parallel
  up-projections, whose sequence-parallel all-gather moves the latents
  (``q_lora_rank + kv_lora_rank``, or ``h + kv_lora_rank`` without a query compression)
  and the shared rotary key part (``qk_rope_head_dim``, gathered apart), not ``h``;
- the rotary part of the queries and the shared rotary key are rotated and concatenated
  into ``heads x (nope + rope)`` queries and keys and ``heads x v`` values, which the
  fused attention reads (``query.contiguous()``, ``key.contiguous()``).

The GEMMs themselves are :func:`pipette_cp.cost.workload.flops.attention_projection_gemms`.
"""

from __future__ import annotations

from pipette_cp.cost.workload.flops import attention_projection_gemms
from pipette_cp.specs import model_counts as counts
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan

#: Column-parallel projections fed by the sequence-parallel all-gather (their FP8 cast
#: runs before it, on the rank's ``1 / tp`` of the rows).
_GATHERED = ("qkv", "q_up", "q_proj", "kv_up")


def attention_input_width(model: ModelSpec) -> int:
    """Width per token of the tensor-parallel collective in front of the attention (the
    sequence-parallel all-gather, or the backward all-reduce of its input gradient): ``h``,
    or with latent attention the latents and the rotary key part."""
    if not model.is_mla:
        return model.hidden_size
    assert model.kv_lora_rank is not None and model.qk_rope_head_dim is not None
    queries = model.q_lora_rank or model.hidden_size
    return queries + model.kv_lora_rank + model.qk_rope_head_dim


def duplicated_params(model: ModelSpec) -> int:
    """Parameters of one layer's latent attention that every tensor-parallel rank holds
    whole: the down-projections (``TELinear(parallel_mode='duplicated')``, ``h x
    q_lora_rank`` and ``h x (kv_lora_rank + rope)``) and the latents' norms (the
    ``q_layernorm`` and ``kv_layernorm`` weights of the fused
    ``TELayerNormColumnParallelLinear`` up-projections, not split); 0 without latent
    attention (without ``q_lora_rank`` the queries' ``linear_q_proj`` is column-parallel)."""
    if not model.is_mla:
        return 0
    assert model.kv_lora_rank is not None and model.qk_rope_head_dim is not None
    h, q_rank = model.hidden_size, model.q_lora_rank or 0
    queries = h * q_rank + counts.norm(model, q_rank) if q_rank else 0
    latent = h * (model.kv_lora_rank + model.qk_rope_head_dim)
    return queries + latent + counts.norm(model, model.kv_lora_rank)


def attention_weight_elements(model: ModelSpec, tp: int) -> float:
    """Weight elements of one layer's attention GEMMs on one tensor-parallel rank (``k n``
    of every projection: the duplicated down-projections whole, the rest ``/ tp``): the
    weights part of :func:`attention_cast_elements`."""
    return float(sum(g.k * g.n for g in attention_projection_gemms(model, tp, tp)))


def latent_norm_elements(model: ModelSpec, tokens: float, plan: Plan) -> float:
    """Elements the latent norms read per forward (q_lora_rank and kv_lora_rank per
    token) over the rank's rows: the duplicated down-projections' outputs, ``/ tp`` with
    sequence parallelism; 0 without latent attention."""
    if not model.is_mla:
        return 0.0
    assert model.kv_lora_rank is not None
    rows = tokens / plan.tp if plan.sequence_parallel else tokens
    return rows * ((model.q_lora_rank or 0) + model.kv_lora_rank)


def rope_elements(model: ModelSpec, tokens: float, tp: int) -> float:
    """Elements the rotary embedding reads per forward on one rank: the query and key
    heads' widths, or with latent attention (Megatron-Core's ``fused_apply_mla_rope_for_q``
    and ``_for_kv``, which also assemble the attention's inputs) the queries, keys and
    values it writes, ``heads (2 (nope + rope) + v) / tp`` per token."""
    heads, d = model.num_attention_heads, model.head_size
    if not model.is_mla:
        return tokens * (heads + model.kv_heads) * d / tp
    return tokens * heads * (2 * d + model.v_head_size) / tp


def latent_activation_bytes(model: ModelSpec) -> float:
    """Bytes per token the latents keep for the backward beyond the norm's output that
    feeds the down-projections (Korthikanti's QKV input): each latent's norm input and
    output (the fused norm-linear keeps both), 2 B each, q_lora_rank and kv_lora_rank
    wide; replicated over tp unless sequence parallel; 0 without latent attention."""
    if not model.is_mla:
        return 0.0
    assert model.kv_lora_rank is not None
    return 2.0 * 2.0 * ((model.q_lora_rank or 0) + model.kv_lora_rank)


def attention_cast_elements(
    model: ModelSpec, tokens: int, plan: Plan
) -> tuple[float, float, float]:
    """Elements the FP8 casts of one layer's attention projections touch on one rank,
    (forward inputs, backward output gradients, weights).

    Forward: each GEMM's input (``m k``; a column-parallel input fed by the
    sequence-parallel all-gather is cast before it, ``/ tp``); backward: each output
    gradient (``m n``; the row-parallel projection's before its reduce-scatter is the
    ``/ tp`` hidden vector with sequence parallelism); weights ``k n``.  For ordinary
    attention this is the QKV and projection part of
    :func:`pipette_cp.cost.stack.kernels.quantization_cast_bytes`.
    """
    t, sp = plan.tp, plan.sequence_parallel
    forward = backward = 0.0
    for g in attention_projection_gemms(model, tokens, t, sp):
        forward += g.m * g.k / (t if sp and g.name in _GATHERED else 1)
        if g.name == "proj":
            backward += g.m * g.n / (t if sp else 1)
        else:
            backward += g.m * g.n
    return forward, backward, attention_weight_elements(model, t)
