"""Reading YAML / JSON / text files with one-line errors instead of tracebacks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from pipette_cp.errors import InputFileError


def read_text(path: str | Path) -> str:
    """The file's text, or :class:`InputFileError` if it is missing or unreadable."""
    p = Path(path)
    if not p.exists():
        raise InputFileError(p, "no such file")
    if p.is_dir():
        raise InputFileError(p, "is a directory, expected a file")
    try:
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFileError(p, f"cannot read: {exc}") from None


def read_mapping(path: str | Path) -> dict[str, Any]:
    """A YAML or JSON file whose top level is a mapping (JSON is valid YAML, but
    ``.json`` files are parsed as JSON for exact error positions)."""
    p = Path(path)
    text = read_text(p)
    try:
        data = json.loads(text) if p.suffix.lower() == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise InputFileError(
            p, f"malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputFileError(p, f"malformed YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise InputFileError(p, f"expected a mapping at the top level, got {type(data).__name__}")
    return data


def write_yaml(path: str | Path, data: dict[str, Any], header: str = "") -> None:
    """Write ``data`` as block-style YAML, optionally preceded by ``# header`` lines."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    p.write_text(comment + yaml.safe_dump(data, sort_keys=False, width=120), encoding="utf-8")
