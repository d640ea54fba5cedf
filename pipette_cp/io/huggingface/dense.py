"""The dense families of Hugging Face configs: Llama, Mistral, Qwen2, Qwen3, GPT-2, GPT-NeoX.

Each parser turns a :class:`~pipette_cp.io.huggingface.reader.Reader` into ModelSpec fields.
:func:`llama_core` holds what every Llama-style family (these and the
mixture-of-experts ones of :mod:`pipette_cp.io.huggingface.moe`) shares.
"""

from __future__ import annotations

from typing import Any

from pipette_cp.errors import UnsupportedError
from pipette_cp.io.huggingface.reader import (
    Reader,
    check_heads,
    llama_biases,
    rope_scaling,
    silu_gated,
)

#: The Qwen families whose ``use_sliding_window`` is refused.
QWEN_TYPES = frozenset({"qwen2", "qwen3", "qwen2_moe", "qwen3_moe"})


def llama_core(
    r: Reader, *, rope_theta: int = 10_000, eps: float = 1e-6, yarn: bool = False
) -> dict[str, Any]:
    """RMSNorm, RoPE, a SiLU-gated MLP, untied by default: widths, heads, positions,
    norm epsilon and dropout; ``rope_theta`` and ``eps`` are transformers' defaults
    for the family (used when the key is absent), ``yarn`` whether the family's
    RoPE scaling may be YaRN."""
    hidden = r.integer("hidden_size")
    heads = r.integer("num_attention_heads")
    kv = r.integer("num_key_value_heads", heads)
    check_heads(r, hidden, heads, kv, ("hidden_size", "num_attention_heads", "num_key_value_heads"))
    head_dim = r.integer("head_dim", None)
    if head_dim is not None and not hidden % heads and head_dim == hidden // heads:
        head_dim = None
    if r.model_type in QWEN_TYPES:
        r.refuse("use_sliding_window", "Qwen's sliding-window layers are not modelled")
    return {
        "num_layers": r.integer("num_hidden_layers"),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": kv,
        "head_dim": head_dim,
        "vocab_size": r.integer("vocab_size"),
        "activation": silu_gated(r),
        "norm": "rmsnorm",
        "position_embedding": "rope",
        "tied_embeddings": r.flag("tie_word_embeddings", False),
        "max_seq_length": r.integer("max_position_embeddings"),
        "rotary_base": r.rotary_base("rope_theta", rope_theta),
        **rope_scaling(r, yarn=yarn),
        "norm_epsilon": r.number("rms_norm_eps", eps),
        # these families have attention dropout only (transformers' default 0)
        "attention_dropout_fraction": r.dropout("attention_dropout", default=0.0),
        "hidden_dropout_fraction": 0.0,
    }


def qwen_attention(r: Reader) -> dict[str, bool]:
    """Qwen2 (and Qwen2-MoE) always has q/k/v biases and nothing else (transformers'
    Qwen2Attention): qkv_bias, Megatron's --add-qkv-bias.  Qwen3 has none but a q/k
    RMSNorm of head_dim each (Qwen3Attention's q_norm, k_norm; attention_bias, which
    would put biases on q/k/v/o alone, is refused)."""
    if r.model_type in ("qwen2", "qwen2_moe"):
        return {"linear_bias": False, "qkv_bias": True}
    return {"linear_bias": llama_biases(r), "qk_norm": True}


def llama_like(r: Reader) -> dict[str, Any]:
    """Llama, Mistral, Qwen2 and Qwen3 (dense)."""
    if r.model_type.startswith("qwen"):
        biases = qwen_attention(r)
    else:
        biases = {"linear_bias": llama_biases(r), "qkv_bias": False}
    return {**llama_core(r), "ffn_hidden_size": r.integer("intermediate_size"), **biases}


def _gelu_activation(r: Reader, key: str, default: str) -> str:
    """GPT-2 / GPT-NeoX MLPs are ungated; any GeLU variant costs the same."""
    act = r.text(key, default)
    if not act.startswith("gelu"):
        raise UnsupportedError(r.field(key), act, "only GeLU (ungated) MLPs are modelled here")
    return "gelu"


def gpt2(r: Reader) -> dict[str, Any]:
    """GPT-2: LayerNorm, learned positions, biases, tied LM head, n_inner null = 4h."""
    hidden = r.integer("n_embd")
    heads = r.integer("n_head")
    check_heads(r, hidden, heads, heads, ("n_embd", "n_head", "n_head"))
    return {
        "num_layers": r.integer("n_layer"),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "ffn_hidden_size": r.integer("n_inner", 4 * hidden),
        "vocab_size": r.integer("vocab_size"),
        "activation": _gelu_activation(r, "activation_function", "gelu_new"),
        "norm": "layernorm",
        "position_embedding": "learned",
        "linear_bias": True,
        "tied_embeddings": r.flag("tie_word_embeddings", True),
        "max_seq_length": r.integer("n_positions"),
        # Megatron's --hidden-dropout also drops the embedding (GPT-2's embd_pdrop).
        "norm_epsilon": r.number("layer_norm_epsilon", 1e-5),
        "attention_dropout_fraction": r.dropout("attn_pdrop", default=0.1),
        "hidden_dropout_fraction": r.dropout("resid_pdrop", default=0.1),
    }


def gpt_neox(r: Reader) -> dict[str, Any]:
    """GPT-NeoX: LayerNorm, rotary (rotary_pct adds no parameters), biases, untied.

    ``use_parallel_residual`` changes the dataflow, not the parameter count.
    """
    hidden = r.integer("hidden_size")
    heads = r.integer("num_attention_heads")
    check_heads(
        r, hidden, heads, heads, ("hidden_size", "num_attention_heads", "num_attention_heads")
    )
    return {
        "num_layers": r.integer("num_hidden_layers"),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "ffn_hidden_size": r.integer("intermediate_size"),
        "vocab_size": r.integer("vocab_size"),
        "activation": _gelu_activation(r, "hidden_act", "gelu"),
        "norm": "layernorm",
        "position_embedding": "rope",
        "linear_bias": r.flag("attention_bias", True),
        "tied_embeddings": r.flag("tie_word_embeddings", False),
        "max_seq_length": r.integer("max_position_embeddings"),
        "rotary_base": r.rotary_base("rotary_emb_base", 10_000),
        "rotary_fraction": r.number("rotary_pct", 0.25),  # ModelSpec checks <= 1
        "norm_epsilon": r.number("layer_norm_eps", 1e-5),
        # current transformers names, then the names of older GPT-NeoX configs
        "attention_dropout_fraction": r.dropout(
            "attention_dropout", "attention_probs_dropout_prob", default=0.0
        ),
        "hidden_dropout_fraction": r.dropout("hidden_dropout", "hidden_dropout_prob", default=0.0),
    }
