"""The transformer architecture being trained, and its parameter counts."""

from __future__ import annotations

from pydantic import Field, ValidationInfo, field_validator, model_validator

from pipette_cp.errors import UnsupportedError
from pipette_cp.specs import model_counts as counts
from pipette_cp.specs.model_fields import Activation, Norm, PositionEmbedding
from pipette_cp.specs.model_hybrid import check_hybrid_layers, check_latent_moe
from pipette_cp.specs.model_moe import MoeFields

__all__ = ["Activation", "ModelSpec", "Norm", "PositionEmbedding"]
#: The widths of multi-head latent attention besides kv_lora_rank (q_lora_rank is optional).
_MLA_WIDTHS = ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")


class ModelSpec(MoeFields):
    """A decoder-only transformer, as Megatron-LM builds it: dense, or with
    mixture-of-experts layers, multi-head latent attention and multi-token prediction.

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
    >>> moe = m.model_copy(update={"num_experts": 8, "moe_top_k": 2})
    >>> round(moe.total_params / 1e9, 1), round(moe.active_params / 1e9, 1)
    (37.0, 11.1)
    """

    mtp_layers: int = Field(
        default=0,
        ge=0,
        description="Multi-token prediction modules after the last layer (DeepSeek-V3 "
        "num_nextn_predict_layers 1, Megatron --mtp-num-layers), each one block of the last "
        "layer's kind with its norms and eh_proj; counted in total_params.",
    )
    qk_rope_head_dim: int | None = Field(
        default=None,
        gt=0,
        description="Multi-head latent attention: width of the rotary part of each query and "
        "key head (64 for DeepSeek-V3); None without latent attention.",
    )
    qk_nope_head_dim: int | None = Field(
        default=None,
        gt=0,
        description="Multi-head latent attention: width of the non-rotary part of each query "
        "and key head (128 for DeepSeek-V3).",
    )
    v_head_dim: int | None = Field(
        default=None,
        gt=0,
        description="Multi-head latent attention: width of each value head (128 for DeepSeek-V3).",
    )
    q_lora_rank: int | None = Field(
        default=None,
        gt=0,
        description="Multi-head latent attention: rank of the query compression (1536 for "
        "DeepSeek-V3); None: one q_proj (DeepSeek-V2-Lite).",
    )
    kv_lora_rank: int | None = Field(
        default=None,
        gt=0,
        description="Multi-head latent attention (DeepSeek-V2/V3, Megatron "
        "--multi-latent-attention): rank of the shared key/value compression (512 for "
        "DeepSeek-V3); needs qk_rope_head_dim, qk_nope_head_dim and v_head_dim; None: "
        "ordinary attention.",
    )
    source: str = Field(default="", description="Where the numbers come from (paper, config file).")

    # ------------------------------------------------------------ validation
    @field_validator("kv_lora_rank")
    @classmethod
    def _latent_attention_complete(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is None:
            return value
        missing = [name for name in _MLA_WIDTHS if info.data.get(name) is None]
        heads, kv = info.data.get("num_attention_heads"), info.data.get("num_kv_heads")
        if missing:
            rule = f"multi-head latent attention also needs {', '.join(missing)}"
        elif heads is not None and kv != heads:
            rule = f"latent attention has no key/value heads of its own: num_kv_heads={kv} must equal num_attention_heads={heads}"  # fmt: skip
        elif info.data.get("head_dim") is not None:
            rule = "latent attention sets its head widths itself: drop head_dim"
        elif any(info.data.get(k) for k in ("linear_bias", "qkv_bias", "qk_norm")):
            rule = "biases and q/k norms are not modelled with latent attention (linear_bias, qkv_bias, qk_norm)"  # fmt: skip
        elif info.data.get("position_embedding") != "rope":
            rule = "latent attention rotates qk_rope_head_dim of each head: needs position_embedding 'rope'"  # fmt: skip
        else:
            return value
        raise ValueError(rule)

    @model_validator(mode="after")
    def _consistent(self) -> ModelSpec:
        self.check_hybrid()
        check_latent_moe(self)
        if self.is_hybrid:
            check_hybrid_layers(self)
        if not self.is_mla:
            given = [n for n in (*_MLA_WIDTHS, "q_lora_rank") if getattr(self, n) is not None]
            if given:
                raise ValueError(
                    f"{given[0]}={getattr(self, given[0])}: a multi-head latent attention width "
                    "without kv_lora_rank (give kv_lora_rank, or drop it for ordinary attention)"
                )
        if self.num_attention_heads % self.kv_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not divisible by "
                f"num_kv_heads={self.kv_heads}"
            )
        if (
            not self.is_mla
            and self.head_dim is None
            and self.hidden_size % self.num_attention_heads
        ):
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by "
                f"num_attention_heads={self.num_attention_heads}; give head_dim explicitly"
            )
        if self.yarn_scaling_factor is not None:
            if self.yarn_original_max_seq_length is None:
                raise ValueError(
                    f"yarn_scaling_factor={self.yarn_scaling_factor}: needs "
                    "yarn_original_max_seq_length (the context YaRN extends)"
                )
            if self.rope_scaling_factor is not None:
                raise ValueError(
                    f"yarn_scaling_factor={self.yarn_scaling_factor}: give one RoPE scaling, "
                    f"not also rope_scaling_factor={self.rope_scaling_factor}"
                )
        return self

    # ------------------------------------------------------------ derived sizes
    @property
    def kv_heads(self) -> int:
        """Key/value heads (equal to the query heads without GQA and with latent attention)."""
        return self.num_kv_heads or self.num_attention_heads

    @property
    def head_size(self) -> int:
        """Width of one attention head (of its queries and keys with latent attention)."""
        if self.is_mla:
            assert self.qk_nope_head_dim is not None and self.qk_rope_head_dim is not None
            return self.qk_nope_head_dim + self.qk_rope_head_dim
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def v_head_size(self) -> int:
        """Width of one value head (``v_head_dim`` with latent attention, else head_size)."""
        return self.v_head_dim if self.v_head_dim is not None else self.head_size

    @property
    def is_moe(self) -> bool:
        """Whether the model has mixture-of-experts layers."""
        return self.num_experts > 1

    @property
    def is_mla(self) -> bool:
        """Whether attention is multi-head latent attention (``kv_lora_rank`` given)."""
        return self.kv_lora_rank is not None

    def require_dense(self) -> None:
        """Raise :class:`UnsupportedError` for mixture-of-experts models."""
        if self.is_moe:
            raise UnsupportedError(
                "model.num_experts", self.num_experts, "mixture-of-experts is not modelled yet"
            )

    @property
    def expert_width(self) -> int:
        """Inner width of one routed expert."""
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    @property
    def shared_expert_width(self) -> int:
        """Total inner width of the shared experts (0 without them)."""
        return self.shared_expert_ffn_hidden_size or self.num_shared_experts * self.expert_width

    def is_moe_layer(self, layer: int) -> bool:
        """Whether block ``layer`` (0-based) is a mixture-of-experts layer (``E`` in a
        hybrid pattern)."""
        if self.hybrid_pattern is not None:
            return self.hybrid_pattern[layer] == "E"
        first, freq = self.first_k_dense_layers, self.moe_layer_freq
        return self.is_moe and layer >= first and (layer - first) % freq == 0

    @property
    def num_moe_layers(self) -> int:
        """Mixture-of-experts layers (0 for a dense model)."""
        if self.hybrid_pattern is not None:
            return self.hybrid_pattern.count("E")
        if not self.is_moe:
            return 0
        return -(-(self.num_layers - self.first_k_dense_layers) // self.moe_layer_freq)

    @property
    def num_dense_layers(self) -> int:
        """Layers with a dense MLP of ffn_hidden_size (``-`` in a hybrid pattern)."""
        if self.hybrid_pattern is not None:
            return self.hybrid_pattern.count("-")
        return self.num_layers - self.num_moe_layers

    @property
    def attention_params(self) -> int:
        """Attention of one layer: Q, K, V and output projections (plus their biases: all
        four with ``linear_bias``, Q, K and V alone with ``qkv_bias``), q/k norms and
        sinks, or the projections and norms of multi-head latent attention."""
        return counts.attention(self)

    @property
    def mlp_params(self) -> int:
        """Dense MLP of one layer: 2 matrices for GeLU, 3 for SwiGLU (plus biases)."""
        return counts.mlp(self, self.ffn_hidden_size)

    @property
    def expert_params(self) -> int:
        """One routed expert."""
        return counts.mlp(self, self.expert_width, self.expert_hidden_size)

    @property
    def router_params(self) -> int:
        """The router of one mixture-of-experts layer (0 for a dense model)."""
        return counts.router(self) if self.is_moe else 0

    @property
    def shared_expert_params(self) -> int:
        """The shared experts of one mixture-of-experts layer, with their gate."""
        return counts.shared_experts(self)

    @property
    def norm_params(self) -> int:
        """One normalisation layer of width h: scale (and shift for LayerNorm)."""
        return counts.norm(self, self.hidden_size)

    @property
    def dense_layer_params(self) -> int:
        """One dense block: attention, MLP and its norms."""
        return self.attention_params + self.mlp_params + counts.block_norms(self)

    @property
    def moe_layer_params(self) -> int:
        """One mixture-of-experts block: attention, every expert, the router, norms."""
        return self.attention_params + counts.moe_mlp(self, self.num_experts) + counts.block_norms(self)  # fmt: skip

    @property
    def moe_layer_active_params(self) -> int:
        """What one token uses of a mixture-of-experts block: its top-k routed experts,
        the shared experts, the router, attention and norms."""
        return self.attention_params + counts.moe_mlp(self, self.moe_top_k) + counts.block_norms(self)  # fmt: skip

    @property
    def params_per_layer(self) -> int:
        """One transformer block of a dense model.

        Raises :class:`UnsupportedError` for a mixture-of-experts model, whose blocks are
        :attr:`moe_layer_params` and :attr:`dense_layer_params`, and whose parameters per
        GPU depend on the expert layout, which is not modelled yet.
        """
        if self.is_hybrid:
            raise UnsupportedError("model.hybrid_pattern", self.hybrid_pattern, "a hybrid "
                                   "model's layers differ by symbol: see hybrid_layer_params")  # fmt: skip
        if self.is_moe:
            raise UnsupportedError(
                "model.num_experts", self.num_experts, "mixture-of-experts models are not "
                "modelled yet: their parameters per GPU depend on the expert layout (the blocks "
                "are moe_layer_params and dense_layer_params)",
            )  # fmt: skip
        return self.dense_layer_params

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
    def mtp_params(self) -> int:
        """The multi-token prediction modules (sharing the embedding and LM head)."""
        block = self.moe_layer_params if self.is_moe else self.dense_layer_params
        return self.mtp_layers * counts.mtp_module(self, block)

    def hybrid_layer_params(self, symbol: str, *, active: bool = False) -> int:
        """One sublayer of a hybrid model by its symbol, with its pre-norm (``E``: every
        routed expert, or the top-k with ``active``)."""
        return counts.hybrid_layer(self, symbol, active=active)

    @property
    def total_params(self) -> int:
        """Every parameter: blocks (every expert), embeddings, final norm, untied LM head
        and the multi-token prediction modules."""
        return counts.total(self, active=False)

    @property
    def active_params(self) -> int:
        """The parameters one token uses: every dense part (the embedding table and LM
        head included, as Mistral and Qwen count them), and of each mixture-of-experts
        layer the top-k routed experts, the shared experts and the router; the
        multi-token prediction modules likewise.  Equal to total_params when dense."""
        return counts.total(self, active=True)
