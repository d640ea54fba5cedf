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

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipette_cp.clusters.expand import cluster_from_node_matrix
from pipette_cp.errors import InputFileError, SpecError
from pipette_cp.io.measurements.nccl_tests import (
    MESSAGE_WINDOW_BYTES,
    NcclLog,
    gpu_from_device_name,
    read_nccl_tests_dir,
)
from pipette_cp.specs.cluster import ClusterSpec
from pipette_cp.specs.gpu import GpuSpec, resolve_gpu


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
        Bytes/s, 0 = failed or not measured; ``failed_pairs`` gives each such
        pair's reason ("no log" when there is none).  Two logs of one pair (both
        name orders) are averaged over those that succeeded.  A log cut off in
        the middle of a row keeps its complete rows (the cut row is ignored and
        named in :attr:`PairMeasurement.truncated`; never read as 0 bandwidth);
        with no complete row, the pair is not measured.

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
        pairs.append(PairMeasurement((a, b), log.path, value, sizes, largest, failure, cut))
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
        names, matrix, tuple(pairs), failed, test, gpus_per_test, window, tuple(devices)
    )


def _missing_reason(log: NcclLog, test: str) -> str:
    earlier = [f"{t.name}: {t.failure}" for t in log.tests if not t.ok]
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


def convert_nccl_tests_dir(
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
) -> ClusterSpec:
    """A :class:`ClusterSpec` from a directory of pairwise nccl-tests logs.

    Parameters
    ----------
    directory : str or Path
        Files named ``nccl_N2_G<g>_<nodeA>_<nodeB>.log``.
    gpus_per_test : int
        The G whose ``sendrecv_perf`` logs give the inter-node matrix (default 1:
        GPU 0 <-> GPU 0; module doc).  Not the cluster's GPUs per node.
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

    - inter-node: :func:`pairwise_matrix` at ``gpus_per_test`` (0 = failed
      pair; the spec refuses a node whose every pair failed), the same value
      for every GPU pair of a node pair;
    - GPU type: from the ``# Rank`` lines unless ``gpu`` is given;
    - GPUs per node: the largest G among the logs unless given;
    - NICs per node: ``gpus_per_node`` unless given (one NIC per GPU, as in
      HGX/DGX designs; nccl-tests logs do not name the NICs);
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
    matrix = pairwise_matrix(logs, gpus_per_test=gpus_per_test, window=window)
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
        or f"nccl-tests {matrix.test} G={gpus_per_test}, {len(matrix.pairs)} pairwise logs, "
        f"harmonic mean of busbw over {window[0]:.3g}-{window[1]:.3g} B"
        + _cut_note(matrix),
    )


def _cut_note(matrix: PairwiseMatrix) -> str:
    """``; 2 logs cut off mid-row (their last row ignored): a.log, b.log`` or nothing."""
    cut = [Path(p.path).name for p in matrix.pairs if p.truncated]
    if not cut:
        return ""
    return f"; {len(cut)} logs cut off mid-row (their last row ignored): {', '.join(cut)}"
