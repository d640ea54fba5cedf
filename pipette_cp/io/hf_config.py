"""Hugging Face ``config.json`` files -> :class:`~pipette_cp.specs.ModelSpec`.

Only the architecture fields are read (widths, norm and its epsilon, RoPE base,
scaling and fraction, biases, tying, dropout), and only for the decoder-only
families whose parameter counts ModelSpec reproduces: Llama, Mistral, Mixtral (accepted,
then refused as mixture-of-experts by ``ModelSpec.require_dense``), Qwen2,
GPT-2 and GPT-NeoX.  Anything else is refused with :class:`UnsupportedError`
rather than guessed.  Every error names the file and the config.json key, e.g.
``config.json: hidden_size=None: missing; required in a 'llama' config``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pipette_cp.errors import SpecError, UnsupportedError
from pipette_cp.io.files import read_mapping
from pipette_cp.specs import ModelSpec, validate_spec

#: ``architectures[0]`` -> ``model_type``, used when ``model_type`` is absent.
ARCHITECTURE_TYPES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2",
    "GPT2LMHeadModel": "gpt2",
    "GPTNeoXForCausalLM": "gpt_neox",
}

#: Keys that give a config experts (transformers' Mixtral, Qwen2-MoE, DeepSeek, ...).
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok", "moe_num_experts")  # fmt: skip
#: Model types whose configs may carry :data:`MOE_KEYS`.
MOE_MODEL_TYPES: frozenset[str] = frozenset({"mixtral"})
#: The ``rope_scaling`` constants Megatron-Core's Llama 3.1 scaling fixes.
_LLAMA3_SCALING = {"low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 8192}  # fmt: skip

_SNAPSHOT_HASH = re.compile(r"[0-9a-f]{40}")
_REQUIRED = object()


class _Reader:
    """Typed access to one config.json; errors name the file and the key."""

    def __init__(self, data: Mapping[str, Any], where: str, model_type: str) -> None:
        self.data = data
        self.where = where
        self.model_type = model_type

    def field(self, key: str) -> str:
        return f"{self.where}: {key}"

    def get(self, key: str, default: Any = _REQUIRED) -> Any:
        """The raw value; ``default`` when absent or null, an error if required."""
        value = self.data.get(key)
        if value is not None:
            return value
        if default is _REQUIRED:
            raise SpecError(
                self.field(key), None, f"missing; required in a {self.model_type!r} config"
            )
        return default

    def integer(self, key: str, default: Any = _REQUIRED) -> Any:
        """A positive integer (booleans and floats are refused)."""
        if self.data.get(key) is None:
            return self.get(key, default)
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise SpecError(self.field(key), value, "expected a positive integer")
        return value

    def flag(self, key: str, default: bool) -> bool:
        """A JSON boolean."""
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise SpecError(self.field(key), value, "expected true or false")
        return value

    def text(self, key: str, default: str) -> str:
        """A JSON string."""
        value = self.get(key, default)
        if not isinstance(value, str):
            raise SpecError(self.field(key), value, "expected a string")
        return value

    def number(self, key: str, default: float, *, probability: bool = False) -> float:
        """A positive JSON number, or with ``probability`` one in [0, 1)."""
        value = self.get(key, default)
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        if not numeric or not (0 <= value < 1 if probability else value > 0):
            expected = "a number in [0, 1)" if probability else "a positive number"
            raise SpecError(self.field(key), value, f"expected {expected}")
        return float(value)

    def dropout(self, *keys: str, default: float) -> float:
        """The first of ``keys`` present (a probability), else ``default``."""
        key = next((k for k in keys if self.data.get(k) is not None), keys[0])
        return self.number(key, default, probability=True)

    def rotary_base(self, key: str, default: int) -> int:
        """``rope_theta``: a whole number, as Megatron's ``--rotary-base`` takes."""
        value = self.number(key, default)
        if value != int(value):
            raise SpecError(self.field(key), value, "expected a whole number (--rotary-base)")
        return int(value)

    def dense_only(self) -> None:
        """Refuse mixture-of-experts keys (:data:`MOE_KEYS`) in a dense config."""
        for key in MOE_KEYS:
            value = self.data.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
                raise SpecError(
                    self.field(key), value, f"a mixture-of-experts key in a dense "
                    f"{self.model_type!r} config (MoE is not modelled); remove it or fix model_type",
                )  # fmt: skip


def _rope_scaling_factor(r: _Reader) -> int | None:
    """``rope_scaling``: None, or the factor of Llama 3.1's ``llama3`` scaling with the
    constants Megatron-Core fixes (``RotaryEmbedding._apply_scaling`` in
    ``megatron/core/models/common/embeddings/rotary_pos_embedding.py``: frequency factors
    1 and 4, 8192 original positions); any other scaling is refused."""
    scaling, key = r.data.get("rope_scaling"), "rope_scaling"
    if scaling is not None and not isinstance(scaling, Mapping):
        raise SpecError(r.field(key), scaling, "expected an object or null")
    kind = None if scaling is None else scaling.get("rope_type", scaling.get("type"))
    if scaling is None or kind in (None, "default"):
        return None
    if kind != "llama3":
        raise UnsupportedError(
            r.field(f"{key}.rope_type"), kind, "only Llama 3.1's 'llama3' RoPE scaling is modelled"
        )
    for name, fixed in _LLAMA3_SCALING.items():
        if scaling.get(name, fixed) != fixed:
            raise UnsupportedError(
                r.field(f"{key}.{name}"), scaling[name], f"Megatron-LM fixes it to {fixed}"
            )
    factor = scaling.get("factor")
    if (
        isinstance(factor, bool)
        or not isinstance(factor, int | float)
        or factor <= 0
        or (
            factor != int(factor)  # Llama 3.1 and 3.2 scale by 8 and 32
        )
    ):
        raise SpecError(r.field(f"{key}.factor"), factor, "expected a whole number > 0")
    return int(factor)


def model_type_of(data: Mapping[str, Any], where: str = "config.json") -> str:
    """The config's ``model_type``, else the one implied by ``architectures[0]``.

    Raises :class:`SpecError` when neither is present.

    Examples
    --------
    >>> model_type_of({"architectures": ["GPT2LMHeadModel"]})
    'gpt2'
    """
    model_type = data.get("model_type")
    if isinstance(model_type, str) and model_type:
        return model_type
    architectures = data.get("architectures")
    if isinstance(architectures, list) and architectures:
        first = str(architectures[0])
        return ARCHITECTURE_TYPES.get(first, first)
    raise SpecError(
        f"{where}: model_type", None, "missing, and no 'architectures' to infer it from"
    )


def is_hf_config(data: Mapping[str, Any]) -> bool:
    """Whether a mapping looks like a Hugging Face config (has ``model_type`` or
    ``architectures``) rather than a pipette_cp model file."""
    return "model_type" in data or "architectures" in data


def _check_heads(r: _Reader, hidden: int, heads: int, kv: int, keys: tuple[str, str, str]) -> None:
    """Head counts must divide as attention needs them; errors use the HF key names."""
    hidden_key, heads_key, kv_key = keys
    if heads % kv:
        raise SpecError(r.field(kv_key), kv, f"{heads_key}={heads} is not divisible by it")
    if hidden % heads and r.data.get("head_dim") is None:
        raise SpecError(
            r.field(heads_key),
            heads,
            f"does not divide {hidden_key}={hidden} and no head_dim is given",
        )


def _llama_like(r: _Reader) -> dict[str, Any]:
    """Llama, Mistral, Mixtral and Qwen2: RMSNorm, RoPE, gated SiLU MLP, untied by default."""
    hidden = r.integer("hidden_size")
    heads = r.integer("num_attention_heads")
    kv = r.integer("num_key_value_heads", heads)
    _check_heads(
        r, hidden, heads, kv, ("hidden_size", "num_attention_heads", "num_key_value_heads")
    )
    head_dim = r.integer("head_dim", None)
    if head_dim is not None and not hidden % heads and head_dim == hidden // heads:
        head_dim = None
    act = r.text("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise UnsupportedError(
            r.field("hidden_act"), act, "only SiLU-gated MLPs (SwiGLU) are modelled for this family"
        )
    # Qwen2 always has q/k/v biases and nothing else (transformers' Qwen2Attention):
    # qkv_bias, Megatron's --add-qkv-bias.  Llama's attention_bias covers q/k/v/o and
    # mlp_bias the MLP: both together are linear_bias; either alone is refused (no
    # ModelSpec field, and no Megatron flag, puts biases on o or the MLP only).
    qkv_bias = r.model_type == "qwen2"
    if qkv_bias:
        linear_bias = False
    else:
        attention_bias, mlp_bias = r.flag("attention_bias", False), r.flag("mlp_bias", False)
        if attention_bias != mlp_bias:
            key = "attention_bias" if attention_bias else "mlp_bias"
            raise UnsupportedError(
                r.field(key), True, "biases on only the attention or only the MLP are not modelled"
            )
        linear_bias = attention_bias
    # Mixtral must say how many experts it has (the other families have none).
    if r.model_type in MOE_MODEL_TYPES:
        experts = r.integer("num_local_experts")
        top_k = r.integer("num_experts_per_tok") if experts > 1 else 1
    else:
        experts = top_k = 1
    return {
        "num_layers": r.integer("num_hidden_layers"),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": kv,
        "head_dim": head_dim,
        "ffn_hidden_size": r.integer("intermediate_size"),
        "vocab_size": r.integer("vocab_size"),
        "activation": "swiglu",
        "norm": "rmsnorm",
        "position_embedding": "rope",
        "linear_bias": linear_bias,
        "qkv_bias": qkv_bias,
        "tied_embeddings": r.flag("tie_word_embeddings", False),
        "max_seq_length": r.integer("max_position_embeddings"),
        "num_experts": experts,
        "moe_top_k": top_k,
        # transformers' defaults: rope_theta 10000 (Mixtral 1e6), rms_norm_eps 1e-6,
        # attention_dropout 0; these families have no hidden dropout.
        "rotary_base": r.rotary_base("rope_theta", 10**6 if r.model_type == "mixtral" else 10**4),
        "rope_scaling_factor": _rope_scaling_factor(r),
        "norm_epsilon": r.number("rms_norm_eps", 1e-6),
        "attention_dropout_fraction": r.dropout("attention_dropout", default=0.0),
        "hidden_dropout_fraction": 0.0,
    }


def _gelu_activation(r: _Reader, key: str, default: str) -> str:
    """GPT-2 / GPT-NeoX MLPs are ungated; any GeLU variant costs the same."""
    act = r.text(key, default)
    if not act.startswith("gelu"):
        raise UnsupportedError(r.field(key), act, "only GeLU (ungated) MLPs are modelled here")
    return "gelu"


def _gpt2(r: _Reader) -> dict[str, Any]:
    """GPT-2: LayerNorm, learned positions, biases, tied LM head, n_inner null = 4h."""
    hidden = r.integer("n_embd")
    heads = r.integer("n_head")
    _check_heads(r, hidden, heads, heads, ("n_embd", "n_head", "n_head"))
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


def _gpt_neox(r: _Reader) -> dict[str, Any]:
    """GPT-NeoX: LayerNorm, rotary (rotary_pct adds no parameters), biases, untied.

    ``use_parallel_residual`` changes the dataflow, not the parameter count.
    """
    hidden = r.integer("hidden_size")
    heads = r.integer("num_attention_heads")
    _check_heads(
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


_PARSERS: dict[str, Callable[[_Reader], dict[str, Any]]] = {
    "llama": _llama_like,
    "mistral": _llama_like,
    "mixtral": _llama_like,
    "qwen2": _llama_like,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
}

#: The ``model_type`` values this loader understands.
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_PARSERS))


def model_from_hf_config(
    data: Mapping[str, Any], name: str, path: str | Path | None = None
) -> ModelSpec:
    """Build a :class:`ModelSpec` from the contents of a Hugging Face config.json.

    Parameters
    ----------
    data
        The parsed config.json.
    name
        The ``ModelSpec.name`` to give the result.
    path
        Where the config came from; used in error messages and ``source``.

    Returns
    -------
    ModelSpec
        Mixtral configs (``num_local_experts`` > 1) are returned with
        ``num_experts`` set; ``ModelSpec.require_dense()`` then refuses them.

    Raises
    ------
    SpecError
        A required key is missing or not a positive integer, the head counts do
        not divide (``num_attention_heads`` by ``num_key_value_heads``), or a dense
        ``model_type`` carries a mixture-of-experts key (:data:`MOE_KEYS`).
    UnsupportedError
        The ``model_type``, activation, bias pattern or RoPE scaling is not one
        pipette_cp models.

    Examples
    --------
    >>> cfg = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
    ...        "num_attention_heads": 32, "intermediate_size": 11008, "vocab_size": 32000,
    ...        "max_position_embeddings": 4096, "hidden_act": "silu"}
    >>> model_from_hf_config(cfg, name="llama-2-7b").total_params
    6738415616
    """
    where = str(path) if path is not None else "config.json"
    if not isinstance(data, Mapping):
        raise SpecError(where, data, "expected a JSON object (a Hugging Face config.json)")
    model_type = model_type_of(data, where)
    parser = _PARSERS.get(model_type)
    if parser is None:
        raise UnsupportedError(
            f"{where}: model_type",
            model_type,
            f"not a supported architecture (supported: {', '.join(SUPPORTED_MODEL_TYPES)})",
        )
    reader = _Reader(data, where, model_type)
    if model_type not in MOE_MODEL_TYPES:
        reader.dense_only()
    fields = parser(reader)
    repo = data.get("_name_or_path")
    origin = f" ({repo})" if isinstance(repo, str) and repo else ""
    fields["name"] = name
    fields["source"] = f"Hugging Face config.json{origin}, model_type {model_type!r}: {where}"
    return validate_spec(ModelSpec, fields, where)


def default_model_name(path: str | Path) -> str:
    """A model name for a config file: its stem, or for ``.../<dir>/config.json``
    the directory's name (the repository name inside a Hugging Face cache snapshot).

    Examples
    --------
    >>> default_model_name("hf/models--meta-llama--Llama-2-7b-hf/snapshots/"
    ...                    + "0" * 40 + "/config.json")
    'Llama-2-7b-hf'
    >>> default_model_name("fixtures/mistralai--Mistral-7B-v0.1.json")
    'mistralai--Mistral-7B-v0.1'
    """
    p = Path(path)
    if p.name != "config.json":
        return p.stem
    parent = p.parent if p.parent.name else p.resolve().parent
    if _SNAPSHOT_HASH.fullmatch(parent.name) and parent.parent.name == "snapshots":
        return parent.parent.parent.name.split("--")[-1]
    return parent.name or p.stem


def load_hf_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """Read a Hugging Face config.json (or a directory holding one) into a ModelSpec.

    Parameters
    ----------
    path
        The config.json, or the model directory that contains it.
    name
        The model name; by default :func:`default_model_name` of the file.

    Raises
    ------
    InputFileError
        The file is missing, unreadable or not valid JSON.
    SpecError, UnsupportedError
        As :func:`model_from_hf_config`.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    data = read_mapping(p)
    return model_from_hf_config(data, name or default_model_name(p), p)
