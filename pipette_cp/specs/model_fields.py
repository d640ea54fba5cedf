"""The dense transformer's fields of :class:`~pipette_cp.specs.model.ModelSpec`.

Widths, heads, norms, positions and the attention variants that change no layer's
kind (q/k norms, attention sinks, sliding windows, sandwich norms).  The experts,
latent attention and multi-token prediction fields, the cross-field checks and the
parameter counts are :class:`~pipette_cp.specs.model.ModelSpec`'s own.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from pipette_cp.specs._base import FrozenSpec

#: Most transformer blocks a model may have: the per-layer bookkeeping (which blocks are
#: dense, experts, Mamba, in which chunk) is linear in it; real models have a few hundred.
MAX_LAYERS = 100_000

Activation = Literal["gelu", "swiglu", "squared_relu"]
Norm = Literal["layernorm", "rmsnorm"]
PositionEmbedding = Literal["learned", "rope", "alibi", "none"]


class TransformerFields(FrozenSpec):
    """The fields every decoder-only transformer has (see ``ModelSpec``)."""

    name: str = Field(description="Short identifier, e.g. 'llama-2-7b'.")
    num_layers: int = Field(
        gt=0, le=MAX_LAYERS, description=f"Number of transformer blocks (at most {MAX_LAYERS:,})."
    )
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
    ffn_hidden_size: int = Field(
        gt=0,
        description="Width of the MLP's inner layer (of the dense layers; also of the experts "
        "unless moe_ffn_hidden_size is given).",
    )
    vocab_size: int = Field(gt=0, description="Vocabulary size V (before any padding).")
    activation: Activation = Field(
        default="gelu",
        description="MLP type: 'gelu' (2 GEMMs), 'swiglu' (gated, 3 GEMMs; Grok-1's gated "
        "GELU has the same three matrices and is written 'swiglu') or 'squared_relu' (2 GEMMs, "
        "ReLU squared: Nemotron-H, Megatron --squared-relu).",
    )
    norm: Norm = Field(default="layernorm", description="Normalisation layer type.")
    position_embedding: PositionEmbedding = Field(
        default="learned",
        description="'learned' adds a max_seq_length x hidden table; 'rope'/'alibi' add no "
        "parameters; 'none': no position information (Nemotron-H's attention).",
    )
    linear_bias: bool = Field(
        default=True,
        description="Whether every linear layer carries biases (the attention's four, the "
        "MLP's and every expert's, and the router's).",
    )
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
    yarn_scaling_factor: int | None = Field(
        default=None,
        gt=0,
        description="YaRN RoPE context extension by this whole factor (Hugging Face rope_scaling "
        "of type 'yarn' with beta_fast 32 and beta_slow 1: DeepSeek-V3 40, gpt-oss 32; "
        "Megatron-Core's rope_type 'yarn'); the family's attention-scale constants (mscale) "
        "are not recorded; adds no parameters; None: no YaRN.",
    )
    yarn_original_max_seq_length: int | None = Field(
        default=None,
        gt=0,
        description="Tokens of the context YaRN extends (Hugging Face "
        "original_max_position_embeddings: 4096 for DeepSeek-V3 and gpt-oss); only with "
        "yarn_scaling_factor.",
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
    qk_norm: bool = Field(
        default=False,
        description="A normalisation of each query and key head (head_dim weights each; Qwen3's "
        "q_norm and k_norm, Megatron --qk-layernorm).",
    )
    attention_sinks: bool = Field(
        default=False,
        description="One learned attention-sink logit per query head in every layer (gpt-oss's "
        "sinks).",
    )
    post_sublayer_norm: bool = Field(
        default=False,
        description="Normalise the attention's and the MLP's outputs too before each residual "
        "add (Grok-1's four norms per layer): two more norms per layer.",
    )
    sliding_window: int | None = Field(
        default=None,
        gt=0,
        description="Tokens a sliding-window layer attends to (Hugging Face sliding_window, 128 "
        "for gpt-oss); which layers slide: sliding_window_pattern; adds no parameters; None: "
        "every layer attends to the whole context.",
    )
    sliding_window_pattern: int | None = Field(
        default=None,
        ge=2,
        description="With sliding_window: every n-th layer (layers n-1, 2n-1, ...) attends to "
        "the whole context and the others slide (gpt-oss 2: Hugging Face layer_types "
        "alternating); None: every layer slides.",
    )

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

    @field_validator("yarn_original_max_seq_length")
    @classmethod
    def _yarn_needs_its_factor(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and info.data.get("yarn_scaling_factor") is None:
            raise ValueError("needs yarn_scaling_factor (the context YaRN extends)")
        return value

    @field_validator("sliding_window_pattern")
    @classmethod
    def _pattern_needs_a_window(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and info.data.get("sliding_window") is None:
            raise ValueError("needs sliding_window (the tokens the other layers attend to)")
        return value
