"""``pipette-cp cluster generate | import | measure-plan | compare``: cluster files.

The group is :data:`cluster_app` (``import`` is its sub-group :data:`import_app`);
:mod:`pipette_cp.cli.app` mounts it as ``cluster``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
import yaml
from rich.table import Table

from pipette_cp.cli.console import console
from pipette_cp.clusters.compare import DriftReport, compare_clusters
from pipette_cp.clusters.generators import generate, generate_timeline
from pipette_cp.errors import SpecError
from pipette_cp.io.cluster_file import read_cluster_file, write_cluster_file
from pipette_cp.io.fabric_file import INLINE_EXCEPTIONS_MAX, exception_count, fabric_summary
from pipette_cp.io.fabric_import import dense_twin, fabric_from_dense, levels_option
from pipette_cp.io.files import read_mapping
from pipette_cp.io.instance_file import load_instance
from pipette_cp.io.matrix_files import (
    LabelledMatrix,
    cluster_from_matrix,
    read_matrix_csv,
    read_pipette_json,
)
from pipette_cp.io.measure_plan import (
    import_command,
    plan_measurement,
    read_hostfile,
    write_measure_plan,
)
from pipette_cp.io.mpigraph import read_mpigraph
from pipette_cp.io.nccl_pairwise import convert_nccl_tests_dir
from pipette_cp.specs import ClusterSpec, resolve_gpu
from pipette_cp.units import GB

cluster_app = typer.Typer(
    no_args_is_help=True,
    help="Generate, import, measure or compare cluster bandwidth files.",
)

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
    out: Annotated[Path, typer.Option("--out", "-o", help="Cluster file to write (YAML).")],
    nodes: Annotated[
        int | None, typer.Option("--nodes", "-n", help="Number of nodes (or give --gpus).")
    ] = None,
    gpus: Annotated[
        int | None, typer.Option("--gpus", help="Number of GPUs, instead of --nodes.")
    ] = None,
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
    """Write a seeded synthetic cluster (G1-G7; fat-tree: a fabric of any size)."""
    params = _params(set_ or [])
    if gpus is not None:
        params["gpus"] = gpus
    if snapshots > 1:
        if nodes is None:
            raise SpecError("--nodes", None, "a timeline (--snapshots) needs --nodes")
        timeline = generate_timeline(
            kind, nodes=nodes, seed=seed, snapshots=snapshots, gpus_per_node=gpus_per_node, **params
        )
        for t, cluster in enumerate(timeline):
            _write(cluster, out.with_name(f"{out.stem}-t{t:02d}{out.suffix or '.yaml'}"))
        return
    _write(generate(kind, nodes=nodes, seed=seed, gpus_per_node=gpus_per_node, **params), out)


def _write(cluster: ClusterSpec, out: Path) -> None:
    write_cluster_file(cluster, out)
    extra = ""
    if cluster.fabric is not None:
        sidecar = out.with_name(out.stem + ".npz")
        where = f" in {sidecar}" if exception_count(cluster.fabric) > INLINE_EXCEPTIONS_MAX else ""
        extra = f"; {fabric_summary(cluster.fabric)}{where}"
    console.print(f"wrote {out} ({cluster.describe()}{extra})", highlight=False, soft_wrap=True)


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
    if fabric is not None:
        levels = levels_option(fabric, cluster.num_nodes, cluster.inter_node_latency_s)
        cluster = fabric_from_dense(cluster, levels, tolerance=tolerance)
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
    _write(cluster_from_matrix(matrix, settings), out)


def _matrix_import(
    reader: Callable[[Path], LabelledMatrix], path_argument: Any, doc: str
) -> Callable[..., None]:
    """An ``import`` command for the node x node matrix files ``reader`` reads.

    ``path_argument`` (a ``typer.Argument``) is the file's default, not part of an
    annotation: annotations are strings, looked up among this module's names."""

    def command(
        out: Annotated[Path, typer.Option("--out", "-o", help="Cluster file to write.")],
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


# ------------------------------------------------------------ measure-plan, compare
def _csv(text: str, field: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise SpecError(field, text, "expected a comma-separated list")
    return items


@cluster_app.command("measure-plan")
def measure_plan_cmd(
    hostfile: Annotated[
        Path, typer.Option(help="One host per line: 'host', 'host slots=8' or 'host:8'.")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for measure.sh.")],
    gpus_per_node: Annotated[
        int | None, typer.Option(help="GPUs per node [default: the hostfile's slots, else 8].")
    ] = None,
    tool: Annotated[str, typer.Option(help="'nccl-tests' (node pairs) or 'mpigraph'.")] = (
        "nccl-tests"
    ),
    launcher: Annotated[str, typer.Option(help="'slurm' (srun) or 'mpirun' (Open MPI).")] = (
        "slurm"
    ),
    collectives: Annotated[
        str, typer.Option(help="nccl-tests binaries per pair, e.g. sendrecv,alltoall.")
    ] = "sendrecv",
    gpus_per_test: Annotated[
        str, typer.Option(help="GPUs per node of the pair runs, e.g. 1,8 (import reads G=1).")
    ] = "1",
    single_node: Annotated[
        bool, typer.Option(help="Also run each node alone with all its GPUs (intra-node).")
    ] = True,
) -> None:
    """Write a bash script that measures every node pair (rounds of disjoint pairs)."""
    gs = []
    for item in _csv(gpus_per_test, "--gpus-per-test"):
        if not item.isdigit():
            raise SpecError("--gpus-per-test", item, "expected positive integers, e.g. 1,8")
        gs.append(int(item))
    plan = plan_measurement(
        read_hostfile(hostfile),
        gpus_per_node=gpus_per_node,
        tool=tool,
        launcher=launcher,
        collectives=_csv(collectives, "--collectives"),
        gpus_per_test=gs,
        single_node=single_node,
    )
    path = write_measure_plan(plan, out)
    n = len(plan.hosts)
    if plan.tool == "mpigraph":
        summary = f"one mpiGraph run over {n} nodes"
    else:
        summary = (
            f"{n} nodes, {len(plan.rounds)} rounds, {plan.num_pairs} node pairs, "
            f"{plan.num_tests} nccl-tests runs ({', '.join(plan.collectives)})"
        )
    console.print(f"wrote {path}: {summary}", highlight=False, soft_wrap=True)
    console.print(f"next: bash {path} (on the cluster), then", highlight=False, soft_wrap=True)
    console.print(
        "  " + import_command(plan, str(path.parent / "logs")), highlight=False, soft_wrap=True
    )


def load_cluster(source: str) -> ClusterSpec:
    """A cluster from a cluster file, a directory of nccl-tests logs, an instance file
    or a bundled instance name (as ``pipette-cp show`` tells them apart)."""
    path = Path(source)
    if path.is_dir():
        return convert_nccl_tests_dir(path)
    if path.is_file() and str(read_mapping(path).get("format", "")).startswith(
        "pipette-cp-cluster"
    ):
        return read_cluster_file(path)
    return load_instance(source).cluster


def _gb(value: float) -> str:
    return f"{value / GB:.2f}" if value > 0 else "failed"


def _drift_table(report: DriftReport, cluster: ClusterSpec) -> Table:
    g = cluster.gpus_per_node
    table = Table(title=f"Largest changes ({report.cluster_a} -> {report.cluster_b})")
    for column in ("GPU pair", "A GB/s", "B GB/s", "change", "slowest 10 %"):
        table.add_column(column, justify="left" if column == "GPU pair" else "right")
    for c in report.largest_changes:
        rel = c.relative_change
        table.add_row(
            f"{c.src_node}:{c.src_gpu % g} -> {c.dst_node}:{c.dst_gpu % g}",
            _gb(c.before_bytes_per_s),
            _gb(c.after_bytes_per_s),
            "recovered" if rel is None else f"{rel:+.1%}",
            "yes" if c.slowest_decile else "",
        )
    return table


@cluster_app.command("compare")
def compare_cmd(
    a: Annotated[str, typer.Argument(help="The measurement the plan was made for.")],
    b: Annotated[str, typer.Argument(help="A newer measurement of the same cluster.")],
    threshold: Annotated[
        float, typer.Option(help="Relative change that counts (0.2 = 20 %).")
    ] = 0.2,
    top: Annotated[int, typer.Option(help="Rows of the largest-changes table.")] = 10,
    by_position: Annotated[
        bool, typer.Option(help="Match nodes by position, not by name (hosts renamed).")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Bandwidth drift between two measurements; says whether to re-plan.

    A and B: cluster files, nccl-tests log directories, instance files or names."""
    first, second = dense_twin(load_cluster(a)), dense_twin(load_cluster(b))
    report = compare_clusters(first, second, threshold=threshold, top=top, by_name=not by_position)
    if as_json:
        typer.echo(json.dumps({**report.model_dump(mode="json"), "verdict": report.verdict}))
        return
    r = report
    corr = "n/a" if r.correlation is None else f"{r.correlation:.3f}"
    lines = [
        f"GPU pairs changed > {r.threshold:.0%}: {r.gpu_pairs_changed} of {r.gpu_pairs}",
        f"node pairs changed > {r.threshold:.0%}: {r.node_pairs_changed} of {r.node_pairs}",
        f"correlation of node-pair bandwidths: {corr}",
        f"new failures: {r.new_failed_gpu_pairs} GPU pairs"
        + "".join(f"\n  {x} - {y}" for x, y in r.new_failures),
        f"recovered: {r.recovered_gpu_pairs} GPU pairs"
        + "".join(f"\n  {x} - {y}" for x, y in r.recovered),
    ]
    console.print("\n".join(lines), highlight=False, soft_wrap=True)
    if r.largest_changes:
        console.print(_drift_table(r, first))
    style = "bold red" if r.replan_recommended else "bold green"
    console.print(r.verdict, style=style, highlight=False, soft_wrap=True)
