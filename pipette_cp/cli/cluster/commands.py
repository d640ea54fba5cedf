"""``pipette-cp cluster generate | import | measure-plan | compare``: cluster files.

The group is :data:`cluster_app` (``import`` is its sub-group
:data:`~pipette_cp.cli.cluster.imports.import_app`, in :mod:`pipette_cp.cli.cluster.imports`);
:mod:`pipette_cp.cli.app` mounts it as ``cluster``.
"""

from __future__ import annotations

import difflib
import json
import textwrap
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.table import Table
from typer.core import TyperCommand

from pipette_cp.cli.cluster.imports import (
    import_app,
    import_csv,
    import_mpigraph,
    import_nccl_tests,
    import_pipette_json,
)
from pipette_cp.cli.cluster.imports import write_and_report as _write
from pipette_cp.cli.console import console
from pipette_cp.clusters.compare import DriftReport, compare_clusters
from pipette_cp.clusters.generators.help import (
    Parameter,
    accepted_keys,
    generator_kind,
    generator_parameters,
)
from pipette_cp.clusters.generators.params import integer
from pipette_cp.clusters.generators.registry import generate, generate_timeline
from pipette_cp.errors import SpecError
from pipette_cp.io.cluster_file import read_cluster_file
from pipette_cp.io.files import read_mapping
from pipette_cp.io.instance_file import load_instance
from pipette_cp.io.measurements.fabric_import import dense_twin
from pipette_cp.io.measurements.measure_script import (
    import_command,
    plan_measurement,
    read_hostfile,
    write_measure_plan,
)
from pipette_cp.io.measurements.nccl_pairwise import convert_nccl_tests_dir
from pipette_cp.io.output_paths import check_output_dir, check_output_file
from pipette_cp.specs import ClusterSpec
from pipette_cp.units import GB

__all__ = [
    "cluster_app",
    "compare_cmd",
    "generate_cmd",
    "import_app",
    "import_csv",
    "import_mpigraph",
    "import_nccl_tests",
    "import_pipette_json",
    "load_cluster",
    "measure_plan_cmd",
]

cluster_app = typer.Typer(
    no_args_is_help=True,
    help="Generate, import, measure or compare cluster bandwidth files.",
)
cluster_app.add_typer(import_app, name="import")


def _params(items: list[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise SpecError("--set", item, "expected KEY=VALUE, e.g. --set oversubscription=7")
        params[key.strip().replace("-", "_")] = yaml.safe_load(raw)
    return params


#: The options of ``cluster generate`` that set what ``--set`` might otherwise name.
_OPTION_KEYS = {"nodes": "--nodes", "gpus": "--gpus", "seed": "--seed", "snapshots": "--snapshots"}
_RAW_ARGS = "pipette_cp.cluster_generate.args"


def _parameter_lines(params: list[Parameter], width: int) -> list[str]:
    """``name  default  description`` per parameter, the description wrapped to ``width``
    (under the name when the columns would leave it under 30 characters)."""
    name_w = max(len(p.name) for p in params)
    text_w = max(len(p.text) for p in params)
    left = 2 + name_w + 2 + text_w + 2
    lines: list[str] = []
    for p in params:
        about = f"{p.description} [{p.note}]" if p.note else p.description
        head = f"  {p.name:<{name_w}}  {p.text:<{text_w}}  "
        if width - left >= 30:
            wrapped = textwrap.wrap(about, width - left) or [""]
            lines.append(head + wrapped[0])
            lines.extend(" " * left + line for line in wrapped[1:])
        else:
            lines.append(f"  {p.name}  {p.text}")
            lines.extend(textwrap.wrap(about, width, initial_indent=" " * 6,
                                       subsequent_indent=" " * 6))  # fmt: skip
    return lines


class _GenerateCommand(TyperCommand):
    """``cluster generate``: ``KIND --help`` also lists that generator's ``--set``
    parameters (:func:`~pipette_cp.clusters.generators.help.generator_parameters`)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        ctx.meta[_RAW_ARGS] = list(args)  # --help acts before KIND is processed
        return super().parse_args(ctx, args)

    def _kind(self, ctx: Any) -> str | None:
        try:  # the KIND among the raw arguments, as the parser would place it
            opts, _, _ = self.make_parser(ctx).parse_args(list(ctx.meta.get(_RAW_ARGS, [])))
        except Exception:  # a malformed command line: the plain help
            return None
        kind = opts.get("kind")
        return kind if isinstance(kind, str) else None

    def format_help(self, ctx: Any, formatter: Any) -> None:
        kind = self._kind(ctx)
        params = generator_parameters(kind) if kind else None  # unknown: one line, no help
        super().format_help(ctx, formatter)  # rich: printed now; plain: into formatter
        formatter.write("\n")
        if kind is None or params is None:
            formatter.write("Give a KIND before --help to list its parameters "
                            "(see `pipette-cp list generators`).\n")  # fmt: skip
            return
        width = max(formatter.width, 40)
        formatter.write(f"Parameters of {generator_kind(kind)} (--set KEY=VALUE):\n")
        formatter.write("".join(f"{line}\n" for line in _parameter_lines(params, width)))
        note = ("Values are read as YAML (null: none). Not parameters: nodes (--nodes or "
                "--gpus) and seed (--seed).")  # fmt: skip
        formatter.write("\n" + textwrap.fill(note, width) + "\n")


def _check_keys(kind: str, params: dict[str, Any]) -> None:
    """Refuse ``--set`` keys that are options or no parameter of ``kind``."""
    known = accepted_keys(kind)
    for key, value in params.items():
        if key in _OPTION_KEYS:
            raise SpecError(
                f"--set {key}", value, f"not a generator parameter; use {_OPTION_KEYS[key]}"
            )
        if key not in known:
            name = generator_kind(kind)
            starts = sorted(k for k in known if k.startswith(key))
            close = starts or difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.5)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise SpecError(f"{name}.{key}", value, f"unknown parameter{hint}; "
                            f"`pipette-cp cluster generate {name} --help` lists them")  # fmt: skip


@cluster_app.command("generate", cls=_GenerateCommand)
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
        list[str] | None,
        typer.Option("--set", help="Generator parameter KEY=VALUE (KIND --help lists them)."),
    ] = None,
) -> None:
    """Write a seeded synthetic cluster (G1-G7; fat-tree: a fabric of any size)."""
    check_output_file(out, "--out")  # before generating
    params = _params(set_ or [])
    _check_keys(kind, params)
    if "gpus_per_node" in params:  # --set gpus_per_node=N: as --gpus-per-node N
        if gpus_per_node is not None:
            raise SpecError("--set gpus_per_node", params["gpus_per_node"],
                            "given twice: also --gpus-per-node")  # fmt: skip
        gpus_per_node = integer("gpus_per_node", params.pop("gpus_per_node"), 1)
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
    check_output_dir(out, "--out")
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
