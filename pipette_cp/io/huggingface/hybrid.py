"""The hybrid Mamba-Transformer family of Hugging Face configs: Nemotron-H (``nemotron_h``).

NVIDIA's Nemotron-H (dense: Mamba-2 mixers, attention and squared-ReLU MLPs) and
Nemotron 3 (the same with mixture-of-experts MLPs) share transformers'
``NemotronHConfig`` (``models/nemotron_h/configuration_nemotron_h.py``): one sublayer
per symbol of ``hybrid_override_pattern`` (``M`` Mamba-2, ``*`` attention, ``-`` MLP,
``E`` experts), or of ``layers_block_type`` in configs saved by newer transformers
(``mamba``/``linear_attention``, ``attention``/``full_attention``, ``mlp``, ``moe``).
Every sublayer is ``NemotronHBlock``: an RMSNorm of ``layer_norm_epsilon`` and one mixer.

- Mamba-2 (``NemotronHMamba2Mixer``): ``mamba_num_heads`` heads of ``mamba_head_dim``
  (``expand`` is not read: the mixer's width is heads x head width), ``n_groups`` groups
  of ``ssm_state_size``, a causal convolution of ``conv_kernel`` taps with its bias;
- attention (``NemotronHAttention``, Jamba's): no position embedding at all (the
  config's ``rope_theta`` and ``partial_rotary_factor`` are read by nothing), ``head_dim``
  (``attention_head_dim`` in Nemotron-H's configs);
- MLP (``NemotronHMLP``): ``up_proj`` and ``down_proj`` with ``mlp_hidden_act`` relu2;
- experts (``NemotronHMoE``, DeepSeek-V3's router with its ``e_score_correction_bias``):
  ``n_routed_experts`` of ``moe_intermediate_size``, top ``num_experts_per_tok``, and the
  shared expert of ``moe_shared_expert_intermediate_size``.

Refused, naming the key: biases (``use_bias``, ``mlp_bias``, ``attention_bias``,
``mamba_proj_bias``), a convolution without bias, an activation other than relu2 (MLP)
or SiLU (Mamba), multi-token prediction (``num_nextn_predict_layers``: the config does
not give its block's layers), sliding-window attention and any other layer symbol.
Latent experts (``moe_latent_size``, Nemotron 3 Super's LatentMoE) are read.
"""

from __future__ import annotations

from typing import Any

from pipette_cp.errors import SpecError, UnsupportedError
from pipette_cp.io.huggingface.reader import Reader, check_heads
from pipette_cp.specs.model_hybrid import HYBRID_SYMBOLS

#: ``layers_block_type`` names (current and legacy transformers spellings) -> symbol.
BLOCK_TYPES = {"mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*",
               "mlp": "-", "moe": "E"}  # fmt: skip
#: Nemotron-H's attention has no position embedding (NoPE: transformers' NemotronHAttention
#: applies no rotary; Megatron-Bridge builds it with position_embedding_type "none").
NEMOTRON_POSITIONS = "none"
_NO_BIAS = "biases are not modelled in hybrid layers"


def _pattern(r: Reader) -> str:
    """``hybrid_override_pattern``, or ``layers_block_type`` spelled as one."""
    if r.data.get("hybrid_override_pattern") is not None or r.data.get("layers_block_type") is None:
        key, pattern = "hybrid_override_pattern", r.text("hybrid_override_pattern", "")
        if not pattern:
            raise SpecError(r.field(key), pattern or None, f"missing or empty; required in a {r.model_type!r} config")  # fmt: skip
    else:
        key, types = "layers_block_type", r.get("layers_block_type")
        if not isinstance(types, list) or not types or not all(isinstance(t, str) for t in types):
            raise SpecError(r.field(key), types, "expected a non-empty list of layer type names")
        unknown = next((t for t in types if t not in BLOCK_TYPES), None)
        if unknown is not None:
            raise UnsupportedError(r.field(key), types, f"layer type {unknown!r} is not modelled "
                                   f"(modelled: {', '.join(BLOCK_TYPES)})")  # fmt: skip
        pattern = "".join(BLOCK_TYPES[t] for t in types)
    bad = next((c for c in pattern if c not in HYBRID_SYMBOLS), None)
    if bad is not None:
        allowed = ", ".join(f"{k} ({v})" for k, v in HYBRID_SYMBOLS.items())
        raise UnsupportedError(r.field(key), pattern, f"layer symbol {bad!r} is not modelled (modelled: {allowed})")  # fmt: skip
    layers = r.integer("num_hidden_layers", len(pattern))
    if layers != len(pattern):
        raise SpecError(
            r.field("num_hidden_layers"), layers, f"the {key} has {len(pattern)} layers"
        )
    return pattern


def _activations(r: Reader) -> None:
    """relu2 MLPs and SiLU Mamba mixers, the only ones modelled."""
    if (act := r.text("mlp_hidden_act", "relu2")) != "relu2":
        raise UnsupportedError(r.field("mlp_hidden_act"), act, "only squared-ReLU (relu2) MLPs are modelled for this family")  # fmt: skip
    if (act := r.text("mamba_hidden_act", "silu")) not in ("silu", "swish"):
        raise UnsupportedError(r.field("mamba_hidden_act"), act, "only SiLU Mamba-2 mixers are modelled")  # fmt: skip


def _attention(r: Reader) -> dict[str, Any]:
    """Heads and head width (``head_dim``, or Nemotron-H's ``attention_head_dim``)."""
    hidden, heads = r.integer("hidden_size"), r.integer("num_attention_heads")
    kv = r.integer("num_key_value_heads", heads)
    head_key = "head_dim" if r.data.get("head_dim") is not None else "attention_head_dim"
    head_dim = r.integer(head_key, None)
    if head_dim is None:
        check_heads(r, hidden, heads, kv, ("hidden_size", "num_attention_heads", "num_key_value_heads"))  # fmt: skip
    elif heads % kv:
        raise SpecError(r.field("num_key_value_heads"), kv, f"num_attention_heads={heads} is not divisible by it")  # fmt: skip
    if head_dim is not None and not hidden % heads and head_dim == hidden // heads:
        head_dim = None
    return {"hidden_size": hidden, "num_attention_heads": heads, "num_kv_heads": kv, "head_dim": head_dim}  # fmt: skip


def _mamba(r: Reader) -> dict[str, Any]:
    """The Mamba-2 widths (transformers' defaults; ``mamba_n_groups``, ``mamba_d_conv``:
    the keys of older configs)."""
    if not r.flag("use_conv_bias", True):
        raise UnsupportedError(r.field("use_conv_bias"), False, "a Mamba-2 convolution without bias is not modelled")  # fmt: skip
    groups = "n_groups" if "mamba_n_groups" not in r.data else "mamba_n_groups"
    conv = "conv_kernel" if "mamba_d_conv" not in r.data else "mamba_d_conv"
    return {
        "mamba_num_heads": r.integer("mamba_num_heads"),
        "mamba_head_dim": r.integer("mamba_head_dim", 64),
        "mamba_state_dim": r.integer("ssm_state_size", 128),
        "mamba_num_groups": r.integer(groups, 8),
        "mamba_conv_kernel": r.integer(conv, 4),
    }


def _experts(r: Reader) -> dict[str, Any]:
    """The mixture-of-experts MLPs of the E layers: routed experts, the shared expert
    transformers' ``NemotronHMoE`` always builds, and the router's expert bias."""
    experts = r.integer("n_routed_experts")
    top_k = r.integer("num_experts_per_tok")
    if top_k > experts:
        raise SpecError(
            r.field("num_experts_per_tok"), top_k, f"exceeds n_routed_experts={experts}"
        )
    if experts == 1:
        raise UnsupportedError(r.field("n_routed_experts"), 1, "E layers of one expert are not modelled (give - layers)")  # fmt: skip
    shared = r.integer("n_shared_experts", 1, zero=True)
    if shared == 0:
        raise UnsupportedError(r.field("n_shared_experts"), 0, "transformers' NemotronHMoE always "
                               "builds its shared expert (moe_shared_expert_intermediate_size)")  # fmt: skip
    return {
        "num_experts": experts,
        "moe_top_k": top_k,
        "moe_ffn_hidden_size": r.integer("moe_intermediate_size"),
        "num_shared_experts": shared,
        "shared_expert_ffn_hidden_size": r.integer("moe_shared_expert_intermediate_size"),
        "moe_router_expert_bias": True,
    }


def nemotron_h(r: Reader) -> dict[str, Any]:
    """Nemotron-H and Nemotron 3 (the module doc)."""
    for key in ("use_bias", "mlp_bias", "attention_bias", "mamba_proj_bias"):
        r.refuse(key, _NO_BIAS)
    r.refuse("num_nextn_predict_layers", "the config does not give the multi-token prediction "
             "block's layers: write a model file with mtp_layers and mtp_hybrid_pattern")  # fmt: skip
    r.refuse("sliding_window", "sliding-window attention is not modelled with a hybrid pattern")
    pattern = _pattern(r)
    _activations(r)
    fields: dict[str, Any] = {
        "num_layers": len(pattern),
        "hybrid_pattern": pattern,
        **_attention(r),
        "vocab_size": r.integer("vocab_size"),
        "activation": "squared_relu",
        "norm": "rmsnorm",
        "position_embedding": NEMOTRON_POSITIONS,
        "linear_bias": False,
        "tied_embeddings": r.flag("tie_word_embeddings", False),
        "max_seq_length": r.integer("max_position_embeddings"),
        "norm_epsilon": r.number("layer_norm_epsilon", 1e-5),
        "attention_dropout_fraction": r.dropout("attention_dropout", default=0.0),
        "hidden_dropout_fraction": r.dropout("hidden_dropout", default=0.0),
    }
    notes = ["no position embedding in the attention layers (NoPE)"]
    if "M" in pattern:
        fields.update(_mamba(r))
    if "E" in pattern:
        fields.update(_experts(r))
        if r.get("moe_latent_size", None) is not None:  # Nemotron 3 Super's LatentMoE
            fields["moe_latent_size"] = r.integer("moe_latent_size")
        notes.append("the routing's expert groups (n_group, topk_group) and routed_scaling_factor")
    if "-" in pattern or "E" not in pattern:
        fields["ffn_hidden_size"] = r.integer("intermediate_size")
    else:  # no dense MLP: the width is unused, and a config may leave it out
        fields["ffn_hidden_size"] = r.integer("intermediate_size", fields["moe_ffn_hidden_size"])
    fields["_notes"] = notes
    return fields
