"""Parameter counts of a :class:`~pipette_cp.specs.model.ModelSpec`, part by part.

Every count is the number of weights Hugging Face's and Megatron-LM's modules of that
architecture hold (``sum(p.numel())``): the ``ModelSpec`` properties of the same
names call these functions.
"""

from __future__ import annotations

from typing import Protocol

from pipette_cp.specs.model_fields import Activation, Norm


class ModelSpec(Protocol):
    """What the counts read of a model: the fields and derived sizes of
    :class:`pipette_cp.specs.model.ModelSpec` (which satisfies this, and whose properties
    call the counts: so this module does not import it)."""

    @property
    def activation(self) -> Activation: ...

    @property
    def attention_sinks(self) -> bool: ...

    @property
    def dense_layer_params(self) -> int: ...

    @property
    def embedding_params(self) -> int: ...

    @property
    def expert_width(self) -> int: ...

    @property
    def head_size(self) -> int: ...

    @property
    def hidden_size(self) -> int: ...

    @property
    def is_mla(self) -> bool: ...

    @property
    def is_moe(self) -> bool: ...

    @property
    def kv_heads(self) -> int: ...

    @property
    def kv_lora_rank(self) -> int | None: ...

    @property
    def linear_bias(self) -> bool: ...

    @property
    def moe_layer_active_params(self) -> int: ...

    @property
    def moe_layer_params(self) -> int: ...

    @property
    def moe_router_expert_bias(self) -> bool: ...

    @property
    def mtp_layers(self) -> int: ...

    @property
    def norm(self) -> Norm: ...

    @property
    def num_attention_heads(self) -> int: ...

    @property
    def num_dense_layers(self) -> int: ...

    @property
    def num_experts(self) -> int: ...

    @property
    def num_moe_layers(self) -> int: ...

    @property
    def num_shared_experts(self) -> int: ...

    @property
    def output_params(self) -> int: ...

    @property
    def post_sublayer_norm(self) -> bool: ...

    @property
    def q_lora_rank(self) -> int | None: ...

    @property
    def qk_nope_head_dim(self) -> int | None: ...

    @property
    def qk_norm(self) -> bool: ...

    @property
    def qk_rope_head_dim(self) -> int | None: ...

    @property
    def qkv_bias(self) -> bool: ...

    @property
    def shared_expert_gate(self) -> bool: ...

    @property
    def shared_expert_width(self) -> int: ...

    @property
    def v_head_dim(self) -> int | None: ...

    @property
    def hybrid_pattern(self) -> str | None: ...

    @property
    def ffn_hidden_size(self) -> int: ...

    @property
    def mamba_num_heads(self) -> int | None: ...

    @property
    def mamba_inner(self) -> int: ...

    @property
    def mamba_conv_width(self) -> int: ...

    @property
    def mamba_conv_kernel(self) -> int: ...

    @property
    def mamba_in_proj_width(self) -> int: ...

    @property
    def moe_top_k(self) -> int: ...

    @property
    def moe_latent_size(self) -> int | None: ...

    @property
    def expert_hidden_size(self) -> int: ...

    @property
    def mtp_hybrid_pattern(self) -> str | None: ...


def norm(m: ModelSpec, width: int) -> int:
    """One normalisation layer over ``width`` features: scale (and shift for LayerNorm)."""
    return (2 if m.norm == "layernorm" else 1) * width


def mlp(m: ModelSpec, width: int, hidden: int | None = None) -> int:
    """An MLP of inner ``width``: 2 matrices for GeLU, 3 for SwiGLU (plus biases), reading
    and writing ``hidden`` (default ``hidden_size``; a LatentMoE expert its latent)."""
    h = hidden or m.hidden_size
    n_in = 2 if m.activation == "swiglu" else 1
    biases = (n_in * width + h) if m.linear_bias else 0
    return (n_in + 1) * h * width + biases


def latent_attention(m: ModelSpec) -> int:
    """Multi-head latent attention (DeepSeek-V2/V3; Megatron-Core MLASelfAttention).

    Queries through q_a_proj (h x q_lora_rank), its norm and q_b_proj, or one q_proj
    without q_lora_rank; keys and values through kv_a_proj_with_mqa (h x (kv_lora_rank +
    the shared rope part)), its norm and kv_b_proj (kv_lora_rank x heads (nope + v));
    o_proj (heads v x h).  No biases (ModelSpec refuses them with latent attention).
    """
    assert m.kv_lora_rank is not None and m.qk_rope_head_dim is not None
    assert m.qk_nope_head_dim is not None and m.v_head_dim is not None
    h, heads, rope = m.hidden_size, m.num_attention_heads, m.qk_rope_head_dim
    q_out = heads * (m.qk_nope_head_dim + rope)
    if m.q_lora_rank is None:
        queries = h * q_out
    else:
        queries = h * m.q_lora_rank + norm(m, m.q_lora_rank) + m.q_lora_rank * q_out
    latent = h * (m.kv_lora_rank + rope) + norm(m, m.kv_lora_rank)
    keys_values = latent + m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
    return queries + keys_values + heads * m.v_head_dim * h


def attention(m: ModelSpec) -> int:
    """One layer's attention: projections (and biases), q/k norms, attention sinks."""
    if m.is_mla:
        params = latent_attention(m)
    else:
        h = m.hidden_size
        q_width = m.num_attention_heads * m.head_size
        kv_width = m.kv_heads * m.head_size
        params = h * q_width + 2 * h * kv_width + q_width * h
        if m.linear_bias:
            params += q_width + 2 * kv_width + h
        elif m.qkv_bias:
            params += q_width + 2 * kv_width
        if m.qk_norm:
            params += 2 * norm(m, m.head_size)
    return params + (m.num_attention_heads if m.attention_sinks else 0)


def block_norms(m: ModelSpec) -> int:
    """The norms of one block: before attention and MLP (and after, with post_sublayer_norm)."""
    return (4 if m.post_sublayer_norm else 2) * norm(m, m.hidden_size)


def router(m: ModelSpec) -> int:
    """The router of one MoE layer: h x experts (a bias with linear_bias, and the
    load-balancing expert bias with moe_router_expert_bias)."""
    experts = m.num_experts
    biases = (experts if m.linear_bias else 0) + (experts if m.moe_router_expert_bias else 0)
    return m.hidden_size * experts + biases


def shared_experts(m: ModelSpec) -> int:
    """The shared experts of one MoE layer, one MLP of their total width (and the gate)."""
    if not m.num_shared_experts:
        return 0
    gate = m.hidden_size if m.shared_expert_gate else 0
    return mlp(m, m.shared_expert_width) + gate


def latent_projections(m: ModelSpec) -> int:
    """LatentMoE's down- and up-projection of one MoE layer (``h x latent`` each; 0 without)."""
    return 2 * m.hidden_size * m.moe_latent_size if m.moe_latent_size else 0


def moe_mlp(m: ModelSpec, experts: int) -> int:
    """One MoE layer's MLP with ``experts`` routed experts (over the latent width under
    LatentMoE, with its projections), the shared ones and the router."""
    routed = experts * mlp(m, m.expert_width, m.expert_hidden_size) + latent_projections(m)
    return routed + shared_experts(m) + router(m)


def mtp_module(m: ModelSpec, block: int) -> int:
    """One multi-token prediction module around a block of ``block`` parameters.

    DeepSeek-V3's (Megatron-Core's MultiTokenPredictionLayer): the norms of the
    embedding and of the hidden state (enorm, hnorm), the projection of both to h
    (eh_proj, 2h x h, no bias), one transformer block and its final norm; the
    embedding and the output head are the main model's.
    """
    h = m.hidden_size
    return 3 * norm(m, h) + 2 * h * h + block


def mamba(m: ModelSpec) -> int:
    """One Mamba-2 mixer (Megatron-Core ``MambaMixer``, no biases): ``in_proj`` (``h`` x
    its width), the depth-wise convolution (a weight per tap and a bias per channel),
    ``A_log``, ``D`` and ``dt_bias`` per head, the gated RMSNorm over ``d_inner`` and
    ``out_proj`` (``d_inner x h``)."""
    h, inner = m.hidden_size, m.mamba_inner
    conv = m.mamba_conv_width * (m.mamba_conv_kernel + 1)
    return h * m.mamba_in_proj_width + conv + 3 * (m.mamba_num_heads or 0) + inner + inner * h


def hybrid_layer(m: ModelSpec, symbol: str, *, active: bool) -> int:
    """One sublayer of a hybrid model with its pre-norm: a Mamba-2 mixer (``M``), attention
    (``*``), an MLP of ``ffn_hidden_size`` (``-``) or a mixture-of-experts MLP (``E``:
    every routed expert, or the top-k with ``active``)."""
    if symbol == "E":
        body = moe_mlp(m, m.moe_top_k if active else m.num_experts)
    else:
        body = {"M": mamba, "*": attention, "-": lambda x: mlp(x, x.ffn_hidden_size)}[symbol](m)
    return norm(m, m.hidden_size) + body


def total(m: ModelSpec, *, active: bool) -> int:
    """Every parameter, or (``active``) those one token uses: the top-k routed experts
    of each MoE layer instead of all of them."""
    if m.hybrid_pattern is not None:
        layers = sum(hybrid_layer(m, c, active=active) for c in m.hybrid_pattern)
        block = sum(hybrid_layer(m, c, active=active) for c in m.mtp_hybrid_pattern or "")
        mtp = m.mtp_layers * mtp_module(m, block)
        return layers + m.embedding_params + norm(m, m.hidden_size) + m.output_params + mtp
    moe_block = m.moe_layer_active_params if active else m.moe_layer_params
    dense_block = m.dense_layer_params
    layers = m.num_dense_layers * dense_block + m.num_moe_layers * moe_block
    mtp = m.mtp_layers * mtp_module(m, moe_block if m.is_moe else dense_block)
    return layers + m.embedding_params + norm(m, m.hidden_size) + m.output_params + mtp
