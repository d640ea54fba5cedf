"""Reading NVIDIA nccl-tests output logs.

A log (``sendrecv_perf``, ``all_reduce_perf``, ``alltoall_perf``, ...) holds one
or more *tests*; each test is a table with one row per message size::

    #       size         count   type   redop  root   time  algbw  busbw #wrong  time algbw busbw #wrong
        33554432       4194304  double    sum    -1  2513.89  13.35 13.35    0  ...

(as nccl-tests 2.17 prints it; older versions without ``root`` are read too).
A test *failed* when its table is missing (the job died before any size
completed), when it prints error lines (``Test NCCL failure ...``), or when a
row reports corrupted results (``#wrong`` > 0).

One number per test: :meth:`NcclTest.window_busbw`, the harmonic mean of the
out-of-place bus bandwidth over the sizes in :data:`MESSAGE_WINDOW_BYTES`
(10 MB - 1 GiB, the pipeline activations b*s*h*2 of 1 x 2048 x 4096 x 2 up to
4 x 8192 x 16384 x 2 bytes).  Harmonic, because transfer time is bytes / B:
the mean of 1/B over the sizes predicts the mean time per byte.  Degraded links
collapse at multi-GB messages (6.6 GB/s at 32 MiB, 1.0 GB/s at 16 GiB), so a
peak or a mean over all sizes would misstate them.  A log with no size in the
window (cluster01 was run at 4-32 GiB) uses the nearest size outside it.
Pairwise directories of such logs become matrices in
:mod:`pipette_cp.io.measurements.nccl_pairwise`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipette_cp.errors import InputFileError
from pipette_cp.io.files import read_text
from pipette_cp.units import GB, MB, MS, US, GiB

#: Message sizes (bytes, inclusive) of pipeline p2p transfers (module doc).
MESSAGE_WINDOW_BYTES: tuple[float, float] = (10 * MB, 1 * GiB)

#: File name of one run: ``nccl_N<nodes>_G<gpus per node>_<host>[_<host>...].log``.
LOG_NAME = re.compile(r"^nccl_N(?P<n>\d+)_G(?P<g>\d+)(?:_(?P<hosts>.+))?\.log$")

_STARTING = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_NTHREAD = re.compile(r"^#\s*nThread\s.*?minBytes\s+(\d+)\s+maxBytes\s+(\d+)")
_VERSION = re.compile(r"^#\s*nccl-tests version\s+(\S+)")
_RANK = re.compile(
    r"^#\s+Rank\s+\d+\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+\S+\s+(.+)$"
)
_ROW = re.compile(r"^\s*\d+\s+\d+\s+\S+\s+\S+\s")
_ROW_START = re.compile(r"^\s*\d+(\s|$)")  # a row cut short (the last line only)
_COLUMNS = re.compile(r"^#\s*size\s+count\s+type\s")
_UNITS = re.compile(r"^#\s*\(B\)")
_UNIT = re.compile(r"\(([^()\s]+)\)")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s+(\S+)")
_ERROR = re.compile(r"\b(failure|failed|error|abort(ed)?|killed|terminated)\b", re.IGNORECASE)


@dataclass(frozen=True)
class NcclRow:
    """One message size of one test (out-of-place columns; in-place may be absent)."""

    size_bytes: int
    time_s: float
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float
    wrong: int | None
    in_place_busbw_bytes_per_s: float | None = None


@dataclass(frozen=True)
class NcclTest:
    """One collective test of a log: its table, ranks and any error lines."""

    name: str
    rows: tuple[NcclRow, ...]
    hosts: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    avg_busbw_bytes_per_s: float | None = None
    version: str = ""
    truncated: str | None = None  # why the last row was ignored, if it was
    malformed: str | None = None  # why its table could not be read, if it could not

    @property
    def failure(self) -> str | None:
        """Why the test failed, or None when its table is usable."""
        if self.malformed:
            return f"unreadable table: {self.malformed}"
        if self.errors:
            return self.errors[0]
        if not self.rows and self.truncated:
            return f"no complete result row ({self.truncated})"
        if not self.rows:
            return "no result table (the run stopped before any message size completed)"
        bad = [r.size_bytes for r in self.rows if r.wrong]
        if bad:
            return f"#wrong > 0 (corrupted results) at {len(bad)} message sizes"
        return None

    @property
    def ok(self) -> bool:
        return self.failure is None

    def window_rows(
        self, window: tuple[float, float] = MESSAGE_WINDOW_BYTES
    ) -> tuple[NcclRow, ...]:
        """Rows inside ``window``; if none, the nearest row above it or below it."""
        lo, hi = window
        inside = tuple(r for r in self.rows if lo <= r.size_bytes <= hi)
        if inside or not self.rows:
            return inside
        above = [r for r in self.rows if r.size_bytes > hi]
        return (min(above, key=lambda r: r.size_bytes),) if above else (self.rows[-1],)

    def window_busbw(self, window: tuple[float, float] = MESSAGE_WINDOW_BYTES) -> float:
        """Harmonic mean of the out-of-place bus bandwidth over :meth:`window_rows`,
        bytes/s; 0 for a failed test."""
        rows = self.window_rows(window)
        if not self.ok or not rows or any(r.busbw_bytes_per_s <= 0 for r in rows):
            return 0.0
        return len(rows) / sum(1.0 / r.busbw_bytes_per_s for r in rows)


@dataclass(frozen=True)
class NcclLog:
    """One log file: its tests and what its name says about the run."""

    path: str
    tests: tuple[NcclTest, ...]
    num_nodes: int | None = None
    gpus_per_node: int | None = None
    hosts: tuple[str, ...] = ()

    def test(self, name: str) -> NcclTest | None:
        """The last test called ``name`` (``sendrecv`` and ``sendrecv_perf`` both work)."""
        wanted = name if name.endswith("_perf") else f"{name}_perf"
        found = [t for t in self.tests if t.name == wanted]
        return found[-1] if found else None


_HEADERS = ((_VERSION, 0), (_STARTING, 1), (_NTHREAD, 2))
#: Units the unit line of a table may give (nccl-tests prints us and GB/s).
_BANDWIDTH_UNITS = {"GB/s": GB, "MB/s": MB}
_TIME_UNITS = {"us": US, "ms": MS}
#: Column names of a table without a column header line, by number of columns: with
#: or without ``root`` (nccl-tests >= 2.17 prints it), with or without in-place columns.
_HEAD, _OUT = ["size", "count", "type", "redop"], ["time", "algbw", "busbw", "#wrong"]
_DEFAULT_COLUMNS = {8: _HEAD + _OUT, 9: [*_HEAD, "root", *_OUT], 12: _HEAD + _OUT + _OUT,
                    13: [*_HEAD, "root", *_OUT, *_OUT]}  # fmt: skip


def _new_block() -> dict[str, Any]:
    return {"name": "", "rows": [], "hosts": [], "devices": [], "errors": [], "columns": None,
            "bandwidth_unit": GB, "time_unit": US, "version": ""}  # fmt: skip


def parse_nccl_tests_log(text: str, where: str = "nccl-tests output") -> tuple[NcclTest, ...]:
    r"""Every test of one nccl-tests output (several tests may follow each other).

    A test opens with up to three header lines (``# nccl-tests version``, ``#
    Collective test starting: NAME``, ``# nThread ...``); a header line opens a
    new test unless the current one has only seen headers that come before it.
    Rows are read by the table's column line (``# size count type ...``) and
    in the units of its unit line (``# (B) (elements) (us) (GB/s) ...``; MB/s is
    converted).  The last row of a test, when incomplete (the log cut off or a
    line overwritten), is ignored and named in :attr:`NcclTest.truncated`.

    Parameters
    ----------
    text : str
        The whole stdout of one or more nccl-tests runs.
    where : str
        Names the input in error messages.

    Returns
    -------
    tuple of NcclTest
        In order of appearance; a test whose job died has no rows.

    A table with rows in a unit other than us / ms and GB/s / MB/s (or a unit line
    not understood), or a malformed row followed by other rows of its table, is not
    read: its test says why in :attr:`NcclTest.malformed` (the log's other tests
    stay usable).

    Examples
    --------
    >>> text = "# nThread 1 nGpus 1 minBytes 8 maxBytes 8 step: 2(factor)\n"
    >>> text += "  8  2  float  sum  -1  10.0  0.00  0.00  0  10.0  0.00  0.00  0\n"
    >>> [(t.name, len(t.rows), t.ok) for t in parse_nccl_tests_log(text)]
    [('', 1, True)]
    """
    blocks: list[dict[str, Any]] = []
    version = ""
    lines = text.splitlines()
    cut = len(lines) if text and not text.endswith(("\n", "\r")) else None  # no final newline
    for number, line in enumerate(lines, start=1):
        stage = next(((rx, st) for rx, st in _HEADERS if rx.match(line)), None)
        if stage is not None:
            rx, st = stage
            if not blocks or blocks[-1]["stage"] >= st:
                blocks.append(_new_block())
            blocks[-1]["stage"] = st
            if st == 0:
                version = rx.match(line).group(1)  # type: ignore[union-attr]
            if st == 1:
                blocks[-1]["name"] = rx.match(line).group(1)  # type: ignore[union-attr]
            blocks[-1]["version"] = version
            continue
        if not blocks:
            continue
        cur = blocks[-1]
        if _COLUMNS.match(line):
            cur["columns"] = line.lstrip("#").split()
            continue
        if _UNITS.match(line):
            try:
                _read_units(cur, line, f"{where}: line {number}")
            except InputFileError as exc:  # raised once a row would be read in these units
                cur["unit_error"] = exc
            continue
        if m := _RANK.match(line):
            cur["hosts"].append(m.group(1))
            cur["devices"].append(m.group(2).strip())
        elif m := _AVG.match(line):
            if (avg := _number(m.group(1))) is not None:
                cur["avg"] = avg * cur["bandwidth_unit"]
        elif (m := _OOB.match(line)) and m.group(2).upper() != "OK":
            cur["errors"].append(line.lstrip("# ").strip())
        elif _ROW.match(line) or (number == cut and _ROW_START.match(line)
                                  and not _ERROR.search(line)):  # fmt: skip
            cur["rows"].append((number, line))
        elif not line.startswith("#") and _ERROR.search(line) and "NCCL INFO" not in line:
            cur["errors"].append(line.strip())
        else:
            continue
        cur["stage"] = 3
    return tuple(_test(b, cut, where) for b in blocks)


def _read_units(block: dict[str, Any], line: str, where: str) -> None:
    units = [u for u in _UNIT.findall(line) if u not in ("B", "elements")]
    if not units or len(units) % 3:  # (time) (algbw) (busbw), out-of-place and in-place
        raise InputFileError(where, f"unit line {line.strip()[:60]!r} not understood")
    times, bandwidth = set(units[0::3]), set(units[1::3]) | set(units[2::3])
    for found, known, what in ((bandwidth, _BANDWIDTH_UNITS, "bandwidth"),
                               (times, _TIME_UNITS, "time")):  # fmt: skip
        if len(found) > 1 or not found <= set(known):
            raise InputFileError(
                where, f"{what} unit {'/'.join(sorted(found))}: expected one of {', '.join(known)}"
            )
    if bandwidth:
        block["bandwidth_unit"] = _BANDWIDTH_UNITS[bandwidth.pop()]
    if times:
        block["time_unit"] = _TIME_UNITS[times.pop()]


def _test(block: dict[str, Any], cut: int | None, where: str) -> NcclTest:
    """A block's test; its last row is dropped (and named) when incomplete."""
    rows: list[NcclRow] = []
    truncated = malformed = None
    if block["rows"] and "unit_error" in block:
        malformed, block["rows"] = str(block["unit_error"]), []
    for k, (number, line) in enumerate(block["rows"]):
        last = k == len(block["rows"]) - 1
        row = None if number == cut else _parse_row(line, block)
        if row is None and last:
            why = "the log ends inside it" if number == cut else "incomplete or malformed"
            truncated = f"line {number}: the last result row is cut off ({why}); ignored"
        elif row is None:
            columns = len(block["columns"] or ()) or "8, 9, 12 or 13"
            malformed = (f"{where}: line {number}: malformed result row ({len(line.split())} "
                         f"fields for the header's {columns}): {line.strip()[:60]!r}")  # fmt: skip
            rows = []
            break
        else:
            rows.append(row)
    return NcclTest(
        name=block["name"],
        rows=tuple(rows),
        hosts=tuple(block["hosts"]),
        devices=tuple(block["devices"]),
        errors=tuple(block["errors"]),
        avg_busbw_bytes_per_s=block.get("avg"),
        version=block["version"],
        truncated=truncated,
        malformed=malformed,
    )


def _parse_row(line: str, block: dict[str, Any]) -> NcclRow | None:
    """One row in SI units, or None when it is not complete (wrong number of fields,
    a time or bandwidth that is not a finite number >= 0)."""
    tok = line.split()
    columns = block["columns"] or _DEFAULT_COLUMNS.get(len(tok))
    if columns is None or len(tok) != len(columns) or "time" not in columns:
        return None
    k = columns.index("time")
    out, inp = tok[k : k + 4], tok[k + 4 : k + 8]
    if columns[k : k + 3] != ["time", "algbw", "busbw"] or len(out) < 3:
        return None
    time, algbw, busbw = (_number(t) for t in out[:3])
    wrong = _number(out[3]) if len(out) > 3 else None
    if time is None or algbw is None or busbw is None or (len(out) > 3 and wrong is None
                                                          and out[3] != "N/A"):  # fmt: skip
        return None
    in_place = _number(inp[2]) if len(inp) > 2 else None
    bw, unit = block["bandwidth_unit"], block["time_unit"]
    return NcclRow(
        size_bytes=int(tok[0]),
        time_s=time * unit,
        algbw_bytes_per_s=algbw * bw,
        busbw_bytes_per_s=busbw * bw,
        wrong=None if wrong is None else int(wrong),
        in_place_busbw_bytes_per_s=None if in_place is None else in_place * bw,
    )


def _number(token: str) -> float | None:
    """A finite number >= 0, or None ("N/A": validation or in-place disabled; or not a
    number at all)."""
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def read_nccl_tests_log(path: str | Path) -> NcclLog:
    """Parse one log file.

    Parameters
    ----------
    path : str or Path
        The log; node count, GPUs per node and hosts come from its name when it
        follows :data:`LOG_NAME`, else from its ``# Rank`` lines.

    Returns
    -------
    NcclLog

    Raises
    ------
    InputFileError
        The file is missing, unreadable or holds no nccl-tests output.
    """
    p = Path(path)
    tests = parse_nccl_tests_log(read_text(p), where=str(p))
    if not tests:
        raise InputFileError(p, "no nccl-tests output found (no '# nThread ...' header)")
    ranked = tuple(dict.fromkeys(h for t in tests for h in t.hosts))
    m = LOG_NAME.match(p.name)
    if m is None:
        return NcclLog(str(p), tests, len(ranked) or None, None, ranked)
    named = tuple(m["hosts"].split("_")) if m["hosts"] else ()
    hosts = named if len(named) == int(m["n"]) else ranked
    return NcclLog(str(p), tests, int(m["n"]), int(m["g"]), hosts)


def read_nccl_tests_dir(
    directory: str | Path, skipped: list[tuple[str, str]] | None = None
) -> tuple[NcclLog, ...]:
    """Every ``nccl_N*_G*.log`` file of a directory, sorted by name; each other file,
    and each log with no nccl-tests output, goes to ``skipped`` as ``(path, why)``.  A
    ``<log>.failed`` file (a run that printed no nccl-tests output, as the measurement
    script keeps it) is that log with one failed, unnamed test."""
    d = Path(directory)
    if not d.is_dir():
        raise InputFileError(d, "no such directory")
    logs, notes = [], []
    for p in sorted(d.iterdir()):
        if p.name.endswith(".log.failed") and (m := LOG_NAME.match(p.name[:-7])):
            why = f"the run printed no nccl-tests output ({p.name})"
            hosts = tuple(m["hosts"].split("_")) if m["hosts"] else ()
            logs.append(NcclLog(str(p), (NcclTest("", (), hosts, errors=(why,)),), int(m["n"]),
                                int(m["g"]), hosts if len(hosts) == int(m["n"]) else ()))  # fmt: skip
            continue
        if not LOG_NAME.match(p.name):
            notes.append((str(p), "not a log name (nccl_N<n>_G<g>_<hosts>.log)"))
            continue
        try:
            logs.append(read_nccl_tests_log(p))
        except InputFileError as exc:
            notes.append((str(p), str(exc)))
    if skipped is not None:
        skipped.extend(notes)
    if not logs:
        raise InputFileError(d, "no nccl-tests logs named nccl_N<n>_G<g>_<hosts>.log")
    return tuple(logs)
