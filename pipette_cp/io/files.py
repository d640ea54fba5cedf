"""Reading YAML / JSON / text files with one-line errors instead of tracebacks.

Every input file goes through :func:`read_bytes`: a regular file (a FIFO, a
device such as ``/dev/zero`` or a socket would block or never end) of at most
:data:`MAX_INPUT_BYTES`.  YAML is parsed by :mod:`pipette_cp.io.yaml_safe` (no
alias bombs, no nesting beyond :data:`~pipette_cp.io.yaml_safe.MAX_DEPTH`, no
duplicate keys), JSON by :func:`load_json` with the same two last rules.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import yaml

from pipette_cp.errors import InputFileError
from pipette_cp.io.yaml_safe import MAX_DEPTH, RefusedYamlError, safe_load

#: Largest input file read, bytes (room for a YAML bandwidth matrix of 2048 nodes).
MAX_INPUT_BYTES = 64 * 2**20

_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _not_regular(mode: int) -> str:
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    return f"is {kind}, expected a regular file"


def read_bytes(path: str | Path, max_bytes: int | None = None) -> bytes:
    """The content of a regular file of at most ``max_bytes`` (default
    :data:`MAX_INPUT_BYTES`), or :class:`InputFileError`: missing, a directory, a
    FIFO or device, too large, unreadable.  Never blocks on a FIFO."""
    p = Path(path)
    limit = MAX_INPUT_BYTES if max_bytes is None else max_bytes
    try:
        info = p.stat()
    except FileNotFoundError:
        raise InputFileError(p, "no such file") from None
    except OSError as exc:
        raise InputFileError(p, f"cannot read: {exc}") from None
    if stat.S_ISDIR(info.st_mode):
        raise InputFileError(p, "is a directory, expected a file")
    if not stat.S_ISREG(info.st_mode):
        raise InputFileError(p, _not_regular(info.st_mode))
    if info.st_size > limit:
        raise InputFileError(p, _too_large(info.st_size, limit))
    # O_NONBLOCK: should the path turn into a FIFO after stat(), open() does not wait
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(p, flags)
        with os.fdopen(fd, "rb") as handle:
            mode = os.fstat(handle.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise InputFileError(p, _not_regular(mode))
            data = handle.read(limit + 1)
    except OSError as exc:
        raise InputFileError(p, f"cannot read: {exc}") from None
    if len(data) > limit:  # grew after stat()
        raise InputFileError(p, _too_large(len(data), limit))
    return data


def _too_large(size: int, limit: int) -> str:
    return f"is {size} bytes; input files are limited to {limit} bytes ({limit / 2**20:g} MiB)"


def read_text(path: str | Path, max_bytes: int | None = None) -> str:
    """The file's UTF-8 text (universal newlines), read by :func:`read_bytes`;
    :class:`InputFileError` if it is missing, not a regular file, too large or not
    UTF-8."""
    data = read_bytes(path, max_bytes)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(path, f"cannot read: {exc}") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def load_json(text: str, path: str | Path) -> Any:
    """``json.loads`` refusing a duplicated key and nesting beyond
    :data:`~pipette_cp.io.yaml_safe.MAX_DEPTH` (:class:`InputFileError` naming
    ``path``); malformed JSON raises :class:`json.JSONDecodeError`."""
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as exc:
        raise InputFileError(path, f"duplicate key {exc.args[0]!r} in a JSON object") from None
    except RecursionError:
        raise InputFileError(path, f"JSON nested deeper than {MAX_DEPTH} levels") from None
    if _depth(data) > MAX_DEPTH:
        raise InputFileError(path, f"JSON nested deeper than {MAX_DEPTH} levels")
    return data


def _depth(data: Any) -> int:
    """Levels of lists and dicts in ``data`` (0 for a scalar), without recursion."""
    if not isinstance(data, dict | list):
        return 0
    deepest, stack = 0, [(data, 1)]
    while stack:
        value, level = stack.pop()
        deepest = max(deepest, level)
        children = value.values() if isinstance(value, dict) else value
        stack.extend((c, level + 1) for c in children if isinstance(c, dict | list))
    return deepest


def parse_yaml(text: str, path: str | Path) -> Any:
    """:func:`pipette_cp.io.yaml_safe.safe_load` of ``text``, errors as one-line
    :class:`InputFileError` naming ``path`` and the position."""
    try:
        return safe_load(text)
    except RefusedYamlError as exc:
        raise InputFileError(path, f"{exc.problem}{exc.where()}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputFileError(path, f"malformed YAML{where}: {problem}") from None


def read_mapping(path: str | Path) -> dict[str, Any]:
    """A YAML or JSON file whose top level is a mapping (JSON is valid YAML, but
    ``.json`` files are parsed as JSON for exact error positions)."""
    p = Path(path)
    text = read_text(p)
    if p.suffix.lower() == ".json":
        try:
            data = load_json(text, p)
        except json.JSONDecodeError as exc:
            raise InputFileError(
                p, f"malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
            ) from None
    else:
        data = parse_yaml(text, p)
    if not isinstance(data, dict):
        raise InputFileError(p, f"expected a mapping at the top level, got {type(data).__name__}")
    return data


def write_yaml(path: str | Path, data: dict[str, Any], header: str = "") -> None:
    """Write ``data`` as block-style YAML, optionally preceded by ``# header`` lines."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    p.write_text(comment + yaml.safe_dump(data, sort_keys=False, width=120), encoding="utf-8")
