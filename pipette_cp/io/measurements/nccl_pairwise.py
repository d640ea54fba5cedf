"""Node x node bandwidth from pairwise nccl-tests runs, and a cluster from them.

A pairwise directory holds one log per node pair and G, named
``nccl_N2_G<g>_<nodeA>_<nodeB>.log`` (two nodes with g GPUs each, as produced by
github.com/xxrjun/nccl-tests-cluster).  Each pair gets one number: the
:meth:`~pipette_cp.io.measurements.nccl_tests.NcclTest.window_busbw` of its out-of-place
``sendrecv_perf`` test, from the logs of one G (``gpus_per_test``).

**What a G=g sendrecv run measures.**  ``sendrecv_perf`` is a ring shift: rank
r sends to rank r+1 and receives from rank r-1 (mod 2g), and ranks 0..g-1 sit
on node A, g..2g-1 on node B.  So exactly one stream crosses the network in
each direction - GPU g-1 of A to GPU 0 of B, and GPU g-1 of B to GPU 0 of A -
while the other 2g-2 streams run over NVLink at the same time.  busbw = algbw
is the bytes per second of each stream, and the ring is paced by its slowest
(cross-node) link.  Hence:

- the per-pair value is what *one* cross-node GPU pair gets, at every G; it is
  never a node aggregate and needs no division;
- G=1 measures GPU 0 <-> GPU 0; G=4 measures GPU 3 -> GPU 0 both ways, which
  may take other NICs (NCCL chooses; the logs do not say which), with the
  nodes' NVSwitch busy.  G does *not* put g GPUs on the network at once - the
  ``alltoall_perf`` runs do (see :func:`nic_load_estimate`);
- sendrecv matches pipeline point-to-point transfers, and out-of-place matches
  Megatron's separate send and receive buffers.

**NIC capacity under load.**  In a 2-node ``alltoall_perf`` run with g GPUs per
node every GPU sends half of its buffer to the other node, so one node pushes
``g * algbw / 2`` bytes/s across; the median of that over the healthy pairs of
the largest-g logs is the node's aggregate NIC capacity when all GPUs send.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from pipette_cp.clusters.expand import cluster_from_node_matrix
from pipette_cp.errors import InputFileError, SpecError
from pipette_cp.io.measurements.devices import gpu_from_device_name
from pipette_cp.io.measurements.import_report import ImportReport, other_g_lines
from pipette_cp.io.measurements.nccl_tests import (
    MESSAGE_WINDOW_BYTES,
    NcclLog,
    read_nccl_tests_dir,
)
from pipette_cp.specs.cluster import ClusterSpec
from pipette_cp.specs.gpu import GpuSpec, resolve_gpu
from pipette_cp.units import GB


@dataclass(frozen=True)
class PairMeasurement:
    """What one pairwise log says about one node pair (bytes/s; 0 = failed)."""

    nodes: tuple[str, str]
    path: str
    bandwidth_bytes_per_s: float
    sizes_bytes: tuple[int, ...]
    largest_size_busbw_bytes_per_s: float
    failure: str | None
    truncated: str | None = None  # the test's last row, cut off, was ignored
    #: why the log measures nothing of the link (unreadable, cut off before its first
    #: row, the test not run): the pair is not measured, not failed
    unmeasured: str | None = None


@dataclass(frozen=True)
class PairwiseMatrix:
    """Node x node bandwidth from pairwise logs; symmetric, because one 2-node
    sendrecv run moves data both ways at once and reports one number."""

    node_names: tuple[str, ...]
    bandwidth_bytes_per_s: np.ndarray
    pairs: tuple[PairMeasurement, ...]
    failed_pairs: tuple[tuple[str, str, str], ...]
    test: str
    gpus_per_test: int
    window_bytes: tuple[float, float] = MESSAGE_WINDOW_BYTES
    devices: tuple[str, ...] = ()
    #: node pairs no log measures, and why (0 in the matrix, but not failed)
    unmeasured: tuple[tuple[str, str, str], ...] = ()


def pairwise_matrix(
    logs: Iterable[NcclLog],
    *,
    gpus_per_test: int = 1,
    test: str = "sendrecv_perf",
    window: tuple[float, float] = MESSAGE_WINDOW_BYTES,
) -> PairwiseMatrix:
    """The node x node matrix of the 2-node logs run with ``gpus_per_test`` GPUs per node.

    Parameters
    ----------
    logs : iterable of NcclLog
        Typically :func:`~pipette_cp.io.measurements.nccl_tests.read_nccl_tests_dir` of a
        pairwise directory; logs of other node counts or G are ignored.
    gpus_per_test : int
        The G of the logs to use (module doc: which GPU pair each G measures).
    test : str
        The test whose ``window_busbw`` is each pair's number.
    window : (float, float)
        Message sizes, bytes, of that statistic.

    Returns
    -------
    PairwiseMatrix
        Bytes/s, 0 = failed or not measured.  ``failed_pairs`` are the pairs whose
        run failed (NCCL errors, no result table, corrupted results, the job dead
        before the test), with the log's reason; ``unmeasured`` the pairs no log
        measures (no log, an unreadable table, a log cut off before its first row,
        the test not in the log).  Two logs of one pair (both name orders) are
        averaged over those that succeeded.  A log cut off in the middle of a row
        keeps its complete rows (the cut row is ignored and named in
        :attr:`PairMeasurement.truncated`; never read as 0 bandwidth).

    Raises
    ------
    InputFileError
        No 2-node log with ``gpus_per_test`` GPUs per node.
    """
    chosen = [log for log in logs if log.num_nodes == 2 and log.gpus_per_node == gpus_per_test]
    if not chosen:
        raise InputFileError("nccl-tests logs", f"no 2-node logs with G={gpus_per_test}")
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
        sizes = tuple(r.size_bytes for r in rows)
        cut = None if t is None else t.truncated
        lost = _unmeasured(log, test)
        pairs.append(PairMeasurement((a, b), log.path, value, sizes, largest, failure, cut, lost))
        devices.extend(t.devices if t is not None else ())
        if failure is None and value > 0:
            for i, j in ((index[a], index[b]), (index[b], index[a])):
                sums[i, j] += value
                counts[i, j] += 1
    matrix = np.divide(sums, counts, out=np.zeros_like(sums), where=counts > 0)
    failed, unmeasured = [], []
    by_pair: dict[frozenset, list[PairMeasurement]] = {}
    for p in pairs:
        by_pair.setdefault(frozenset(p.nodes), []).append(p)
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            if matrix[i, j] > 0:
                continue
            runs = by_pair.get(frozenset((names[i], names[j])), [])
            ran = [p for p in runs if p.unmeasured is None]
            if ran:  # some run of the pair failed (and none succeeded)
                failed.append((names[i], names[j], ran[0].failure or "no bandwidth"))
            else:
                why = runs[0].unmeasured if runs else "no log"
                unmeasured.append((names[i], names[j], why or "no log"))
    return PairwiseMatrix(names, matrix, tuple(pairs), tuple(failed), test, gpus_per_test,
                          window, tuple(devices), tuple(unmeasured))  # fmt: skip


def _unmeasured(log: NcclLog, test: str) -> str | None:
    """Why ``log`` says nothing of its link (None when it measured it, or its run failed)."""
    t = log.test(test)
    if t is None:
        unread = [x.malformed for x in log.tests if x.malformed]
        if unread:
            return f"unreadable table ({unread[0]})"
        return None if any(not x.ok for x in log.tests) else f"{test} not in the log"
    if t.malformed:
        return f"unreadable table ({t.malformed})"
    if not t.rows and t.truncated:
        return f"cut off before its first complete row ({t.truncated})"
    return None


def _missing_reason(log: NcclLog, test: str) -> str:
    earlier = [f"{t.name}: {t.failure}" if t.name else str(t.failure) for t in log.tests
               if not t.ok]  # fmt: skip
    why = f" (the job stopped after {earlier[0]})" if earlier else ""
    return f"{test} not in the log{why}"


def nic_load_estimate(
    logs: Iterable[NcclLog],
    *,
    gpus_per_test: int | None = None,
    window: tuple[float, float] = MESSAGE_WINDOW_BYTES,
) -> float | None:
    """Cross-node bytes/s of one node when its ``gpus_per_test`` GPUs (default:
    the largest G) all send at once: the median over pairs of 2-node
    ``alltoall_perf`` runs of ``g * algbw / 2``, ignoring pairs below 0.8 x the
    median (a degraded link says nothing about the NIC); None without such logs."""
    pool = [log for log in logs if log.num_nodes == 2 and log.gpus_per_node]
    g = gpus_per_test or max((int(log.gpus_per_node or 0) for log in pool), default=0)
    rates = []
    for log in pool:
        t = log.test("alltoall_perf")
        if log.gpus_per_node != g or t is None or not t.ok:
            continue
        rows = t.window_rows(window)
        if not rows or any(r.algbw_bytes_per_s <= 0 for r in rows):
            continue  # a dead link says nothing about the NIC
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


#: What to do with node pairs no log measures (:func:`import_nccl_tests_dir`).
Unmeasured = Literal["refuse", "failed", "median"]


def convert_nccl_tests_dir(directory: str | Path, **options: Any) -> ClusterSpec:
    """:func:`import_nccl_tests_dir`'s cluster alone."""
    return import_nccl_tests_dir(directory, **options)[0]


def import_nccl_tests_dir(
    directory: str | Path,
    *,
    gpus_per_test: int = 1,
    single_node_dir: str | Path | None = None,
    name: str | None = None,
    gpu: GpuSpec | str | None = None,
    gpus_per_node: int | None = None,
    nics_per_node: int | None = None,
    intra_node_bytes_per_s: float | None = None,
    window: tuple[float, float] = MESSAGE_WINDOW_BYTES,
    source: str = "",
    unmeasured: Unmeasured = "refuse",
) -> tuple[ClusterSpec, ImportReport]:
    """A :class:`ClusterSpec` from a directory of pairwise nccl-tests logs, and the
    account of every file (:mod:`~pipette_cp.io.measurements.import_report`).

    Derived as follows (each override a keyword):

    - inter-node: :func:`pairwise_matrix` at ``gpus_per_test`` (default 1: GPU 0 <->
      GPU 0; module doc), the same value for every GPU pair of a node pair; a pair
      whose run failed is a failed pair (0); a pair no log measures is refused
      (``unmeasured="refuse"``), failed (``"failed"``) or the median pair (``"median"``);
    - GPU type: from the ``# Rank`` lines unless ``gpu`` is given;
    - GPUs per node: the largest G among the logs unless given;
    - NICs per node: ``gpus_per_node`` unless given (one NIC per GPU, as in
      HGX/DGX designs; nccl-tests logs do not name the NICs);
    - NIC bandwidth: :func:`nic_load_estimate` / NICs, or the median pair when
      no multi-GPU alltoall logs exist (named as assumed);
    - intra-node: ``intra_node_bytes_per_s``, else :func:`intra_node_estimate` of
      ``single_node_dir`` or of the directory's own single-node logs, else the GPU's
      datasheet NVLink bandwidth (named as assumed);
    - latencies: the spec defaults (the logs start at multi-MB messages).

    Raises
    ------
    InputFileError
        A missing directory, no usable log, or unmeasured pairs refused.
    SpecError
        Unknown GPU, or a node whose every pair failed.
    """
    skipped: list[tuple[str, str]] = []
    logs = read_nccl_tests_dir(directory, skipped)
    matrix = pairwise_matrix(logs, gpus_per_test=gpus_per_test, window=window)
    gpu_spec = resolve_gpu(gpu) if gpu is not None else gpu_from_device_name(matrix.devices)
    g = gpus_per_node or max(int(log.gpus_per_node or 1) for log in logs)
    nics = nics_per_node or g
    bandwidth = matrix.bandwidth_bytes_per_s.copy()
    alive = bandwidth[bandwidth > 0]
    failed = [f"{a}-{b}: {why}" for a, b, why in matrix.failed_pairs]
    if matrix.unmeasured:
        k = len(matrix.unmeasured)
        listed = "; ".join(f"{a}-{b} ({why})" for a, b, why in matrix.unmeasured[:3])
        more = f" and {k - 3} more" if k > 3 else ""
        if unmeasured == "refuse" or not alive.size:
            pairs = "1 node pair has" if k == 1 else f"{k} node pairs have"
            fix = ("rerun them, or pass --unmeasured failed (no traffic between them) or "
                   "--unmeasured median (the median measured pair)") if alive.size else (
                   "no pair is measured")  # fmt: skip
            raise InputFileError(
                directory, f"{pairs} no usable G={gpus_per_test} measurement: "
                f"{listed}{more}; {fix}")  # fmt: skip
        index = {n: i for i, n in enumerate(matrix.node_names)}
        fill = float(np.median(alive)) if unmeasured == "median" and alive.size else 0.0
        for a, b, why in matrix.unmeasured:
            bandwidth[index[a], index[b]] = bandwidth[index[b], index[a]] = fill
            failed += [] if fill else [f"{a}-{b}: not measured ({why}), taken as failed"]
    node_rate = nic_load_estimate(logs, window=window)
    top = max((int(x.gpus_per_node or 0) for x in logs if x.num_nodes == 2), default=0)
    nic_text = f"{(node_rate or 0) / GB:.1f} GB/s per node, measured (alltoall_perf, G={top})"
    if node_rate is None:
        node_rate = float(np.median(alive)) * nics
        nic_text = (f"{node_rate / GB:.1f} GB/s per node, assumed: {nics} NICs x the median "
                    "pair (no multi-GPU alltoall_perf logs)")  # fmt: skip
    intra, intra_text = _intra_node(logs, single_node_dir, intra_node_bytes_per_s, gpu_spec, window)
    others = {k: pairwise_matrix(logs, gpus_per_test=k, window=window).bandwidth_bytes_per_s
              for k in {int(x.gpus_per_node or 0) for x in logs if x.num_nodes == 2}
              if k and k != gpus_per_test}  # fmt: skip
    notes = [(Path(path).name, "skipped", why) for path, why in skipped]
    notes += [(Path(p.path).name, "not used", p.unmeasured) for p in matrix.pairs
              if p.unmeasured]  # fmt: skip
    notes += [(Path(p.path).name, "cut off mid-row (its last row ignored)", p.truncated)
              for p in matrix.pairs if p.truncated and not p.unmeasured]  # fmt: skip
    used = sum(1 for p in matrix.pairs if p.unmeasured is None)
    report = ImportReport(used, gpus_per_test, tuple(notes),
                          other_g_lines(logs, gpus_per_test, bandwidth, others), tuple(failed),
                          intra_text, nic_text)  # fmt: skip
    cluster = cluster_from_node_matrix(
        node_bandwidth=bandwidth,
        intra_node=intra,
        gpus_per_node=g,
        gpu=gpu_spec,
        nics_per_node=nics,
        nic_bandwidth_bytes_per_s=node_rate / nics,
        name=name or Path(directory).resolve().name,
        node_names=matrix.node_names,
        source=source
        or f"nccl-tests {matrix.test} G={gpus_per_test}, harmonic mean of busbw over "
        f"{window[0]:.3g}-{window[1]:.3g} B; {report.provenance()}",
    )
    return cluster, report


def _intra_node(
    logs: Sequence[NcclLog], single_node_dir: str | Path | None, given: float | None,
    gpu: GpuSpec, window: tuple[float, float],
) -> tuple[float, str]:  # fmt: skip
    """The intra-node bandwidth and where it comes from."""
    if given is not None:
        value, text = given, "given"
    else:
        single = read_nccl_tests_dir(single_node_dir) if single_node_dir is not None else logs
        measured = intra_node_estimate(single, window=window)
        nodes = {h for log in single if log.num_nodes == 1 for h in log.hosts}
        value = measured or gpu.nvlink_bandwidth_bytes_per_s
        text = (f"measured: median single-node sendrecv_perf over {len(nodes)} nodes"
                if measured else f"assumed: the {gpu.name} datasheet NVLink figure (no "
                "single-node logs; --single-node DIR or --intra-gb-per-s give it)")  # fmt: skip
    if value <= 0:
        raise SpecError("intra_node_bytes_per_s", value, "needed for a GPU without NVLink")
    return value, f"{value / GB:.1f} GB/s, {text}"


def failed_tests(logs: Iterable[NcclLog]) -> tuple[tuple[str, str, str], ...]:
    """``(log path, test name, reason)`` of every test that a log holds and that
    failed (a test the job never started is not counted, as upstream's summaries
    do not count it)."""
    return tuple(
        (log.path, t.name, t.failure) for log in logs for t in log.tests if t.failure is not None
    )
