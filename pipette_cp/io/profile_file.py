"""Read a measured per-layer profile (:class:`~pipette_cp.specs.profile.LayerProfile`)."""

from __future__ import annotations

import json
from pathlib import Path

from pipette_cp.errors import InputFileError
from pipette_cp.specs import validate_spec
from pipette_cp.specs.profile import LayerProfile


def load_layer_profile(path: str | Path) -> LayerProfile:
    """Read a :class:`LayerProfile` from a JSON file.

    Raises
    ------
    InputFileError
        The file is missing, unreadable or not JSON.
    SpecError
        A field is missing or invalid (the message names it).
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputFileError(path, "no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFileError(path, f"cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise InputFileError(path, f"not JSON: {exc.msg} at line {exc.lineno}") from None
    return validate_spec(LayerProfile, data, "profile")
