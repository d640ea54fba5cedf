"""Hostfiles: one host per line, as Open MPI and Slurm tools write them.

``host``, ``host slots=8`` (Open MPI hostfile) or ``host:8`` (``mpirun -H``
syntax); ``#`` starts a comment, blank lines are skipped.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipette_cp.errors import InputFileError, SpecError
from pipette_cp.io.files import read_text

#: One RFC 1123 label: letters, digits and '-', 1-63 characters, no '-' at either end.
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
HOST_NAME_RULE = "expected an RFC 1123 host name (letters, digits, '-', dots between labels)"


def is_host_name(name: object) -> bool:
    """Whether ``name`` is an RFC 1123 host name: labels of letters, digits and ``-``
    (1-63 characters, no ``-`` at either end) joined by dots, at most 253 characters.

    Such names are safe in shell scripts, hostfiles and log file names unquoted.

    >>> [is_host_name(n) for n in ("gpu-01", "n1.dc2", "a..b", "-a", "x\\ny", "$(id)")]
    [True, True, False, False, False, False]
    """
    if not isinstance(name, str) or not name or len(name) > 253:
        return False
    return all(_LABEL.fullmatch(label) for label in name.split("."))


def check_host_name(name: object, field: str) -> str:
    """``name`` if :func:`is_host_name`, else :class:`SpecError` naming ``field``."""
    if not is_host_name(name):
        raise SpecError(field, name, HOST_NAME_RULE)
    return str(name)


@dataclass(frozen=True)
class Host:
    """One hostfile line: the host and its slot count (None when not given)."""

    name: str
    slots: int | None
    line: int


def parse_hostfile(text: str, where: str = "hostfile") -> tuple[Host, ...]:
    """Hosts of a hostfile: ``host``, ``host slots=8`` or ``host:8`` per line.

    ``#`` starts a comment; blank lines are skipped.  Host names must be RFC 1123
    names (:func:`is_host_name`; ``_`` separates the host names in log file names).

    Raises
    ------
    InputFileError
        Naming the line: a malformed line, a bad name, a repeated host, no host.

    Examples
    --------
    >>> [(h.name, h.slots) for h in parse_hostfile("a slots=8\\n# x\\n\\nb:4  # y\\nc\\n")]
    [('a', 8), ('b', 4), ('c', None)]
    """
    hosts: list[Host] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, slots = _host_line(line, f"{where}: line {number}")
        if name in seen:
            raise InputFileError(where, f"line {number}: {name!r} already on line {seen[name]}")
        seen[name] = number
        hosts.append(Host(name, slots, number))
    if not hosts:
        raise InputFileError(where, "no host (one host name per line)")
    return tuple(hosts)


def _host_line(line: str, where: str) -> tuple[str, int | None]:
    tokens = line.split()
    name, slots = tokens[0], None
    if ":" in name:
        name, _, count = name.partition(":")
        slots = _slots(count, where, line)
    for extra in tokens[1:]:
        key, sep, value = extra.partition("=")
        if key not in ("slots", "max_slots", "max-slots") or not sep or slots is not None:
            raise InputFileError(where, f"{line!r}: expected 'host', 'host slots=N' or 'host:N'")
        if key == "slots":
            slots = _slots(value, where, line)
    if "_" in name:
        raise InputFileError(where, f"host {name!r}: '_' separates host names in log names")
    if not is_host_name(name):
        raise InputFileError(where, f"host {name!r}: {HOST_NAME_RULE}")
    return name, slots


def _slots(value: str, where: str, line: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise InputFileError(where, f"{line!r}: slots must be a positive integer")
    return int(value)


def common_slots(hosts: Sequence[Host], default: int = 8) -> int:
    """The slot count all hosts give (``default`` when none gives one).

    Raises
    ------
    SpecError
        Two hosts give different counts (naming the first line that differs).
    """
    given = [h for h in hosts if h.slots is not None]
    if not given:
        return default
    odd = next((h for h in given if h.slots != given[0].slots), None)
    if odd is not None:
        raise SpecError(
            f"hostfile line {odd.line}",
            f"{odd.name} slots={odd.slots}",
            f"line {given[0].line} has slots={given[0].slots}; pass --gpus-per-node",
        )
    return int(given[0].slots or default)


def read_hostfile(path: str | Path) -> tuple[Host, ...]:
    """:func:`parse_hostfile` of a file; errors name the file and the line."""
    return parse_hostfile(read_text(path), where=str(path))
