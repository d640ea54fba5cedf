"""Reading mpiGraph output (LLNL, sourceforge.net/projects/mpigraph) into bandwidth matrices.

mpiGraph runs one or more MPI ranks per node; in N-1 steps every rank sends to
the rank D to its right and receives from the rank D to its left, and rank 0
prints two N x N tables (mpiGraph.c v1.5, ``code()``)::

    START mpiGraph v1.5
    MsgSize	4194304
    ...
    Send max	23015.228
    Send avg	22631.870

    Send	node01:0	node02:1	...
    node01:0 to	0.000	22856.471	...
    node02:1 to	22912.032	0.000	...

    Recv max	...
    Recv	node01:0	node02:1	...
    node01:0 from	0.000	22896.114	...
    END mpiGraph

Units: mpiGraph's "MB/sec" is ``size * 1e6 / (1024 * 1024) / time_us``, i.e.
MiB/s (2**20 bytes); values are converted to bytes/s here.

Orientation: row ``i to`` of the Send table, column j, is i -> j timed at the
sender; row ``i from`` of the Recv table, column j, is j -> i timed at the
receiver.  Both are stored here as ``[sender, receiver]``.  The default
``direction="recv"`` uses the receiver's timing: a send completes once its
buffer may be reused, a receive only once the data has arrived, so the receive
side is the conservative one (Pipette's ``vivaldi-master/read_mpigraph.py``
also reads the receive matrix).  An off-diagonal 0.000 is a pair that did not
deliver: it stays 0 (failed).

Several ranks per host (e.g. one per NIC) are folded into a node matrix by the
mean over the rank pairs of two hosts, as Pipette does for its 4 x 4 NIC pairs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from pipette_cp.errors import InputFileError
from pipette_cp.io.files import read_text
from pipette_cp.units import MiB

_PARAM = re.compile(r"^(MsgSize|Times|Window|Procs)\s+(\d+)\s*$")
_HEADER = re.compile(r"^(Send|Recv)\s+(\S+:\d+(\s+\S+:\d+)*)\s*$")
_LABEL = re.compile(r"^(?P<host>.+):(?P<rank>\d+)$")

Direction = Literal["recv", "send"]


@dataclass(frozen=True)
class MpiGraphResult:
    """Both bandwidth tables of one mpiGraph run, rank x rank, ``[sender, receiver]``."""

    labels: tuple[str, ...]
    hosts: tuple[str, ...]
    send_bytes_per_s: np.ndarray
    recv_bytes_per_s: np.ndarray
    message_size_bytes: int | None = None
    times: int | None = None
    window: int | None = None

    def rank_matrix(self, direction: Direction = "recv") -> np.ndarray:
        """Rank x rank bytes/s, ``[sender, receiver]``, diagonal 0."""
        if direction not in ("recv", "send"):
            raise ValueError(f"direction={direction!r}: expected 'recv' or 'send'")
        return self.recv_bytes_per_s if direction == "recv" else self.send_bytes_per_s

    @property
    def node_names(self) -> tuple[str, ...]:
        """Distinct hosts in rank order."""
        return tuple(dict.fromkeys(self.hosts))

    def node_matrix(self, direction: Direction = "recv") -> np.ndarray:
        """Node x node bytes/s: mean over the non-zero rank pairs of each host pair
        (0 when all of them are 0); diagonal 0 (same-host pairs are not inter-node)."""
        ranks = self.rank_matrix(direction)
        names = self.node_names
        of = np.array([names.index(h) for h in self.hosts])
        n = len(names)
        sums, counts = np.zeros((n, n)), np.zeros((n, n))
        alive = ranks > 0
        np.add.at(sums, (of[:, None], of[None, :]), np.where(alive, ranks, 0.0))
        np.add.at(counts, (of[:, None], of[None, :]), alive)
        out = np.divide(sums, counts, out=np.zeros((n, n)), where=counts > 0)
        np.fill_diagonal(out, 0.0)
        return out


def parse_mpigraph(text: str, where: str = "mpiGraph output") -> MpiGraphResult:
    r"""Parse mpiGraph's stdout.

    Parameters
    ----------
    text : str
        Anything before the tables (MPI binding lines, banners) is ignored.
    where : str
        Names the input in error messages.

    Returns
    -------
    MpiGraphResult
        Both tables in bytes/s, ``[sender, receiver]``.

    Raises
    ------
    InputFileError
        A table is missing, not square, out of order or not numeric, or the text
        ends inside a table row (a log cut off).

    Examples
    --------
    >>> out = "Send\ta:0\tb:1\na:0 to\t0.000\t1.000\nb:1 to\t2.000\t0.000\n\n"
    >>> out += "Recv\ta:0\tb:1\na:0 from\t0.000\t3.000\nb:1 from\t4.000\t0.000\n"
    >>> r = parse_mpigraph(out)
    >>> r.node_names, float(r.recv_bytes_per_s[1, 0] / 2**20)  # b -> a, timed at a
    (('a', 'b'), 3.0)
    """
    params: dict[str, int] = {}
    tables: dict[str, tuple[list[str], list[list[float]]]] = {}
    current: str | None = None
    lines = text.splitlines()
    if lines and not text.endswith(("\n", "\r")) and lines[-1].split()[1:2] in (["to"], ["from"]):
        # its last number may be cut short (22856.471 read as 22.8): never guess
        raise InputFileError(
            where, f"line {len(lines)}: the file ends inside a table row (cut off?)"
        )
    for number, line in enumerate(lines, start=1):
        if m := _PARAM.match(line):
            params[m.group(1)] = int(m.group(2))
        elif m := _HEADER.match(line):
            current = m.group(1)
            tables[current] = (m.group(2).split(), [])
        elif current and line.split()[1:2] in (["to"], ["from"]):
            label, _, *values = line.split()
            labels, rows = tables[current]
            if len(rows) >= len(labels) or label != labels[len(rows)]:
                raise InputFileError(where, f"line {number}: row {label!r} out of order")
            try:
                rows.append([float(v) * MiB for v in values])
            except ValueError:
                raise InputFileError(
                    where, f"line {number}: non-numeric value in {line!r}"
                ) from None
        elif not line.strip():
            current = None
    missing = [t for t in ("Send", "Recv") if t not in tables]
    if missing:
        raise InputFileError(where, f"no {' or '.join(missing)} table (is this mpiGraph output?)")
    labels = tables["Send"][0]
    if tables["Recv"][0] != labels:
        raise InputFileError(where, "the Send and Recv tables name different ranks")
    send = _square(tables["Send"][1], len(labels), "Send", where)
    # row "i from", column j is j -> i: transpose to [sender, receiver]
    recv = np.ascontiguousarray(_square(tables["Recv"][1], len(labels), "Recv", where).T)
    hosts = tuple(_host(label, where) for label in labels)
    return MpiGraphResult(
        labels=tuple(labels),
        hosts=hosts,
        send_bytes_per_s=_frozen(send),
        recv_bytes_per_s=_frozen(recv),
        message_size_bytes=params.get("MsgSize"),
        times=params.get("Times"),
        window=params.get("Window"),
    )


def read_mpigraph(path: str | Path) -> MpiGraphResult:
    """:func:`parse_mpigraph` of a file, errors naming the file."""
    return parse_mpigraph(read_text(path), where=str(path))


def _square(rows: list[list[float]], n: int, table: str, where: str) -> np.ndarray:
    if len(rows) != n or any(len(r) != n for r in rows):
        sizes = sorted({len(r) for r in rows})
        raise InputFileError(
            where, f"{table} table has {len(rows)} rows of {sizes} values for {n} ranks"
        )
    matrix = np.array(rows, dtype=np.float64)
    if not np.isfinite(matrix).all() or (matrix < 0).any():
        raise InputFileError(where, f"{table} table holds a negative or non-finite value")
    np.fill_diagonal(matrix, 0.0)
    return matrix


def _host(label: str, where: str) -> str:
    m = _LABEL.match(label)
    if m is None:
        raise InputFileError(where, f"rank label {label!r} is not host:rank")
    return m.group("host")


def _frozen(matrix: np.ndarray) -> np.ndarray:
    matrix.flags.writeable = False
    return matrix
