"""The bundled model library (``models/*.yaml``) and model files given by path.

A model is named three ways: a bundled name (``llama-2-7b``), a path to a YAML
or JSON file holding :class:`~pipette_cp.specs.ModelSpec` fields, or a path to a
Hugging Face ``config.json`` (or the directory holding one), which goes to
:mod:`pipette_cp.io.huggingface.config`.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipette_cp.errors import InputFileError, SpecError
from pipette_cp.io import paths
from pipette_cp.io.files import read_mapping
from pipette_cp.io.huggingface.config import default_model_name, is_hf_config, model_from_hf_config
from pipette_cp.specs import ModelSpec, validate_spec

_FILE_SUFFIXES = (".yaml", ".yml", ".json")


def list_models() -> list[str]:
    """Names of the bundled models (the stems of ``models/*.yaml``), sorted.

    Examples
    --------
    >>> "llama-2-7b" in list_models()
    True
    """
    if not paths.MODELS_DIR.is_dir():
        return []
    return sorted(p.stem for p in paths.MODELS_DIR.glob("*.yaml"))


def model_from_mapping(data: Mapping[str, Any], where: str = "model") -> ModelSpec:
    """Validate a mapping of :class:`ModelSpec` fields.

    Parameters
    ----------
    data
        The fields, as read from a model file or an instance's ``model`` section.
    where
        Prefix of the field path in error messages (``model.hidden_size=...``).

    Raises
    ------
    SpecError
        A field is missing, unknown or invalid (one line, naming the field).

    Examples
    --------
    >>> m = model_from_mapping({"name": "toy", "num_layers": 2, "hidden_size": 64,
    ...     "num_attention_heads": 4, "ffn_hidden_size": 256, "vocab_size": 1000,
    ...     "max_seq_length": 128})
    >>> m.kv_heads
    4
    """
    return validate_spec(ModelSpec, dict(data) if isinstance(data, Mapping) else data, where)


def _looks_like_path(text: str) -> bool:
    return "/" in text or "\\" in text or text.lower().endswith(_FILE_SUFFIXES)


def _load_path(path: Path) -> ModelSpec:
    """A model file: HF config.json (or a directory with one), else ModelSpec fields."""
    if path.is_dir():
        config = path / "config.json"
        if not config.is_file():
            raise InputFileError(path, "is a directory without a config.json")
        path = config
    data = read_mapping(path)
    if path.suffix.lower() == ".json" and is_hf_config(data):
        return model_from_hf_config(data, default_model_name(path), path)
    return model_from_mapping(data, where=f"{path}: model")


def _unknown_name(name: str, known: list[str]) -> SpecError:
    close = difflib.get_close_matches(name.lower(), known, n=5, cutoff=0.5)
    if close:
        hint = "did you mean " + ", ".join(repr(c) for c in close) + "?"
    else:
        hint = f"none of the {len(known)} bundled models is close (see {paths.MODELS_DIR})"
    return SpecError("model", name, f"no bundled model of that name and not a file path; {hint}")


def _load_bundled(name: str) -> ModelSpec:
    known = list_models()
    matches = [k for k in known if k == name] or [k for k in known if k.lower() == name.lower()]
    if not matches and Path(name).exists():  # a file or folder here, named without a slash
        return _load_path(Path(name))
    if not matches:
        raise _unknown_name(name, known)
    stem = matches[0]
    path = paths.MODELS_DIR / f"{stem}.yaml"
    spec = model_from_mapping(read_mapping(path), where=f"{path}: model")
    if spec.name != stem:
        raise SpecError(f"{path}: model.name", spec.name, f"must equal the file name {stem!r}")
    return spec


def load_model(name_or_path: str | Path) -> ModelSpec:
    """Load a model by bundled name or from a file.

    Parameters
    ----------
    name_or_path
        A bundled name (see :func:`list_models`; matched case-insensitively), a
        path to a ``.yaml``/``.json`` file of ModelSpec fields, or a path to a
        Hugging Face ``config.json`` or to the directory holding one.  A string
        is a path when it contains a slash or ends in ``.yaml``, ``.yml`` or
        ``.json``, or when it names no bundled model but a file or folder that exists;
        a :class:`~pathlib.Path` always is.

    Raises
    ------
    SpecError
        Unknown bundled name (the message lists close matches), or invalid
        fields in the file.
    UnsupportedError
        A Hugging Face config of an architecture pipette_cp does not model.
    InputFileError
        The file is missing, unreadable or malformed.

    Examples
    --------
    >>> round(load_model("llama-2-7b").total_params / 1e9, 2)
    6.74
    """
    if isinstance(name_or_path, Path):
        return _load_path(name_or_path)
    text = str(name_or_path).strip()
    if not text:
        raise SpecError("model", name_or_path, "expected a bundled model name or a file path")
    if _looks_like_path(text):
        return _load_path(Path(text))
    return _load_bundled(text)


def resolve_model(
    value: str | Path | Mapping[str, Any] | ModelSpec, where: str = "model"
) -> ModelSpec:
    """A model given in any form an instance file or a caller may use.

    A :class:`ModelSpec` is returned as is, a mapping is validated with
    :func:`model_from_mapping`, a string or path goes to :func:`load_model`.

    Examples
    --------
    >>> resolve_model("tiny-gpt").num_layers
    4
    """
    if isinstance(value, ModelSpec):
        return value
    if isinstance(value, Mapping):
        return model_from_mapping(value, where)
    if isinstance(value, str | Path):
        return load_model(value)
    raise SpecError(where, value, "expected a model name, a file path or a mapping of model fields")
