"""Reading NVIDIA nccl-tests output logs and pairwise runs of them.

A log (``sendrecv_perf``, ``all_reduce_perf``, ``alltoall_perf``, ...) holds one
or more *tests*; each test is a table with one row per message size::

    #       size         count   type   redop  root   time  algbw  busbw #wrong  time algbw busbw #wrong
        33554432       4194304  double    sum    -1  2513.89  13.35 13.35    0  ...

(as nccl-tests 2.17 prints it; older versions without ``root`` are read too).
A test *failed* when its table is missing (the job died before any size
completed), when it prints error lines (``Test NCCL failure ...``), or when a
row reports corrupted results (``#wrong`` > 0).

**Per-pair statistic.**  A pairwise directory (files named
``nccl_N2_G<g>_<nodeA>_<nodeB>.log``, one run of two nodes with g GPUs each,
as produced by github.com/xxrjun/nccl-tests-cluster) becomes a node x node
matrix.  Each pair gets one number: the *harmonic mean of the out-of-place
sendrecv bus bandwidth over the message sizes in* :data:`MESSAGE_WINDOW_BYTES`
(10 MB - 1 GiB), read from the G=1 logs.  Why:

- sendrecv is the pattern of pipeline-parallel point-to-point transfers (for
  sendrecv, busbw = algbw = bytes per second of one stream); out-of-place
  matches Megatron's separate send and receive buffers;
- G=1 runs one stream per node pair, which is what ``ClusterSpec`` stores per
  GPU pair (NIC sharing is modelled from the NIC capacity below).  It only
  exercises GPU 0's path; pass ``gpus_per_node=4`` or 8 to see other rails;
- the window covers pipeline activations b*s*h*2 bytes (1 x 2048 x 4096 x 2 =
  16.8 MB up to 4 x 8192 x 16384 x 2 = 1 GiB).  Degraded pairs collapse at
  multi-GB messages (cnode2-001/004: 6.6 GB/s at 32 MiB, 1.0 GB/s at 16 GiB),
  so a peak or a mean over all sizes would misstate them;
- a harmonic mean because transfer time is bytes / B: averaging 1/B over the
  sizes gives the B that predicts the mean time per byte in the window.

When a log has no size in the window (cluster01 was run at 4-32 GiB only),
the sizes nearest to it are used (the smallest one above it, or the largest
one below it), and :attr:`PairMeasurement.sizes_bytes` records which.

**NIC capacity under load.**  In a 2-node ``alltoall_perf`` run with g GPUs
per node, every GPU sends half of its buffer to the other node, so one node
pushes ``g * algbw / 2`` bytes/s across nodes; the median of that over the
healthy pairs of the largest-g logs is the node's aggregate NIC capacity when
all GPUs send at once (see :func:`nic_load_estimate`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipette_cp.clusters.expand import cluster_from_node_matrix
from pipette_cp.errors import InputFileError, SpecError
from pipette_cp.io.files import read_text
from pipette_cp.specs.cluster import ClusterSpec
from pipette_cp.specs.gpu import GpuSpec, resolve_gpu
from pipette_cp.units import GB, MB, US, GiB

#: Message sizes (bytes, inclusive) of pipeline p2p transfers, see the module doc.
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

    @property
    def failure(self) -> str | None:
        """Why the test failed, or None when its table is usable."""
        if self.errors:
            return self.errors[0]
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


def parse_nccl_tests_log(text: str) -> tuple[NcclTest, ...]:
    r"""Every test of one nccl-tests output (several tests may follow each other).

    A test opens with up to three header lines (``# nccl-tests version``, ``#
    Collective test starting: NAME``, ``# nThread ...``); a header line opens a
    new test unless the current one has only seen headers that come before it.

    Parameters
    ----------
    text : str
        The whole stdout of one or more nccl-tests runs.

    Returns
    -------
    tuple of NcclTest
        In order of appearance; a test whose job died has no rows.

    Examples
    --------
    >>> text = "# nThread 1 nGpus 1 minBytes 8 maxBytes 8 step: 2(factor)\n"
    >>> text += "  8  2  float  sum  -1  10.0  0.00  0.00  0  10.0  0.00  0.00  0\n"
    >>> [(t.name, len(t.rows), t.ok) for t in parse_nccl_tests_log(text)]
    [('', 1, True)]
    """
    blocks: list[dict] = []
    version = ""
    for line in text.splitlines():
        stage = next(((rx, st) for rx, st in _HEADERS if rx.match(line)), None)
        if stage is not None:
            rx, st = stage
            if not blocks or blocks[-1]["stage"] >= st:
                blocks.append({"name": "", "rows": [], "hosts": [], "devices": [], "errors": []})
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
        if m := _RANK.match(line):
            cur["hosts"].append(m.group(1))
            cur["devices"].append(m.group(2).strip())
        elif m := _AVG.match(line):
            cur["avg"] = float(m.group(1)) * GB
        elif (m := _OOB.match(line)) and m.group(2).upper() != "OK":
            cur["errors"].append(line.lstrip("# ").strip())
        elif _ROW.match(line):
            cur["rows"].append(_parse_row(line))
        elif not line.startswith("#") and _ERROR.search(line) and "NCCL INFO" not in line:
            cur["errors"].append(line.strip())
        else:
            continue
        cur["stage"] = 3
    return tuple(
        NcclTest(
            name=b["name"],
            rows=tuple(b["rows"]),
            hosts=tuple(b["hosts"]),
            devices=tuple(b["devices"]),
            errors=tuple(b["errors"]),
            avg_busbw_bytes_per_s=b.get("avg"),
            version=b["version"],
        )
        for b in blocks
    )


def _parse_row(line: str) -> NcclRow:
    tok = line.split()
    # size count type redop [root] | time algbw busbw #wrong | in-place: the same 4
    k = 5 if len(tok) in (9, 13) else 4
    out, inp = [*tok[k : k + 4], "N/A"], [*tok[k + 4 : k + 8], "N/A", "N/A", "N/A"]
    wrong, in_place = _float(out[3]), _float(inp[2])
    return NcclRow(
        size_bytes=int(tok[0]),
        time_s=(_float(out[0]) or 0.0) * US,
        algbw_bytes_per_s=(_float(out[1]) or 0.0) * GB,
        busbw_bytes_per_s=(_float(out[2]) or 0.0) * GB,
        wrong=None if wrong is None else int(wrong),
        in_place_busbw_bytes_per_s=None if in_place is None else in_place * GB,
    )


def _float(token: str) -> float | None:
    """A number, or None for "N/A" (validation or in-place disabled)."""
    try:
        return float(token)
    except ValueError:
        return None


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
    tests = parse_nccl_tests_log(read_text(p))
    if not tests:
        raise InputFileError(p, "no nccl-tests output found (no '# nThread ...' header)")
    ranked = tuple(dict.fromkeys(h for t in tests for h in t.hosts))
    m = LOG_NAME.match(p.name)
    if m is None:
        return NcclLog(str(p), tests, len(ranked) or None, None, ranked)
    named = tuple(m["hosts"].split("_")) if m["hosts"] else ()
    hosts = named if len(named) == int(m["n"]) else ranked
    return NcclLog(str(p), tests, int(m["n"]), int(m["g"]), hosts)


def read_nccl_tests_dir(directory: str | Path) -> tuple[NcclLog, ...]:
    """Every ``nccl_N*_G*.log`` file of a directory, sorted by name."""
    d = Path(directory)
    if not d.is_dir():
        raise InputFileError(d, "no such directory")
    logs = tuple(read_nccl_tests_log(p) for p in sorted(d.iterdir()) if LOG_NAME.match(p.name))
    if not logs:
        raise InputFileError(d, "no nccl-tests logs named nccl_N<n>_G<g>_<hosts>.log")
    return logs


@dataclass(frozen=True)
class PairMeasurement:
    """What one pairwise log says about one node pair."""

    nodes: tuple[str, str]
    path: str
    bandwidth_bytes_per_s: float
    sizes_bytes: tuple[int, ...]
    largest_size_busbw_bytes_per_s: float
    failure: str | None


@dataclass(frozen=True)
class PairwiseMatrix:
    """Node x node bandwidth from pairwise logs (symmetric: a 2-rank sendrecv moves
    data both ways at once and reports one number)."""

    node_names: tuple[str, ...]
    bandwidth_bytes_per_s: np.ndarray
    pairs: tuple[PairMeasurement, ...]
    failed_pairs: tuple[tuple[str, str, str], ...]
    test: str
    gpus_per_node: int
    window_bytes: tuple[float, float] = MESSAGE_WINDOW_BYTES
    devices: tuple[str, ...] = field(default=())


def pairwise_matrix(
    logs: Iterable[NcclLog],
    *,
    gpus_per_node: int = 1,
    test: str = "sendrecv_perf",
    window: tuple[float, float] = MESSAGE_WINDOW_BYTES,
) -> PairwiseMatrix:
    """The node x node matrix of pairwise (2-node) logs.

    Parameters
    ----------
    logs : iterable of NcclLog
        Typically :func:`read_nccl_tests_dir` of a pairwise directory.
    gpus_per_node : int
        Use the logs run with this many GPUs per node (default 1, see the module doc).
    test : str
        The test whose :meth:`NcclTest.window_busbw` is each pair's number.
    window : (float, float)
        Message sizes, bytes, of the statistic.

    Returns
    -------
    PairwiseMatrix
        Bytes/s, symmetric, 0 = failed or not measured, with per-pair details and
        the failed pairs with their reasons ("no log" for pairs without a log).
        Two logs of one pair (both name orders) are averaged over those that succeeded.

    Raises
    ------
    InputFileError
        No 2-node log with ``gpus_per_node`` GPUs.
    """
    chosen = [log for log in logs if log.num_nodes == 2 and log.gpus_per_node == gpus_per_node]
    if not chosen:
        raise InputFileError("nccl-tests logs", f"no 2-node logs with G={gpus_per_node}")
    names = tuple(sorted({h for log in chosen for h in log.hosts}))
    index = {name: i for i, name in enumerate(names)}
    sums = np.zeros((len(names), len(names)))
    counts = np.zeros_like(sums)
    pairs: list[PairMeasurement] = []
    devices: list[str] = []
    for log in chosen:
        a, b = log.hosts
        t = log.test(test)
        failure = t.failure if t is not None else _missing_reason(log, test)
        value = 0.0 if t is None else t.window_busbw(window)
        rows = () if t is None else t.window_rows(window)
        largest = t.rows[-1].busbw_bytes_per_s if t is not None and t.rows else 0.0
        pairs.append(
            PairMeasurement(
                (a, b), log.path, value, tuple(r.size_bytes for r in rows), largest, failure
            )
        )
        devices.extend(t.devices if t is not None else ())
        if failure is None and value > 0:
            for i, j in ((index[a], index[b]), (index[b], index[a])):
                sums[i, j] += value
                counts[i, j] += 1
    matrix = np.divide(sums, counts, out=np.zeros_like(sums), where=counts > 0)
    reasons = {frozenset(p.nodes): p.failure or "no bandwidth" for p in pairs}
    failed = tuple(
        (names[i], names[j], reasons.get(frozenset((names[i], names[j])), "no log"))
        for i in range(len(names))
        for j in range(i + 1, len(names))
        if matrix[i, j] <= 0
    )
    return PairwiseMatrix(
        names, matrix, tuple(pairs), failed, test, gpus_per_node, window, tuple(devices)
    )


def _missing_reason(log: NcclLog, test: str) -> str:
    earlier = [f"{t.name}: {t.failure}" for t in log.tests if not t.ok]
    why = f" (the job stopped after {earlier[0]})" if earlier else ""
    return f"{test} not in the log{why}"


def nic_load_estimate(
    logs: Iterable[NcclLog],
    *,
    gpus_per_node: int | None = None,
    window: tuple[float, float] = MESSAGE_WINDOW_BYTES,
) -> float | None:
    """Cross-node bytes/s of one node when its ``gpus_per_node`` GPUs (default:
    the largest G) all send at once: the median over pairs of 2-node
    ``alltoall_perf`` runs of ``g * algbw / 2`` (each GPU sends half of its
    buffer to the other node), ignoring pairs below 0.8 x the median (a degraded
    link says nothing about the NIC); None without such logs."""
    pool = [log for log in logs if log.num_nodes == 2 and log.gpus_per_node]
    g = gpus_per_node or max((int(log.gpus_per_node or 0) for log in pool), default=0)
    rates = []
    for log in pool:
        t = log.test("alltoall_perf")
        if log.gpus_per_node != g or t is None or not t.ok:
            continue
        rows = t.window_rows(window)
        algbw = len(rows) / sum(1.0 / r.algbw_bytes_per_s for r in rows)
        rates.append(g * algbw / 2)
    if not rates:
        return None
    median = float(np.median(rates))
    return float(np.median([r for r in rates if r >= 0.8 * median]))


def intra_node_estimate(
    logs: Iterable[NcclLog], *, window: tuple[float, float] = MESSAGE_WINDOW_BYTES
) -> float | None:
    """Median over nodes of the single-node ``sendrecv_perf`` statistic at the
    largest G (every GPU sends to its neighbour at once, as pipeline stages do),
    bytes/s; None without single-node logs."""
    single = [log for log in logs if log.num_nodes == 1 and log.gpus_per_node]
    if not single:
        return None
    g = max(int(log.gpus_per_node or 0) for log in single)
    values = [
        t.window_busbw(window)
        for log in single
        if log.gpus_per_node == g and (t := log.test("sendrecv_perf")) is not None and t.ok
    ]
    return float(np.median(values)) if values else None


def gpu_from_device_name(devices: Sequence[str]) -> GpuSpec:
    """The catalogue GPU of the most common nccl-tests device name
    (``NVIDIA H100 80GB HBM3`` -> H100-SXM5-80GB).  PCIe cards and unknown models
    raise :class:`SpecError`: pass the GPU explicitly then."""
    if not devices:
        raise SpecError("gpu", None, "the logs name no device; pass the GPU type explicitly")
    name = Counter(devices).most_common(1)[0][0]
    model = re.search(r"\b([VAHB]\d{2,3})\b", name.replace("-", " "), re.IGNORECASE)
    memory = re.search(r"(\d+)\s*GB", name, re.IGNORECASE)
    if model is None or "pcie" in name.lower():
        raise SpecError(
            "gpu", name, "cannot map this device to a catalogue GPU; pass it explicitly"
        )
    key = model.group(1).lower()
    return resolve_gpu(f"{key}-{memory.group(1)}gb" if memory else key)


def convert_nccl_tests_dir(
    directory: str | Path,
    *,
    single_node_dir: str | Path | None = None,
    name: str | None = None,
    gpu: GpuSpec | str | None = None,
    gpus_per_node: int | None = None,
    nics_per_node: int | None = None,
    intra_node_bytes_per_s: float | None = None,
    window: tuple[float, float] = MESSAGE_WINDOW_BYTES,
    source: str = "",
) -> ClusterSpec:
    """A :class:`ClusterSpec` from a directory of pairwise nccl-tests logs.

    Parameters
    ----------
    directory : str or Path
        Files named ``nccl_N2_G<g>_<nodeA>_<nodeB>.log``.
    single_node_dir : str or Path, optional
        ``nccl_N1_G<g>_<node>.log`` files for the intra-node bandwidth.
    name, gpu, gpus_per_node, nics_per_node, intra_node_bytes_per_s, source
        Override what is derived (below).
    window : (float, float)
        Message sizes, bytes, of the per-pair statistic.

    Returns
    -------
    ClusterSpec
        Derived as follows:

    - inter-node: :func:`pairwise_matrix` of the G=1 ``sendrecv_perf`` logs
      (0 = failed pair; the spec refuses a node whose every pair failed);
    - GPU type: from the ``# Rank`` lines unless ``gpu`` is given;
    - GPUs per node: the largest G among the logs unless given;
    - NICs per node: ``gpus_per_node`` unless given (one NIC per GPU, as in the
      HGX/DGX reference designs; nccl-tests logs do not name the NICs);
    - NIC bandwidth: :func:`nic_load_estimate` / NICs, or the median pair when
      no multi-GPU alltoall logs exist;
    - intra-node: ``intra_node_bytes_per_s``, else :func:`intra_node_estimate`
      of ``single_node_dir``, else the GPU's datasheet NVLink bandwidth;
    - latencies: the spec defaults (the logs start at multi-MB messages).

    Raises
    ------
    InputFileError
        A missing directory or no usable log.
    SpecError
        Unknown GPU, or a node whose every pair failed.
    """
    logs = read_nccl_tests_dir(directory)
    matrix = pairwise_matrix(logs, gpus_per_node=1, test="sendrecv_perf", window=window)
    gpu_spec = resolve_gpu(gpu) if gpu is not None else gpu_from_device_name(matrix.devices)
    g = gpus_per_node or max(int(log.gpus_per_node or 1) for log in logs)
    nics = nics_per_node or g
    alive = matrix.bandwidth_bytes_per_s[matrix.bandwidth_bytes_per_s > 0]
    node_rate = nic_load_estimate(logs, window=window) or float(np.median(alive)) * nics
    intra = intra_node_bytes_per_s
    if intra is None and single_node_dir is not None:
        intra = intra_node_estimate(read_nccl_tests_dir(single_node_dir), window=window)
    if intra is None:
        intra = gpu_spec.nvlink_bandwidth_bytes_per_s
    if intra <= 0:
        raise SpecError("intra_node_bytes_per_s", intra, "needed for a GPU without NVLink")
    return cluster_from_node_matrix(
        node_bandwidth=matrix.bandwidth_bytes_per_s,
        intra_node=intra,
        gpus_per_node=g,
        gpu=gpu_spec,
        nics_per_node=nics,
        nic_bandwidth_bytes_per_s=node_rate / nics,
        name=name or Path(directory).resolve().name,
        node_names=matrix.node_names,
        source=source
        or f"nccl-tests {matrix.test} G=1, {len(matrix.pairs)} pairwise logs, "
        f"harmonic mean of busbw over {window[0]:.3g}-{window[1]:.3g} B",
    )
