"""The transformer architecture being trained, and its parameter counts."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from pipette_cp.errors import UnsupportedError
from pipette_cp.specs._base import FrozenSpec

Activation = Literal["gelu", "swiglu"]
Norm = Literal["layernorm", "rmsnorm"]
PositionEmbedding = Literal["learned", "rope", "alibi"]


class ModelSpec(FrozenSpec):
    """A decoder-only transformer, as Megatron-LM builds it.

    Parameter counts are derived, never entered, so that a typo in a width
    shows up as a wrong count in the tests against published sizes.

    Examples
    --------
    >>> m = ModelSpec(name="llama-2-7b", num_layers=32, hidden_size=4096,
    ...               num_attention_heads=32, ffn_hidden_size=11008, vocab_size=32000,
    ...               activation="swiglu", norm="rmsnorm", position_embedding="rope",
    ...               linear_bias=False, tied_embeddings=False, max_seq_length=4096)
    >>> round(m.total_params / 1e9, 2)
    6.74
    """

    name: str = Field(description="Short identifier, e.g. 'llama-2-7b'.")
    num_layers: int = Field(gt=0, description="Number of transformer blocks.")
    hidden_size: int = Field(gt=0, description="Model width h.")
    num_attention_heads: int = Field(gt=0, description="Query heads a.")
    num_kv_heads: int | None = Field(
        default=None,
        gt=0,
        description="Key/value heads (grouped-query attention); None means equal to the query heads.",
    )
    head_dim: int | None = Field(
        default=None, gt=0, description="Width of one head; None means hidden_size / heads."
    )
    ffn_hidden_size: int = Field(gt=0, description="Width of the MLP's inner layer.")
    vocab_size: int = Field(gt=0, description="Vocabulary size V (before any padding).")
    activation: Activation = Field(
        default="gelu", description="MLP type: 'gelu' (2 GEMMs) or 'swiglu' (gated, 3 GEMMs)."
    )
    norm: Norm = Field(default="layernorm", description="Normalisation layer type.")
    position_embedding: PositionEmbedding = Field(
        default="learned",
        description="'learned' adds a max_seq_length x hidden table; 'rope'/'alibi' add no parameters.",
    )
    linear_bias: bool = Field(default=True, description="Whether the linear layers carry biases.")
    qkv_bias: bool = Field(
        default=False,
        description="Biases on the query, key and value projections only (Qwen2; Megatron "
        "--add-qkv-bias); linear_bias puts them on every linear layer.",
    )
    tied_embeddings: bool = Field(
        default=True, description="Whether the LM head shares the input embedding's weights."
    )
    max_seq_length: int = Field(gt=0, description="Longest sequence the model supports, tokens.")
    rotary_base: int = Field(
        default=10000,
        gt=0,
        description="RoPE base period (Megatron --rotary-base; Hugging Face rope_theta): 10000 "
        "for Llama 2 and Mistral 7B, 500000 for Llama 3, 1000000 for Qwen2; unused without "
        "rotary positions.",
    )
    rotary_fraction: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="Fraction of each head's width that RoPE rotates (Megatron --rotary-percent; "
        "GPT-NeoX rotary_pct, 0.25 for GPT-NeoX-20B).",
    )
    rope_scaling_factor: int | None = Field(
        default=None,
        gt=0,
        description="Llama 3.1 RoPE frequency scaling by this whole factor, 8 for Llama 3.1 "
        "(Megatron --use-rope-scaling --rope-scaling-factor; Hugging Face rope_scaling of "
        "rope_type 'llama3' with low and high frequency factors 1 and 4 over 8192 original "
        "positions, which Megatron fixes); None: no scaling.",
    )
    norm_epsilon: float = Field(
        default=1e-5,
        gt=0,
        description="Epsilon of the normalisation layers (Megatron --norm-epsilon; Hugging Face "
        "rms_norm_eps, layer_norm_eps, layer_norm_epsilon).",
    )
    attention_dropout_fraction: float = Field(
        default=0.1,
        ge=0,
        lt=1,
        description="Dropout probability of the attention weights (Megatron --attention-dropout, "
        "default 0.1); exported as 0 when training.dropout is off.",
    )
    hidden_dropout_fraction: float = Field(
        default=0.1,
        ge=0,
        lt=1,
        description="Dropout probability after the attention and MLP blocks and the embedding "
        "(Megatron --hidden-dropout, default 0.1); exported as 0 when training.dropout is off.",
    )
    num_experts: int = Field(
        default=1, gt=0, description="MoE experts per layer; 1 = dense. MoE is not modelled yet."
    )
    moe_top_k: int = Field(default=1, gt=0, description="Experts each token is routed to (MoE).")
    source: str = Field(default="", description="Where the numbers come from (paper, config file).")

    @model_validator(mode="before")
    @classmethod
    def _default_kv_heads(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("num_kv_heads") is None:
            data = {**data, "num_kv_heads": data.get("num_attention_heads")}
        return data

    @field_validator("name")
    @classmethod
    def _name_not_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelSpec:
        if self.num_attention_heads % self.kv_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not divisible by "
                f"num_kv_heads={self.kv_heads}"
            )
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by "
                f"num_attention_heads={self.num_attention_heads}; give head_dim explicitly"
            )
        return self

    # ------------------------------------------------------------ derived sizes
    @property
    def kv_heads(self) -> int:
        """Key/value heads (equal to the query heads without GQA)."""
        return self.num_kv_heads or self.num_attention_heads

    @property
    def head_size(self) -> int:
        """Width of one attention head."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    def require_dense(self) -> None:
        """Raise :class:`UnsupportedError` for mixture-of-experts models."""
        if self.is_moe:
            raise UnsupportedError(
                "model.num_experts", self.num_experts, "mixture-of-experts is not modelled yet"
            )

    @property
    def attention_params(self) -> int:
        """Q, K, V and output projections of one layer (plus their biases: all four with
        ``linear_bias``, Q, K and V alone with ``qkv_bias``)."""
        h = self.hidden_size
        q_width = self.num_attention_heads * self.head_size
        kv_width = self.kv_heads * self.head_size
        weights = h * q_width + 2 * h * kv_width + q_width * h
        if self.linear_bias:
            biases = q_width + 2 * kv_width + h
        else:
            biases = q_width + 2 * kv_width if self.qkv_bias else 0
        return weights + biases

    @property
    def mlp_params(self) -> int:
        """MLP of one layer: 2 matrices for GeLU, 3 for SwiGLU (plus biases)."""
        h, f = self.hidden_size, self.ffn_hidden_size
        n_in = 2 if self.activation == "swiglu" else 1
        weights = (n_in + 1) * h * f
        biases = (n_in * f + h) if self.linear_bias else 0
        return weights + biases

    @property
    def norm_params(self) -> int:
        """One normalisation layer: scale (and shift for LayerNorm)."""
        return (2 if self.norm == "layernorm" else 1) * self.hidden_size

    @property
    def params_per_layer(self) -> int:
        """One transformer block: attention, MLP (every expert and the router for
        MoE) and its two norms."""
        router = self.hidden_size * self.num_experts if self.is_moe else 0
        return (
            self.attention_params
            + self.num_experts * self.mlp_params
            + router
            + 2 * self.norm_params
        )

    @property
    def embedding_params(self) -> int:
        """Word embedding plus learned position embedding, if any."""
        positions = self.max_seq_length if self.position_embedding == "learned" else 0
        return (self.vocab_size + positions) * self.hidden_size

    @property
    def output_params(self) -> int:
        """Untied LM-head weights (0 when tied to the embedding)."""
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        """Every parameter: blocks, embeddings, final norm and untied LM head."""
        return (
            self.num_layers * self.params_per_layer
            + self.embedding_params
            + self.norm_params
            + self.output_params
        )
