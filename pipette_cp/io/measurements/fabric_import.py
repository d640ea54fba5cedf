"""A measured dense cluster as switch levels plus the exceptions that tell it apart.

:func:`fabric_from_dense` turns a cluster with a bandwidth matrix (an nccl-tests import,
say) into one on a :class:`~pipette_cp.specs.hierarchy.HierarchicalFabric`:

- levels: consecutive groups of nodes in the cluster's node order (``leaf:2,spine``:
  leaves of 2 nodes, the spine holding all), each at its given bandwidth or else the
  median of the measured node pairs that first meet at that level;
- slow NICs: a node whose every working pair lies more than ``tolerance`` below its
  level's nominal, at the median of those shares;
- node pairs: every other pair more than ``tolerance`` away from what the levels and
  NICs give it (0 where it failed), at its measured value;
- GPU pairs: every GPU pair still more than ``tolerance`` away (a failed GPU pair, an
  uneven NVLink), at its measured value.

So every GPU pair of the result lies within ``tolerance`` of the measurement (relative to
the fabric's value), failed pairs exactly failed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pipette_cp.errors import SpecError
from pipette_cp.io.fabric_file import build_fabric, fabric_summary, parse_levels
from pipette_cp.io.files import read_mapping
from pipette_cp.specs.cluster import MIN_LINK_BYTES_PER_S, ClusterSpec
from pipette_cp.specs.hierarchy import FabricLevel, HierarchicalFabric, PairExceptions

#: Rows of GPU pairs compared at once (memory: rows x GPUs floats).
_CHUNK_GPUS = 512


def levels_option(text: str, num_nodes: int, latency_s: float, field: str = "--fabric") -> tuple[FabricLevel, ...]:  # fmt: skip
    """The levels an option gives: a YAML file with ``levels:`` (as a cluster file's
    ``fabric.levels``, bandwidths optional), or ``name:nodes[@GB/s],...`` (the last
    level's nodes default to all: ``leaf:8,spine``).  A bandwidth left out is 0 here,
    the median of the measured pairs in :func:`fabric_from_dense`."""
    if text.endswith((".yaml", ".yml", ".json")) or Path(text).is_file():
        data = read_mapping(text)
        unknown = sorted(set(data) - {"levels"}, key=repr)
        if unknown:
            raise SpecError(
                f"{field}.{unknown[0]}", data[unknown[0]], "unknown field; known: levels"
            )
        return parse_levels(data.get("levels"), f"{field}.levels", num_nodes, latency_s,
                            need_bandwidth=False)  # fmt: skip
    levels: list[dict[str, Any]] = []
    for k, item in enumerate(t.strip() for t in text.split(",")):
        name, _, rest = item.partition(":")
        nodes, _, gb = rest.partition("@") if rest else ("", "", "")
        if "@" in name:
            name, _, gb = name.partition("@")
        try:
            level: dict[str, Any] = {"name": name.strip()}
            if nodes.strip():
                level["nodes"] = int(nodes)
            if gb.strip():
                level["bandwidth_gb_per_s"] = float(gb)
        except ValueError:
            raise SpecError(f"{field}[{k}]", item, "expected name:nodes[@GB/s], e.g. "
                            "leaf:8@46,spine") from None  # fmt: skip
        levels.append(level)
    return parse_levels(levels, f"{field}", num_nodes, latency_s, need_bandwidth=False)


def fabric_from_dense(
    cluster: ClusterSpec, levels: tuple[FabricLevel, ...], *, tolerance: float = 0.1,
    field: str = "--fabric",
) -> ClusterSpec:  # fmt: skip
    """``cluster`` on switch levels plus exceptions (module doc).

    Raises
    ------
    SpecError
        Levels that do not nest or miss nodes, a level without a bandwidth and without a
        measured pair to take it from, a tolerance outside [0, 1), a cluster with NVLink
        domains of several nodes.
    """
    if not 0 <= tolerance < 1:
        raise SpecError("--tolerance", tolerance, "must be a share in [0, 1)")
    if cluster.fabric is not None:
        return cluster
    if cluster.nodes_per_nvlink_domain > 1:
        raise SpecError("cluster.nodes_per_nvlink_domain", cluster.nodes_per_nvlink_domain,
                        "a fabric has one NVLink domain per node")  # fmt: skip
    n, g = cluster.num_nodes, cluster.gpus_per_node
    dense = cluster.matrix
    measured = cluster.node_matrix()
    off = ~np.eye(n, dtype=bool)
    sizes = [lv.nodes for lv in levels]
    shape = [lv.model_copy(update={"bandwidth_bytes_per_s": 1.0}) for lv in levels]
    build_fabric({"num_nodes": n, "gpus_per_node": g, "nvlink_bandwidth_bytes_per_s": 1.0,
                  "nvlink_latency_s": 0.0, "levels": shape}, field)  # levels nest  # fmt: skip
    nodes = np.arange(n)
    level = sum(((nodes[:, None] // s) != (nodes[None, :] // s)).astype(int) for s in sizes[:-1])
    level = np.asarray(level) if sizes[:-1] else np.zeros((n, n), dtype=int)
    working = off & (measured > 0)
    nominal = _medians(levels, measured, level, working, field, None)
    slow, factor = _slow_nodes(measured, np.asarray(nominal)[level], working, tolerance)
    if slow.size:  # the medians again without the slow NICs' pairs, and the NICs again
        healthy = working.copy()
        healthy[slow, :] = healthy[:, slow] = False
        nominal = _medians(levels, measured, level, healthy, field, nominal)
        slow, factor = _slow_nodes(measured, np.asarray(nominal)[level], working, tolerance)
    fixed = tuple(lv.model_copy(update={"bandwidth_bytes_per_s": bw})
                  for lv, bw in zip(levels, nominal, strict=True))  # fmt: skip
    intra = dense.reshape(n, g, n, g)[nodes, :, nodes, :][:, ~np.eye(g, dtype=bool)]
    live = intra[intra > 0]
    nvlink = (
        float(np.median(live)) if live.size else cluster.gpu_of_node(0).nvlink_bandwidth_bytes_per_s
    )
    fields: dict[str, Any] = {
        "num_nodes": n, "gpus_per_node": g, "levels": fixed,
        "nvlink_bandwidth_bytes_per_s": max(nvlink, MIN_LINK_BYTES_PER_S),
        "nvlink_latency_s": cluster.intra_node_latency_s,
    }  # fmt: skip
    base = np.asarray(nominal)[level]
    fields["slow_nics"] = {"node": slow, "nic_factor": factor[slow]}
    predicted = base * np.minimum(factor[:, None], factor[None, :])
    odd = off & ((measured <= 0) | (np.abs(measured - predicted) > tolerance * predicted))
    src, dst = np.nonzero(odd)
    fields["node_pairs"] = {"src": src, "dst": dst, "bandwidth_bytes_per_s": measured[src, dst]}
    fabric = build_fabric(fields, field)
    gpu_pairs = _gpu_exceptions(fabric, dense, tolerance)
    if gpu_pairs.src.size:
        fabric = build_fabric({**fields, "gpu_pairs": gpu_pairs}, field)
    data = {k: getattr(cluster, k) for k in type(cluster).model_fields}
    data |= {"bandwidth_bytes_per_s": None, "fabric": fabric,
             "source": f"{cluster.source}; as a fabric within {tolerance:.0%}: "
                       f"{fabric_summary(fabric)}"}  # fmt: skip
    return ClusterSpec(**data)


def _medians(
    levels: tuple[FabricLevel, ...], measured: np.ndarray, level: np.ndarray, usable: np.ndarray,
    field: str, fallback: list[float] | None,
) -> list[float]:  # fmt: skip
    """Each level's bandwidth: given, else the median of the ``usable`` pairs first meeting
    there (else ``fallback``'s)."""
    out = []
    for k, lv in enumerate(levels):
        alive = measured[usable & (level == k)]
        if lv.bandwidth_bytes_per_s > 0:
            out.append(lv.bandwidth_bytes_per_s)
        elif alive.size:
            out.append(float(np.median(alive)))
        elif fallback is not None:
            out.append(fallback[k])
        else:
            raise SpecError(f"{field}[{k}].bandwidth_gb_per_s", None,
                            "no measured pair first meets at this level: give it")  # fmt: skip
    return out


def _slow_nodes(
    measured: np.ndarray, base: np.ndarray, working: np.ndarray, tolerance: float
) -> tuple[np.ndarray, np.ndarray]:
    """Nodes with 2+ partners whose every working pair (both ways) lies more than
    ``tolerance`` below its level, and every node's NIC factor (theirs: the median share)."""
    ratio = np.divide(measured, base, out=np.zeros_like(measured), where=base > 0)
    slow_pair = working & (ratio < 1 - tolerance)
    partners = (working | working.T).sum(axis=1)
    every = (slow_pair == working).all(axis=1) & (slow_pair == working).all(axis=0)
    slow = np.flatnonzero((partners >= 2) & every & working.any(axis=1))
    factor = np.ones(measured.shape[0])
    for k in slow.tolist():
        shares = np.concatenate((ratio[k, working[k]], ratio[working[:, k], k]))
        factor[k] = float(np.clip(np.median(shares), 1e-6, 1.0))
    return slow, factor


def _gpu_exceptions(
    fabric: HierarchicalFabric, dense: np.ndarray, tolerance: float
) -> PairExceptions:
    """The GPU pairs ``fabric`` misses by more than ``tolerance``, at their measured value."""
    total = dense.shape[0]
    srcs, dsts, values = [], [], []
    for start in range(0, total, _CHUNK_GPUS):
        rows = np.arange(start, min(start + _CHUNK_GPUS, total))
        src, dst = np.broadcast_arrays(rows[:, None], np.arange(total)[None, :])
        got, want = fabric.bandwidth(src, dst), dense[rows]
        bad = (src != dst) & (((want <= 0) != (got <= 0)) | (np.abs(got - want) > tolerance * got))
        srcs.append(src[bad])
        dsts.append(dst[bad])
        values.append(want[bad])
    return PairExceptions(src=np.concatenate(srcs), dst=np.concatenate(dsts),
                          bandwidth_bytes_per_s=np.concatenate(values))  # fmt: skip


def dense_twin(cluster: ClusterSpec) -> ClusterSpec:
    """A fabric cluster with its GPU x GPU matrix instead (what needs the whole matrix,
    a comparison: up to 4,096 GPUs; beyond, the matrix's one-line SpecError)."""
    if cluster.fabric is None:
        return cluster
    data = {k: getattr(cluster, k) for k in type(cluster).model_fields}
    return ClusterSpec(**data | {"fabric": None, "bandwidth_bytes_per_s": cluster.matrix})
