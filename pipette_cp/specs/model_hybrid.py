"""The hybrid state-space fields of :class:`~pipette_cp.specs.model.ModelSpec`.

A hybrid model (Megatron-Core's ``MambaModel``, Nemotron-H and Nemotron 3) is a stack
of single sublayers, one symbol per layer in its pattern (Megatron
``--hybrid-override-pattern``, ``megatron/core/ssm/mamba_hybrid_layer_allocation.py``):

- ``M``: a Mamba-2 mixer (Dao and Gu 2024, "Transformers are SSMs"): ``in_proj``
  (``h`` to ``z, x, B, C, dt``), a depth-wise causal convolution over ``x, B, C``, the
  state-space duality (SSD) scan, a gated RMSNorm and ``out_proj``;
- ``*``: self-attention alone; ``-``: an MLP alone; ``E``: a mixture-of-experts MLP
  alone (its router, routed and shared experts).

Each sublayer has its own pre-norm and residual.  The widths of the Mamba mixer are
``d_inner = mamba_num_heads x mamba_head_dim`` and ``mamba_num_groups`` groups of
``B`` and ``C`` of ``mamba_state_dim`` each.
"""

from __future__ import annotations

from typing import Literal, Protocol

from pydantic import Field, ValidationInfo, field_validator

from pipette_cp.specs.model_fields import TransformerFields

#: The symbols of a hybrid pattern and the sublayer each stands for.
HybridSymbol = Literal["M", "*", "-", "E"]
HYBRID_SYMBOLS: dict[str, str] = {
    "M": "Mamba-2 mixer",
    "*": "self-attention",
    "-": "MLP",
    "E": "mixture-of-experts MLP",
}
#: The Mamba fields and Megatron's defaults (``megatron/training/arguments.py``).
MAMBA_DEFAULTS = {"mamba_head_dim": 64, "mamba_state_dim": 128, "mamba_num_groups": 8,
                  "mamba_conv_kernel": 4}  # fmt: skip


class _HybridModel(Protocol):
    """What :func:`check_hybrid_layers` reads of a ``ModelSpec`` (not imported: it
    imports this module)."""

    @property
    def hybrid_pattern(self) -> str | None: ...
    @property
    def num_experts(self) -> int: ...
    @property
    def first_k_dense_layers(self) -> int: ...
    @property
    def moe_layer_freq(self) -> int: ...
    @property
    def mtp_layers(self) -> int: ...
    @property
    def kv_lora_rank(self) -> int | None: ...
    @property
    def linear_bias(self) -> bool: ...
    @property
    def post_sublayer_norm(self) -> bool: ...
    @property
    def mtp_hybrid_pattern(self) -> str | None: ...
    @property
    def moe_latent_size(self) -> int | None: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def is_moe(self) -> bool: ...


class HybridFields(TransformerFields):
    """The hybrid pattern and the Mamba-2 widths (module docstring)."""

    hybrid_pattern: str | None = Field(
        default=None,
        description="One symbol per layer of a hybrid model (Megatron --hybrid-override-pattern; "
        "Hugging Face hybrid_override_pattern): M a Mamba-2 mixer, * self-attention, - an MLP, "
        "E a mixture-of-experts MLP, each a sublayer of its own; None: every layer is "
        "attention followed by an MLP.",
    )
    mamba_num_heads: int | None = Field(
        default=None,
        gt=0,
        description="Heads of each Mamba-2 mixer (Megatron --mamba-num-heads); needed when the "
        "hybrid pattern has an M.",
    )
    mamba_head_dim: int = Field(
        default=64, gt=0, description="Width of one Mamba-2 head (Megatron --mamba-head-dim)."
    )
    mamba_state_dim: int = Field(
        default=128,
        gt=0,
        description="State width N of each Mamba-2 group (Megatron --mamba-state-dim; Hugging "
        "Face ssm_state_size).",
    )
    mamba_num_groups: int = Field(
        default=8,
        gt=0,
        description="Groups sharing one B and C projection in each Mamba-2 mixer (Megatron "
        "--mamba-num-groups; Hugging Face n_groups); divides mamba_num_heads.",
    )
    moe_latent_size: int | None = Field(
        default=None,
        gt=0,
        description="LatentMoE (Nemotron 3 Super, Megatron --moe-latent-size): each MoE layer "
        "projects its routed tokens from hidden_size down to this width before the dispatch and "
        "back up after the combine; the routed experts read and write it; None: no latent "
        "projection.",
    )
    mtp_hybrid_pattern: str | None = Field(
        default=None,
        description="A hybrid model's multi-token prediction block, in hybrid_pattern's symbols "
        "(Megatron --mtp-hybrid-override-pattern: '*E' for Nemotron 3 Super); needs mtp_layers.",
    )
    mamba_conv_kernel: int = Field(
        default=4,
        gt=0,
        description="Width of the Mamba-2 causal convolution (Hugging Face conv_kernel; "
        "Megatron's d_conv, fixed at 4).",
    )

    @field_validator("hybrid_pattern")
    @classmethod
    def _pattern_symbols(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return value
        bad = sorted({c for c in value if c not in HYBRID_SYMBOLS})
        if bad:
            allowed = ", ".join(f"{k} ({v})" for k, v in HYBRID_SYMBOLS.items())
            raise ValueError(f"unknown layer symbol {bad[0]!r}; allowed: {allowed}")
        layers = info.data.get("num_layers")
        if layers is not None and len(value) != layers:
            raise ValueError(f"has {len(value)} symbols, num_layers={layers}: one per layer")
        return value

    @field_validator("mtp_hybrid_pattern")
    @classmethod
    def _mtp_symbols(cls, value: str | None) -> str | None:
        if value is not None and (bad := sorted({c for c in value if c not in HYBRID_SYMBOLS})):
            raise ValueError(
                f"unknown layer symbol {bad[0]!r}; allowed: {', '.join(HYBRID_SYMBOLS)}"
            )
        if value == "":
            raise ValueError("must not be empty (None: no multi-token prediction block)")
        return value

    @field_validator("mamba_num_groups")
    @classmethod
    def _groups_divide_heads(cls, value: int, info: ValidationInfo) -> int:
        heads = info.data.get("mamba_num_heads")
        if heads is not None and heads % value:
            raise ValueError(f"must divide mamba_num_heads={heads}")
        return value

    def check_hybrid(self) -> None:
        """Cross-field rules (called by ``ModelSpec``'s model validator): Mamba widths with
        an ``M``, and none of them without a hybrid pattern."""
        pattern = self.hybrid_pattern or ""
        if "M" in pattern and self.mamba_num_heads is None:
            raise ValueError("hybrid_pattern has Mamba layers (M): give mamba_num_heads")
        if "M" not in pattern:
            given = [k for k, v in MAMBA_DEFAULTS.items() if getattr(self, k) != v]
            given += ["mamba_num_heads"] if self.mamba_num_heads is not None else []
            if given:
                raise ValueError(f"{given[0]}={getattr(self, given[0])}: a Mamba width "
                                 "without Mamba layers (M) in hybrid_pattern")  # fmt: skip

    # ------------------------------------------------------------ derived
    @property
    def expert_hidden_size(self) -> int:
        """The width the routed experts read and write and the dispatch carries:
        ``moe_latent_size`` under LatentMoE, else ``hidden_size``."""
        return self.moe_latent_size or self.hidden_size

    @property
    def is_hybrid(self) -> bool:
        """Whether the layers follow a hybrid pattern (module docstring)."""
        return self.hybrid_pattern is not None

    @property
    def mamba_inner(self) -> int:
        """``d_inner``: the Mamba-2 mixer's width, heads x head width (0 without Mamba)."""
        return (self.mamba_num_heads or 0) * self.mamba_head_dim

    @property
    def mamba_group_width(self) -> int:
        """``2 G N``: the widths of B and C over all groups."""
        return 2 * self.mamba_num_groups * self.mamba_state_dim

    @property
    def mamba_conv_width(self) -> int:
        """Channels of the causal convolution: ``x``, ``B`` and ``C``."""
        return self.mamba_inner + self.mamba_group_width

    @property
    def mamba_in_proj_width(self) -> int:
        """Outputs of ``in_proj``: ``z`` and ``x`` (``d_inner`` each), ``B``, ``C`` and one
        ``dt`` per head."""
        return 2 * self.mamba_inner + self.mamba_group_width + (self.mamba_num_heads or 0)

    def layer_symbol(self, layer: int) -> str:
        """The hybrid symbol of block ``layer`` (0-based); ValueError without a pattern."""
        if self.hybrid_pattern is None:
            raise ValueError("not a hybrid model: no hybrid_pattern")
        return self.hybrid_pattern[layer]


def check_hybrid_layers(m: _HybridModel) -> None:
    """The rules a hybrid pattern adds (see :mod:`pipette_cp.specs.model_hybrid`)."""
    pattern, mtp = m.hybrid_pattern or "", m.mtp_hybrid_pattern
    if mtp is not None and not m.mtp_layers:
        raise ValueError(f"mtp_hybrid_pattern={mtp!r} without mtp_layers")
    if m.mtp_layers and mtp is None:
        raise ValueError(f"mtp_layers={m.mtp_layers}: a hybrid model's multi-token prediction "
                         "block needs mtp_hybrid_pattern (e.g. '*E')")  # fmt: skip
    if "M" in (mtp or ""):
        raise ValueError(f"mtp_hybrid_pattern={mtp!r}: Mamba layers in the multi-token "
                         "prediction block are not modelled")  # fmt: skip
    if "E" in pattern + (mtp or "") and not m.is_moe:
        raise ValueError("hybrid_pattern has mixture-of-experts layers (E): give num_experts > 1")
    if m.is_moe and "E" not in pattern:
        raise ValueError(f"num_experts={m.num_experts} but hybrid_pattern has no E layer")
    rules = {
        "first_k_dense_layers": m.first_k_dense_layers == 0,
        "moe_layer_freq": m.moe_layer_freq == 1,
        "kv_lora_rank": m.kv_lora_rank is None,
        "linear_bias": not m.linear_bias,
        "post_sublayer_norm": not m.post_sublayer_norm,
    }
    for name, ok in rules.items():
        if not ok:
            raise ValueError(f"{name}={getattr(m, name)} is not modelled with a hybrid_pattern "
                             "(the pattern places the layers; hybrid layers have no biases "
                             "or latent attention here)")  # fmt: skip


def check_latent_moe(m: _HybridModel) -> None:
    """LatentMoE needs experts and a latent narrower than the hidden width; a hybrid
    multi-token prediction block needs a hybrid model."""
    latent = m.moe_latent_size
    if latent is not None and not m.is_moe:
        raise ValueError(f"moe_latent_size={latent}: LatentMoE needs num_experts > 1")
    if latent is not None and latent >= m.hidden_size:
        raise ValueError(f"moe_latent_size={latent} must be below hidden_size={m.hidden_size} "
                         "(the latent projection narrows the routed tokens)")  # fmt: skip
    if m.mtp_hybrid_pattern is not None and m.hybrid_pattern is None:
        raise ValueError(f"mtp_hybrid_pattern={m.mtp_hybrid_pattern!r} needs a hybrid_pattern")
