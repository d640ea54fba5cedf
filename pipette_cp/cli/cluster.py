"""``pipette-cp cluster generate | import``: make cluster files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
import yaml

from pipette_cp.cli.app import app, console
from pipette_cp.clusters.generators import generate, generate_timeline
from pipette_cp.errors import SpecError
from pipette_cp.io.cluster_file import write_cluster_file
from pipette_cp.io.matrix_files import (
    LabelledMatrix,
    cluster_from_matrix,
    read_matrix_csv,
    read_pipette_json,
)
from pipette_cp.io.mpigraph import read_mpigraph
from pipette_cp.io.nccl_pairwise import convert_nccl_tests_dir
from pipette_cp.specs import ClusterSpec, resolve_gpu
from pipette_cp.units import GB

cluster_app = typer.Typer(no_args_is_help=True, help="Generate or import cluster bandwidth files.")
app.add_typer(cluster_app, name="cluster")

import_app = typer.Typer(no_args_is_help=True, help="Convert measurements into a cluster file.")
cluster_app.add_typer(import_app, name="import")


def _params(items: list[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise SpecError("--set", item, "expected KEY=VALUE, e.g. --set oversubscription=7")
        params[key.strip().replace("-", "_")] = yaml.safe_load(raw)
    return params


@cluster_app.command("generate")
def generate_cmd(
    kind: Annotated[str, typer.Argument(help="Generator: see `pipette-cp list generators`.")],
    nodes: Annotated[int, typer.Option("--nodes", "-n", help="Number of nodes.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Cluster file to write (YAML).")],
    seed: Annotated[int, typer.Option("--seed", "-s", help="Random seed.")] = 0,
    gpus_per_node: Annotated[
        int | None, typer.Option(help="GPUs per node (generator default if omitted).")
    ] = None,
    snapshots: Annotated[
        int,
        typer.Option(help="Timeline generators: number of snapshots (files OUT-t00.yaml, ...)."),
    ] = 1,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Generator parameter KEY=VALUE.")
    ] = None,
) -> None:
    """Write a seeded synthetic cluster (G1-G6 of DESIGN.md section 5)."""
    params = _params(set_ or [])
    if snapshots > 1:
        timeline = generate_timeline(
            kind, nodes=nodes, seed=seed, snapshots=snapshots, gpus_per_node=gpus_per_node, **params
        )
        for t, cluster in enumerate(timeline):
            path = out.with_name(f"{out.stem}-t{t:02d}{out.suffix or '.yaml'}")
            write_cluster_file(cluster, path)
            console.print(f"wrote {path} ({cluster.describe()})", highlight=False)
        return
    cluster = generate(kind, nodes=nodes, seed=seed, gpus_per_node=gpus_per_node, **params)
    write_cluster_file(cluster, out)
    console.print(f"wrote {out} ({cluster.describe()})", highlight=False)


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


def _write(cluster: ClusterSpec, out: Path) -> None:
    write_cluster_file(cluster, out)
    console.print(f"wrote {out} ({cluster.describe()})", highlight=False)


@import_app.command("nccl-tests")
def import_nccl_tests(
    directory: Annotated[
        Path, typer.Argument(help="Directory of nccl_N2_G<g>_<nodeA>_<nodeB>.log files.")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Cluster file to write.")],
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
) -> None:
    """Convert pairwise nccl-tests logs (sendrecv_perf) into a cluster file."""
    cluster = convert_nccl_tests_dir(
        directory,
        gpus_per_test=gpus_per_test,
        single_node_dir=single_node,
        gpu=gpu,
        gpus_per_node=gpus_per_node,
        nics_per_node=nics_per_node,
        intra_node_bytes_per_s=intra_gb_per_s * GB if intra_gb_per_s else None,
    )
    _write(cluster, out)


@import_app.command("mpigraph")
def import_mpigraph(
    path: Annotated[Path, typer.Argument(help="mpiGraph standard output.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Cluster file to write.")],
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
    reader: Any,
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
    _write(cluster_from_matrix(matrix, settings), out)


@import_app.command("pipette-json")
def import_pipette_json(
    path: Annotated[
        Path, typer.Argument(help='Pipette\'s {"gpus": [...], "bandwidth": [[GB/s]]} file.')
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Cluster file to write.")],
    gpu: Annotated[str, _GPU],
    gpus_per_node: Annotated[int, _GPN] = 8,
    nics_per_node: Annotated[int | None, _NICS] = None,
    nic_gb_per_s: Annotated[float | None, _NIC_BW] = None,
    intra_gb_per_s: Annotated[float | None, _INTRA] = None,
) -> None:
    """Convert Pipette's node x node JSON matrix (GB/s) into a cluster file."""
    _import_matrix(
        read_pipette_json,
        path,
        out,
        gpu,
        gpus_per_node,
        nics_per_node,
        nic_gb_per_s,
        intra_gb_per_s,
    )


@import_app.command("csv")
def import_csv(
    path: Annotated[
        Path, typer.Argument(help="Square CSV, header row of node names, GB/s, empty = failed.")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Cluster file to write.")],
    gpu: Annotated[str, _GPU],
    gpus_per_node: Annotated[int, _GPN] = 8,
    nics_per_node: Annotated[int | None, _NICS] = None,
    nic_gb_per_s: Annotated[float | None, _NIC_BW] = None,
    intra_gb_per_s: Annotated[float | None, _INTRA] = None,
) -> None:
    """Convert a node x node CSV matrix (GB/s) into a cluster file."""
    _import_matrix(
        read_matrix_csv, path, out, gpu, gpus_per_node, nics_per_node, nic_gb_per_s, intra_gb_per_s
    )
