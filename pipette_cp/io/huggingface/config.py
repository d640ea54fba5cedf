"""Hugging Face ``config.json`` files -> :class:`~pipette_cp.specs.ModelSpec`.

Only the architecture fields are read (widths, experts, latent attention, norm and its
epsilon, RoPE base and scaling, biases, tying, dropout), and only for the decoder-only
families whose parameter counts ModelSpec reproduces: the dense Llama, Mistral, Qwen2,
Qwen3, GPT-2 and GPT-NeoX (:mod:`pipette_cp.io.huggingface.dense`) and the mixture-of-experts
Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3, Llama 4 and gpt-oss
(:mod:`pipette_cp.io.huggingface.moe`), and the hybrid Mamba-Transformer Nemotron-H and
Nemotron 3 (:mod:`pipette_cp.io.huggingface.hybrid`).  Anything else, Gemma, Jamba and
the pure Mamba families included, is refused with
:class:`UnsupportedError` rather than guessed.  Every error names the file and the
config.json key, e.g. ``config.json: hidden_size=None: missing; required in a 'llama'
config``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pipette_cp.errors import SpecError, UnsupportedError
from pipette_cp.io.files import read_mapping
from pipette_cp.io.huggingface import dense as hf_dense
from pipette_cp.io.huggingface import hybrid as hf_hybrid
from pipette_cp.io.huggingface import moe as hf_moe
from pipette_cp.io.huggingface.reader import MOE_KEYS, Reader
from pipette_cp.specs import ModelSpec, validate_spec

__all__ = ["MOE_KEYS", "SUPPORTED_MODEL_TYPES", "default_model_name", "is_hf_config",
           "load_hf_config", "model_from_hf_config", "model_type_of"]  # fmt: skip

#: ``architectures[0]`` -> ``model_type``, used when ``model_type`` is absent.
ARCHITECTURE_TYPES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "Llama4ForConditionalGeneration": "llama4",
    "Llama4ForCausalLM": "llama4_text",
    "GptOssForCausalLM": "gpt_oss",
    "NemotronHForCausalLM": "nemotron_h",
    "GPT2LMHeadModel": "gpt2",
    "GPTNeoXForCausalLM": "gpt_neox",
    "GemmaForCausalLM": "gemma",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
    "Gemma3ForConditionalGeneration": "gemma3",
}

_SNAPSHOT_HASH = re.compile(r"[0-9a-f]{40}")


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


_PARSERS: dict[str, Callable[[Reader], dict[str, Any]]] = {
    "llama": hf_dense.llama_like,
    "mistral": hf_dense.llama_like,
    "qwen2": hf_dense.llama_like,
    "qwen3": hf_dense.llama_like,
    "gpt2": hf_dense.gpt2,
    "gpt_neox": hf_dense.gpt_neox,
    "mixtral": hf_moe.mixtral,
    "qwen2_moe": hf_moe.qwen_moe,
    "qwen3_moe": hf_moe.qwen_moe,
    "deepseek_v2": hf_moe.deepseek,
    "deepseek_v3": hf_moe.deepseek,
    "llama4": hf_moe.llama4,
    "llama4_text": hf_moe.llama4,
    "gpt_oss": hf_moe.gpt_oss,
    "nemotron_h": hf_hybrid.nemotron_h,
}
#: The families that are not mixture-of-experts: a MoE key in them is refused.
_DENSE_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "gpt2", "gpt_neox"})

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
        Its ``source`` names the file and lists what the config holds that ModelSpec
        does not record (parameter-free details such as Llama 4's chunked attention).

    Raises
    ------
    SpecError
        A required key is missing or not a positive integer, the head counts do
        not divide (``num_attention_heads`` by ``num_key_value_heads``), or a dense
        ``model_type`` carries a mixture-of-experts key (:data:`MOE_KEYS`).
    UnsupportedError
        The ``model_type`` (Gemma: :data:`~pipette_cp.io.huggingface.moe.REFUSED` says why),
        activation, bias pattern, layer pattern or RoPE scaling is not one pipette_cp
        models.

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
    if model_type in hf_moe.REFUSED:
        raise UnsupportedError(f"{where}: model_type", model_type, hf_moe.REFUSED[model_type])
    parser = _PARSERS.get(model_type)
    if parser is None:
        raise UnsupportedError(
            f"{where}: model_type",
            model_type,
            f"not a supported architecture (supported: {', '.join(SUPPORTED_MODEL_TYPES)})",
        )
    reader = Reader(data, where, model_type)
    if model_type in _DENSE_TYPES:
        reader.dense_only()
    fields = parser(reader)
    notes = fields.pop("_notes", [])
    repo = data.get("_name_or_path")
    origin = f" ({repo})" if isinstance(repo, str) and repo else ""
    fields["name"] = name
    fields["source"] = f"Hugging Face config.json{origin}, model_type {model_type!r}: {where}"
    if notes:
        fields["source"] += "; not recorded (no parameters): " + ", ".join(notes)
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
