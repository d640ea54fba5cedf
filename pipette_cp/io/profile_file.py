"""Read a measured per-layer profile (:class:`~pipette_cp.specs.profile.LayerProfile`)."""

from __future__ import annotations

import json
from pathlib import Path

from pipette_cp.errors import InputFileError
from pipette_cp.io.files import load_json, read_text
from pipette_cp.specs import validate_spec
from pipette_cp.specs.profile import LayerProfile


def load_layer_profile(path: str | Path) -> LayerProfile:
    """Read a :class:`LayerProfile` from a JSON file.

    Raises
    ------
    InputFileError
        The file is missing, not a regular file, too large, unreadable or not JSON
        (a duplicated key or too deep a nesting included).
    SpecError
        A field is missing or invalid (the message names it).
    """
    path = Path(path)
    text = read_text(path)  # a regular file of bounded size, or InputFileError
    try:
        data = load_json(text, path)
    except json.JSONDecodeError as exc:
        raise InputFileError(path, f"not JSON: {exc.msg} at line {exc.lineno}") from None
    return validate_spec(LayerProfile, data, "profile")
