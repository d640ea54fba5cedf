"""The cluster file's field checks and the GPU matrix they build, in user units.

:func:`~pipette_cp.io.cluster_file.cluster_from_mapping` reads a cluster file's fields
with these: one integer, number or GB/s matrix at a time, each error a
:class:`~pipette_cp.errors.SpecError` naming the field (``cluster.gpus_per_node``,
``cluster.node_bandwidth_gb_per_s[2][5]``); :func:`bandwidth_rows` turns a GB/s list
of lists into bytes/s, and :func:`expand_gpu_matrix` a node matrix into the GPU x GPU
one with each node's intra-node bandwidth (a scalar, a G x G list or the GPU's NVLink).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pipette_cp.clusters.expand import expand_node_matrix
from pipette_cp.errors import SpecError
from pipette_cp.specs.cluster import MAX_GPUS, MAX_LINK_BYTES_PER_S, MIN_LINK_BYTES_PER_S
from pipette_cp.specs.gpu import GpuSpec, resolve_gpu
from pipette_cp.units import GB


def require_size(n: int, g: int, where: str) -> None:
    """``n`` nodes of ``g`` GPUs must be at most :data:`~pipette_cp.specs.cluster.MAX_GPUS`."""
    if n * g > MAX_GPUS:
        raise SpecError(f"{where}.num_nodes", n, f"{n} nodes x gpus_per_node={g} = {n * g} GPUs; "
                        f"a dense matrix holds at most {MAX_GPUS} (larger: a fabric: section)")  # fmt: skip


def positive_int(data: dict, key: str, where: str) -> int:
    """``data[key]``, which must be an integer > 0 (not a bool)."""
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SpecError(f"{where}.{key}", value, "expected a positive integer")
    return value


def number(data: dict, key: str, where: str, required: bool = False) -> float | None:
    """``data[key]`` as a float, finite and >= 0 (None when absent and not ``required``)."""
    value = data.get(key)
    if value is None and not required:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise SpecError(f"{where}.{key}", value, "expected a finite number >= 0")
    return float(value)


def link_range(gb_per_s: float, field: str, *, pair: bool = True) -> None:
    """A link's GB/s, > 0, must lie in the range :class:`~pipette_cp.specs.cluster.ClusterSpec`
    accepts (a node ``pair`` below it is told to be given as failed)."""
    low, high = MIN_LINK_BYTES_PER_S / GB, MAX_LINK_BYTES_PER_S / GB
    if gb_per_s < low:
        hint = "; give 0 or null for a failed link" if pair else ""
        raise SpecError(field, gb_per_s, f"below {low:g} GB/s{hint}")
    if gb_per_s > high:
        raise SpecError(field, gb_per_s, f"above {high:g} GB/s (a unit mistake?)")


def bandwidth_rows(value: Any, field: str) -> np.ndarray:
    """A square GB/s list of lists -> bytes/s; null = 0 (failed); errors name ``field``.
    A value > 0 must lie in [0.001, 1e6] GB/s (:func:`link_range`)."""
    if not isinstance(value, list) or not value or not all(isinstance(r, list) for r in value):
        raise SpecError(field, value, "expected a non-empty list of rows")
    n = len(value)
    for i, row in enumerate(value):
        if len(row) != n:
            raise SpecError(
                f"{field}[{i}]", f"{len(row)} values", f"the matrix must be square ({n} x {n})"
            )
        for j, x in enumerate(row):
            bad = isinstance(x, bool) or not (x is None or isinstance(x, int | float))
            if bad or (x is not None and (not math.isfinite(x) or x < 0)):
                raise SpecError(f"{field}[{i}][{j}]", x, "expected a finite bandwidth >= 0 or null")
            if x:
                link_range(x, f"{field}[{i}][{j}]")
    return np.array([[0.0 if x is None else x * GB for x in row] for row in value])


def node_gpus(data: dict, n: int, where: str) -> list[GpuSpec]:
    """The GPU of each of the ``n`` nodes, from ``gpu`` or ``node_gpu_types``."""
    if ("gpu" in data) == ("node_gpu_types" in data):
        raise SpecError(where, None, "give exactly one of gpu, node_gpu_types")
    if "gpu" in data:
        return [resolve_gpu(data["gpu"], f"{where}.gpu")] * n
    types = data["node_gpu_types"]
    if not isinstance(types, list) or len(types) != n:
        raise SpecError(f"{where}.node_gpu_types", types, f"expected a list of {n} GPU types")
    specs = [resolve_gpu(t, f"{where}.node_gpu_types[{i}]") for i, t in enumerate(types)]
    for i, s in enumerate(specs):
        if s != next(x for x in specs if x.name == s.name):
            raise SpecError(
                f"{where}.node_gpu_types[{i}]", s.name, "two different GPUs share this name"
            )
    return specs


def expand_gpu_matrix(
    node: np.ndarray, data: dict, gpus: list[GpuSpec], g: int, where: str
) -> np.ndarray:
    """The GPU x GPU matrix of the node matrix ``node`` with each node's intra-node
    bandwidth (``intra_node_bandwidth_gb_per_s``, else its GPU's NVLink)."""
    intra = intra_node_bandwidth(data, gpus, g, where)
    if isinstance(intra, np.ndarray):
        return expand_node_matrix(node, intra, g)
    matrix = expand_node_matrix(node, intra[0], g)
    for k, intra_k in enumerate(intra):
        block = matrix[k * g : (k + 1) * g, k * g : (k + 1) * g]
        block[~np.eye(g, dtype=bool)] = intra_k
    return matrix


def intra_node_bandwidth(
    data: dict, gpus: list[GpuSpec], g: int, where: str
) -> np.ndarray | list[float]:
    """Bytes/s inside a node: the G x G matrix a file gives, or one value per node
    (``intra_node_bandwidth_gb_per_s``, else each node's GPU's NVLink)."""
    key = "intra_node_bandwidth_gb_per_s"
    raw = data.get(key)
    if isinstance(raw, list):
        intra: Any = bandwidth_rows(raw, f"{where}.{key}")
        if intra.shape != (g, g):
            raise SpecError(
                f"{where}.{key}",
                f"{intra.shape[0]}x{intra.shape[0]}",
                f"expected a scalar or {g} x {g}",
            )
        return intra
    value = number(data, key, where)
    if value:
        link_range(value, f"{where}.{key}", pair=False)
    per_node = [value * GB if value is not None else s.nvlink_bandwidth_bytes_per_s for s in gpus]
    if g > 1 and min(per_node) <= 0:
        raise SpecError(f"{where}.{key}", raw, "needed (a GPU type without NVLink)")
    return per_node


def same_node(n: int, g: int) -> np.ndarray:
    """GPU x GPU mask, True where both GPUs are on one node."""
    return np.kron(np.eye(n, dtype=bool), np.ones((g, g), dtype=bool))


def default_names(n: int) -> tuple[str, ...]:
    """``node000``, ``node001``, ... for a file without ``node_names``."""
    width = max(3, len(str(n - 1)))
    return tuple(f"node{i:0{width}d}" for i in range(n))
