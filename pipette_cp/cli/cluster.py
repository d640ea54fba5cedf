"""``pipette-cp cluster generate | import``: make cluster files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from pipette_cp.cli.app import app, console
from pipette_cp.clusters.generators import generate, generate_timeline
from pipette_cp.errors import SpecError
from pipette_cp.io.cluster_file import write_cluster_file

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
