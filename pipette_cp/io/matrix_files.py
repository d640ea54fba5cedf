"""Plain CSV node matrices and Pipette's JSON node matrix.

CSV: a header row of names (optionally after a corner cell, then every row
starts with its name), GB/s, an empty cell = failed.  Pipette's JSON
(github.com/yimjinkyu1/date2024_pipette, ``mh_simulated_annealing_opt.py``):
``{"gpus": [node names], "bandwidth": [[GB/s]]}`` - the entries are *nodes*
(its annealer places whole nodes) and the diagonal is the intra-node
bandwidth (it prices the inner data-parallel ring with ``latency[n][n]``).
Both read into a :class:`LabelledMatrix`; :func:`cluster_from_matrix` adds the
other cluster-file fields (:mod:`pipette_cp.io.cluster_file`).
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipette_cp.errors import InputFileError, SpecError
from pipette_cp.io.cluster_file import MATRIX_KEYS, bandwidth_rows, cluster_from_mapping
from pipette_cp.io.files import read_mapping, read_text
from pipette_cp.specs.cluster import MAX_LINK_BYTES_PER_S, MIN_LINK_BYTES_PER_S, ClusterSpec
from pipette_cp.units import GB, MiB

#: The range of a working link in a CSV matrix, GB/s (:class:`ClusterSpec`'s).
_LOW_GB, _HIGH_GB = MIN_LINK_BYTES_PER_S / GB, MAX_LINK_BYTES_PER_S / GB


@dataclass(frozen=True)
class LabelledMatrix:
    """A node x node matrix read from CSV or JSON, bytes/s (0 = failed)."""

    names: tuple[str, ...]
    bandwidth_bytes_per_s: np.ndarray
    intra_node_bytes_per_s: float | None = None


def read_matrix_csv(path: str | Path) -> LabelledMatrix:
    """A node x node CSV matrix in GB/s (module doc); an empty cell = failed."""
    rows = [r for r in csv.reader(io.StringIO(read_text(path))) if any(c.strip() for c in r)]
    if len(rows) < 2:
        raise InputFileError(path, "expected a header row of names and at least one row")
    header = [c.strip() for c in rows[0]]
    labelled = all(r and r[0].strip() and not _is_number(r[0]) for r in rows[1:])
    names = header[1:] if labelled else header
    body = [r[1:] for r in rows[1:]] if labelled else rows[1:]
    if labelled and [r[0].strip() for r in rows[1:]] != names:
        raise InputFileError(path, "row names differ from the column names")
    if len(body) != len(names) or any(len(r) != len(names) for r in body):
        raise InputFileError(
            path,
            f"matrix is not square: {len(names)} names, {len(body)} rows, row lengths {sorted({len(r) for r in body})}",
        )
    matrix = np.zeros((len(names), len(names)))
    for i, row in enumerate(body):
        for j, cell in enumerate(row):
            try:
                value = float(cell) if cell.strip() else 0.0
            except ValueError:
                raise InputFileError(
                    path, f"row {i + 2} column {j + 1}: {cell!r} is not a number"
                ) from None
            if not math.isfinite(value) or value < 0:
                raise InputFileError(
                    path, f"row {i + 2} column {j + 1}: {cell!r} must be finite and >= 0"
                )
            if i != j and (0 < value < _LOW_GB or value > _HIGH_GB):
                raise InputFileError(
                    path,
                    f"row {i + 2} column {j + 1}: {cell!r} must be empty or 0 (failed) or "
                    f"in [{_LOW_GB:g}, {_HIGH_GB:g}] GB/s",
                )
            matrix[i, j] = value * GB
    np.fill_diagonal(matrix, 0.0)
    return LabelledMatrix(tuple(names), matrix)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def write_matrix_csv(matrix: LabelledMatrix, path: str | Path, decimals: int = 3) -> None:
    """Write a labelled node matrix as CSV (GB/s; failed pairs and diagonal empty)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["node", *matrix.names])
    for i, name in enumerate(matrix.names):
        values = matrix.bandwidth_bytes_per_s[i]
        writer.writerow(
            [
                name,
                *(
                    "" if i == j or v <= 0 else round(v / GB, decimals)
                    for j, v in enumerate(values)
                ),
            ]
        )
    Path(path).write_text(out.getvalue(), encoding="utf-8")


def read_pipette_json(path: str | Path) -> LabelledMatrix:
    """Pipette's node matrix (module doc).  Also reads Pipette's mpiGraph JSON
    ``{"0": {receive matrix}, "1": {send matrix}}`` in mpiGraph MB/s (MiB/s; row =
    receiver in "0"), using "0" as Pipette does; its diagonal is a placeholder."""
    data = read_mapping(path)
    mpigraph = "gpus" not in data and "0" in data
    block = data["0"] if mpigraph else data
    if not isinstance(block, dict) or not {"gpus", "bandwidth"} <= set(block):
        raise InputFileError(path, 'expected {"gpus": [...], "bandwidth": [[...]]}')
    try:
        matrix = bandwidth_rows(block["bandwidth"], "bandwidth")
    except SpecError as exc:
        raise InputFileError(path, str(exc)) from None
    names = [str(x) for x in block["gpus"]]
    if len(names) != matrix.shape[0]:
        raise InputFileError(path, f"{len(names)} names for a {matrix.shape[0]}-row matrix")
    if mpigraph:  # MiB/s, and [receiver][sender] -> [sender][receiver]
        matrix = matrix.T / GB * MiB
    diag = np.diagonal(matrix).copy()
    np.fill_diagonal(matrix, 0.0)
    intra = float(np.median(diag)) if not mpigraph and (diag > 0).all() else None
    return LabelledMatrix(tuple(names), matrix, intra)


def write_pipette_json(cluster: ClusterSpec, path: str | Path) -> None:
    """Pipette's JSON of ``cluster``: node matrix in GB/s, mean intra-node on the diagonal."""
    body = {"gpus": list(cluster.node_names), "bandwidth": (cluster.node_matrix() / GB).tolist()}
    Path(path).write_text(json.dumps(body), encoding="utf-8")


def cluster_from_matrix(
    matrix: LabelledMatrix, settings: dict[str, Any], where: str = "cluster"
) -> ClusterSpec:
    """A cluster from a node matrix plus the other cluster-file fields (``gpu``,
    ``gpus_per_node``, ...) in ``settings``; the matrix's own intra-node value is
    used unless ``settings`` gives one."""
    data = {k: v for k, v in settings.items() if k not in MATRIX_KEYS}
    data["node_names"] = list(matrix.names)
    data["node_bandwidth_gb_per_s"] = (matrix.bandwidth_bytes_per_s / GB).tolist()
    if matrix.intra_node_bytes_per_s is not None:
        data.setdefault("intra_node_bandwidth_gb_per_s", matrix.intra_node_bytes_per_s / GB)
    return cluster_from_mapping(data, where)
