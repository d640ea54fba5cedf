"""``pipette-cp cluster import nccl-tests | mpigraph | pipette-json | csv``: measurements in.

The sub-group is :data:`import_app`; :mod:`pipette_cp.cli.cluster.commands` mounts it as
``cluster import``.  Each command reads one measurement format (pairwise nccl-tests
logs, mpiGraph output, Pipette's JSON matrix, a CSV matrix), fills in what the format
does not say (GPU type, NICs, intra-node bandwidth) from its options and writes a
cluster file with :func:`write_and_report`, which ``cluster generate`` shares.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from pipette_cp.cli.console import console, err_console
from pipette_cp.errors import SpecError
from pipette_cp.io.cluster_file import write_cluster_file
from pipette_cp.io.fabric_file import INLINE_EXCEPTIONS_MAX, exception_count, fabric_summary
from pipette_cp.io.matrix_files import (
    LabelledMatrix,
    cluster_from_matrix,
    read_matrix_csv,
    read_pipette_json,
)
from pipette_cp.io.measurements.fabric_import import fabric_from_dense, levels_option
from pipette_cp.io.measurements.mpigraph import read_mpigraph
from pipette_cp.io.measurements.nccl_pairwise import import_nccl_tests_dir
from pipette_cp.io.output_paths import check_output_file, output_error
from pipette_cp.specs import ClusterSpec, resolve_gpu
from pipette_cp.units import GB

import_app = typer.Typer(no_args_is_help=True, help="Convert measurements into a cluster file.")


def write_and_report(cluster: ClusterSpec, out: Path) -> None:
    """Write ``cluster`` to ``out`` and print what was written (a fabric's summary too)."""
    check_output_file(out, "--out")
    try:
        write_cluster_file(cluster, out)
    except OSError as exc:
        raise output_error("--out", out, exc) from None
    extra = ""
    if cluster.fabric is not None:
        sidecar = out.with_name(out.stem + ".npz")
        where = f" in {sidecar}" if exception_count(cluster.fabric) > INLINE_EXCEPTIONS_MAX else ""
        extra = f"; {fabric_summary(cluster.fabric)}{where}"
    console.print(f"wrote {out} ({cluster.describe()}{extra})", highlight=False, soft_wrap=True)


_OUT = typer.Option("--out", "-o", help="Cluster file to write.")
_GPU = typer.Option("--gpu", help="GPU type (catalogue name); the file does not say.")
_GPN = typer.Option("--gpus-per-node", help="GPUs per node.")
_NICS = typer.Option("--nics-per-node", help="Inter-node NICs per node [default: one per GPU].")
_NIC_BW = typer.Option(
    "--nic-gb-per-s", help="One NIC's bandwidth under load [default: median pair]."
)
_INTRA = typer.Option(
    "--intra-gb-per-s", help="Intra-node GPU pair bandwidth [default: NVLink of --gpu]."
)


def _settings(
    matrix: LabelledMatrix,
    gpu: str,
    gpus_per_node: int,
    nics: int | None,
    nic_gb: float | None,
    intra_gb: float | None,
    source: str,
) -> dict[str, Any]:
    spec = resolve_gpu(gpu, "--gpu")
    values = matrix.bandwidth_bytes_per_s[~np.eye(len(matrix.names), dtype=bool)]
    alive = values[values > 0]
    if nic_gb is None and not alive.size:  # e.g. one node: no pair to take a median of
        raise SpecError("--nic-gb-per-s", None, "needed: the matrix has no live inter-node pair")
    median_gb = float(np.median(alive)) / GB if alive.size else 1.0
    settings: dict[str, Any] = {
        "name": Path(source).stem,
        "source": source,
        "gpu": spec.name,
        "gpus_per_node": gpus_per_node,
        "nics_per_node": nics or gpus_per_node,
        "nic_bandwidth_gb_per_s": nic_gb or median_gb,
    }
    if intra_gb is not None or matrix.intra_node_bytes_per_s is None:
        settings["intra_node_bandwidth_gb_per_s"] = (
            intra_gb or spec.nvlink_bandwidth_bytes_per_s / GB
        )
    return settings


@import_app.command("nccl-tests")
def import_nccl_tests(
    directory: Annotated[
        Path, typer.Argument(help="Directory of nccl_N2_G<g>_<nodeA>_<nodeB>.log files.")
    ],
    out: Annotated[Path, _OUT],
    gpus_per_test: Annotated[
        int, typer.Option(help="Which G of the pairwise runs to read (1 = one stream).")
    ] = 1,
    single_node: Annotated[
        Path | None,
        typer.Option(help="Directory of single-node logs, for the intra-node bandwidth."),
    ] = None,
    gpu: Annotated[
        str | None, typer.Option("--gpu", help="GPU type [default: from the logs].")
    ] = None,
    gpus_per_node: Annotated[int | None, _GPN] = None,
    nics_per_node: Annotated[int | None, _NICS] = None,
    intra_gb_per_s: Annotated[float | None, _INTRA] = None,
    fabric: Annotated[
        str | None,
        typer.Option(
            "--fabric",
            help="Write switch levels plus exceptions instead of the matrix: LEVELS.yaml "
            "(levels: [...]) or name:nodes[@GB/s],... in node-name order, e.g. leaf:8,spine "
            "(a level without GB/s: the median of its measured pairs).",
        ),
    ] = None,
    tolerance: Annotated[
        float,
        typer.Option(
            help="--fabric: a pair further than this share off its level "
            "(and NICs) is an exception."
        ),
    ] = 0.1,
    unmeasured: Annotated[
        str,
        typer.Option(
            help="Node pairs no log measures (no log, unreadable, cut off before a row): "
            "refuse, failed (no traffic between them) or median (the median pair)."
        ),
    ] = "refuse",
) -> None:
    """Convert pairwise nccl-tests logs (sendrecv_perf) into a cluster file, saying what
    was done with every log (read, skipped, cut off, failed) and where each figure comes
    from."""
    check_output_file(out, "--out")  # before reading the logs
    if unmeasured not in ("refuse", "failed", "median"):
        raise SpecError("--unmeasured", unmeasured, "expected refuse, failed or median")
    cluster, report = import_nccl_tests_dir(
        directory,
        gpus_per_test=gpus_per_test,
        single_node_dir=single_node,
        gpu=gpu,
        gpus_per_node=gpus_per_node,
        nics_per_node=nics_per_node,
        intra_node_bytes_per_s=intra_gb_per_s * GB if intra_gb_per_s else None,
        unmeasured=unmeasured,  # type: ignore[arg-type]
    )
    for line in report.lines():
        err_console.print(line, highlight=False, soft_wrap=True, markup=False)
    if fabric is not None:
        levels = levels_option(fabric, cluster.num_nodes, cluster.inter_node_latency_s)
        cluster = fabric_from_dense(cluster, levels, tolerance=tolerance)
    write_and_report(cluster, out)


@import_app.command("mpigraph")
def import_mpigraph(
    path: Annotated[Path, typer.Argument(help="mpiGraph standard output.")],
    out: Annotated[Path, _OUT],
    gpu: Annotated[str, _GPU],
    gpus_per_node: Annotated[int, _GPN] = 8,
    nics_per_node: Annotated[int | None, _NICS] = None,
    nic_gb_per_s: Annotated[float | None, _NIC_BW] = None,
    intra_gb_per_s: Annotated[float | None, _INTRA] = None,
    direction: Annotated[
        str, typer.Option(help="Table to read: 'recv' (as Pipette) or 'send'.")
    ] = "recv",
) -> None:
    """Convert mpiGraph output (node pairs) into a cluster file."""
    if direction not in ("recv", "send"):
        raise SpecError("--direction", direction, "expected 'recv' or 'send'")

    def read(p: Path) -> LabelledMatrix:
        result = read_mpigraph(p)
        return LabelledMatrix(result.node_names, result.node_matrix(direction))  # type: ignore[arg-type]

    _import_matrix(read, path, out, gpu, gpus_per_node, nics_per_node, nic_gb_per_s, intra_gb_per_s)


def _import_matrix(
    reader: Callable[[Path], LabelledMatrix],
    path: Path,
    out: Path,
    gpu: str,
    gpus_per_node: int,
    nics_per_node: int | None,
    nic_gb_per_s: float | None,
    intra_gb_per_s: float | None,
) -> None:
    matrix = reader(path)
    settings = _settings(
        matrix, gpu, gpus_per_node, nics_per_node, nic_gb_per_s, intra_gb_per_s, str(path)
    )
    write_and_report(cluster_from_matrix(matrix, settings), out)


def _matrix_import(
    reader: Callable[[Path], LabelledMatrix], path_argument: Any, doc: str
) -> Callable[..., None]:
    """An ``import`` command for the node x node matrix files ``reader`` reads.

    ``path_argument`` (a ``typer.Argument``) is the file's default, not part of an
    annotation: annotations are strings, looked up among this module's names."""

    def command(
        out: Annotated[Path, _OUT],
        gpu: Annotated[str, _GPU],
        path: Path = path_argument,
        gpus_per_node: Annotated[int, _GPN] = 8,
        nics_per_node: Annotated[int | None, _NICS] = None,
        nic_gb_per_s: Annotated[float | None, _NIC_BW] = None,
        intra_gb_per_s: Annotated[float | None, _INTRA] = None,
    ) -> None:
        _import_matrix(
            reader, path, out, gpu, gpus_per_node, nics_per_node, nic_gb_per_s, intra_gb_per_s
        )

    command.__doc__ = doc
    return command


import_pipette_json = import_app.command("pipette-json")(
    _matrix_import(
        read_pipette_json,
        typer.Argument(help='Pipette\'s {"gpus": [...], "bandwidth": [[GB/s]]} file.'),
        "Convert Pipette's node x node JSON matrix (GB/s) into a cluster file.",
    )
)
import_csv = import_app.command("csv")(
    _matrix_import(
        read_matrix_csv,
        typer.Argument(help="Square CSV, header row of node names, GB/s, empty = failed."),
        "Convert a node x node CSV matrix (GB/s) into a cluster file.",
    )
)
