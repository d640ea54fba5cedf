"""Checks shared by the tests of the file readers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipette_cp.errors import InputFileError


def refuses_missing_and_malformed(
    read: Callable[[Path], Any], path: Path, text: str, match: str
) -> Path:
    """Check that ``read`` refuses ``path`` while it does not exist ("no such file") and
    once it holds ``text`` (an :class:`InputFileError` matching ``match``); ``path``,
    for the caller's further cases."""
    with pytest.raises(InputFileError, match="no such file"):
        read(path)
    path.write_text(text)
    with pytest.raises(InputFileError, match=match):
        read(path)
    return path
