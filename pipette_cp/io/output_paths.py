"""Output paths checked before any work: a file's folder exists and takes files, a
folder is not a file, no name is longer than the file system allows.

Every command that writes (``solve -o``, ``schema -o``, ``export --hostfile``, ``plot``,
``explain --plot``, ``bench report --plots``, ``profile -o``, ``cluster ... -o``) checks
its paths with :func:`check_output_file` or :func:`check_output_dir` first, and a write
that still fails (a disk that fills, permissions that change) is reported by
:func:`output_error` as one line naming the option.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pipette_cp.errors import SpecError

#: Longest file name in bytes where the file system does not say (POSIX NAME_MAX).
DEFAULT_NAME_MAX = 255


def _name_max(folder: Path) -> int:
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):  # no such folder, or not POSIX
        return DEFAULT_NAME_MAX


def _existing_ancestor(path: Path) -> Path:
    """The nearest of ``path`` and its parents that exists (``.`` at worst)."""
    for candidate in (path, *path.parents):
        try:
            if candidate.exists():
                return candidate
        except OSError:  # a name the file system cannot even look up (too long)
            continue
    return Path(".")


def _check_names(path: Path, field: str) -> None:
    base = _existing_ancestor(path)
    folder = base if base.is_dir() else base.parent
    limit = _name_max(folder)
    for part in path.parts:
        if len(part.encode()) > limit:
            raise SpecError(field, str(path), f"a name of {len(part.encode())} bytes; the file "
                            f"system takes at most {limit}")  # fmt: skip


def _check_no_file_above(path: Path, field: str) -> None:
    base = _existing_ancestor(path.parent)
    if not base.is_dir():
        raise SpecError(field, str(path), f"{base} is a file, not a folder")


def check_output_file(path: Path | None, field: str) -> None:
    """Refuse a file ``path`` that cannot be written (None: nothing to check)."""
    if path is None:
        return
    _check_names(path, field)
    if path.is_dir():
        raise SpecError(field, str(path), "is a directory; give a file name")
    _check_no_file_above(path, field)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise SpecError(field, str(path), f"its folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise SpecError(field, str(path), f"its folder {folder} is not writable")


def check_output_dir(path: Path | None, field: str) -> None:
    """Refuse a folder ``path`` that cannot be made or written into (it may not exist
    yet: the command makes it and its missing parents)."""
    if path is None:
        return
    _check_names(path, field)
    if path.exists() and not path.is_dir():
        raise SpecError(field, str(path), "is a file, not a folder")
    _check_no_file_above(path, field)
    base = _existing_ancestor(path)
    if not os.access(base, os.W_OK | os.X_OK):
        raise SpecError(field, str(path), f"{base} is not writable")


def output_error(field: str, path: Path, exc: OSError) -> SpecError:
    """A write to ``path`` that failed, as one line naming ``field``."""
    reason = exc.strerror or type(exc).__name__
    return SpecError(field, str(path), f"cannot be written: {reason}")


def save_figure(figure: Any, path: Path, field: str) -> None:
    """A matplotlib ``figure`` as a PNG at ``path``; a failed write is one line naming
    ``field``."""
    try:
        figure.savefig(path, dpi=130)
    except OSError as exc:
        raise output_error(field, path, exc) from None
