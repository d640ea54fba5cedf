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


def gpt_model(name: str, layers: int, hidden: int, heads: int, **fields: Any) -> ModelSpec:
    """A GPT-style model: ``layers`` layers of width ``hidden`` with ``heads`` attention
    heads; ``fields`` set (or override) any other :class:`ModelSpec` field, else an MLP
    of 4 x ``hidden``, 51,200 tokens and 2,048 positions."""
    widths = {
        "name": name,
        "num_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "ffn_hidden_size": 4 * hidden,
        "vocab_size": 51200,
        "max_seq_length": 2048,
    }
    return ModelSpec(**(widths | fields))


def llama3_8b(name: str = "llama", **fields: Any) -> ModelSpec:
    """Llama-3-8B-like: 32 layers, h 4096, 32 heads of which 8 for keys and values (GQA),
    SwiGLU of width 14336, V 128256, 8192 positions, RMSNorm, RoPE, no biases, untied
    embeddings; ``fields`` as :func:`gpt_model`'s."""
    llama = dict(num_kv_heads=8, ffn_hidden_size=14336, vocab_size=128256, max_seq_length=8192,
                 tied_embeddings=False, **LLAMA_STYLE)  # fmt: skip
    return gpt_model(name, 32, 4096, 32, **(llama | fields))
