"""Model specs shared by the tests, each built in one call from its widths."""

from __future__ import annotations

from typing import Any

from pipette_cp.specs.model import ModelSpec

#: What a Llama-style model changes from GPT's defaults: SwiGLU, RMSNorm, RoPE, no biases.
LLAMA_STYLE: dict[str, Any] = {
    "activation": "swiglu",
    "norm": "rmsnorm",
    "position_embedding": "rope",
    "linear_bias": False,
}


def gpt_model(
    name: str,
    layers: int,
    hidden: int,
    heads: int,
    *,
    ffn: int | None = None,
    vocab: int = 51200,
    seq: int = 2048,
    **fields: Any,
) -> ModelSpec:
    """A GPT-style model: ``layers`` layers of width ``hidden`` with ``heads`` attention
    heads, an MLP of width ``ffn`` (4 x ``hidden`` unless given), ``vocab`` tokens and
    ``seq`` positions; ``fields`` set (or override) any other :class:`ModelSpec` field."""
    widths = {
        "name": name,
        "num_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "ffn_hidden_size": 4 * hidden if ffn is None else ffn,
        "vocab_size": vocab,
        "max_seq_length": seq,
    }
    return ModelSpec(**(widths | fields))


def llama3_8b(name: str = "llama", **fields: Any) -> ModelSpec:
    """Llama-3-8B-like: 32 layers, h 4096, 32 heads of which 8 for keys and values (GQA),
    SwiGLU of width 14336, V 128256, 8192 positions, RMSNorm, RoPE, no biases, untied
    embeddings; ``fields`` as :func:`gpt_model`'s."""
    llama = {"num_kv_heads": 8, "tied_embeddings": False, **LLAMA_STYLE}
    return gpt_model(name, 32, 4096, 32, ffn=14336, vocab=128256, seq=8192, **(llama | fields))
