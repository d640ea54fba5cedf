"""``pipette-cp solve --snapshots ...``: plans robust over bandwidth snapshots.

The snapshots are cluster files of one cluster measured at different times::

    pipette-cp cluster generate failslow -n 8 --snapshots 4 -o g6.yaml   # g6-t00 .. g6-t03
    pipette-cp solve llama-2-7b-g6-64-t0 --snapshots g6.yaml --quantile 1
    pipette-cp solve llama-2-7b-g6-64-t0 --snapshots g6-t00.yaml --snapshots g6-t01.yaml
    pipette-cp solve llama-2-7b-g6-64-t0 --snapshots g6-t00.yaml,g6-t01.yaml

See :func:`pipette_cp.search.robust.robust_search` for what is optimised.
"""

from __future__ import annotations

import dataclasses
import glob
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from pipette_cp.cli.console import console
from pipette_cp.cli.outputs import instance_path, instance_text, write_atomically
from pipette_cp.cli.progress import search_progress
from pipette_cp.errors import InputFileError, SpecError
from pipette_cp.io.cluster_file import read_cluster_file
from pipette_cp.report.plan_file import plan_document
from pipette_cp.report.plans import plans_table
from pipette_cp.report.robust import robust_json, snapshots_table
from pipette_cp.search.options import SearchOptions
from pipette_cp.search.robust import check_quantile, robust_search, with_cluster
from pipette_cp.specs import Instance

SnapshotsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--snapshots",
        help="Bandwidth snapshots of the cluster (cluster files), to plan for all of them: "
        "repeat the option or separate files with commas; FILE also stands for the "
        "FILE-tNN files of `cluster generate --snapshots K -o FILE`; quoted globs work.",
    ),
]
QuantileOption = Annotated[
    float | None,
    typer.Option(
        "--quantile",
        help="With --snapshots: minimise this quantile of the time over the snapshots "
        "(1 = worst snapshot, 0.5 = median) [default: 1].",
    ),
]


def snapshot_paths(values: Sequence[str]) -> list[Path]:
    """The cluster files named by ``--snapshots`` values, in order.

    Each value is one or more comma-separated items; an item is a file, a glob
    pattern, or the ``-o FILE`` of ``cluster generate --snapshots K`` (its
    ``FILE-tNN`` files, in time order).
    """
    paths: list[Path] = []
    for value in values:
        for item in (part.strip() for part in value.split(",")):
            if not item:
                continue
            path = Path(item)
            if glob.has_magic(item):
                found = sorted(path.parent.glob(path.name))
            elif path.exists():
                found = [path]
            else:
                pattern = f"{glob.escape(path.stem)}-t[0-9][0-9]*{path.suffix or '.yaml'}"
                found = sorted(path.parent.glob(pattern), key=lambda p: (len(p.name), p.name))
            if not found:
                raise InputFileError(
                    item, "no such cluster file (nor FILE-tNN files from `cluster generate`)"
                )
            paths += found
    if not paths:
        raise SpecError("--snapshots", list(values), "expected at least one cluster file")
    return paths


def solve_robust(
    inst: Instance,
    values: Sequence[str],
    quantile: float,
    options: SearchOptions,
    *,
    as_json: bool,
    out: Path | None,
    cluster: Path | None,
    profile: Path | None,
) -> None:
    """Run :func:`~pipette_cp.search.robust.robust_search` with ``options`` and print the
    plans table and the per-snapshot table (or JSON); ``--out`` writes the best plan and,
    next to it, the instance on the plan's quantile snapshot (for ``export`` and ``plot``)."""
    if cluster is not None:
        raise SpecError("--cluster", str(cluster), "give either --cluster or --snapshots")
    q = check_quantile(quantile, "--quantile")
    paths = snapshot_paths(values)
    snapshots = [read_cluster_file(p) for p in paths]
    with search_progress(disable=as_json) as progress:
        reporting = dataclasses.replace(options, progress=progress)
        result = robust_search(inst, snapshots, reporting, quantile=q)
    name = inst.name if out is None else instance_path(out).name
    result.plans = [p.model_copy(update={"instance": name}) for p in result.plans]
    if out is not None:  # the instance on the plan's quantile snapshot, then the plan
        crit = result.critical[0]
        at = instance_path(out)
        on_snapshot = with_cluster(inst, snapshots[crit])
        write_atomically(at, instance_text(on_snapshot, at, paths[crit], profile))
        write_atomically(out, json.dumps(plan_document(result.plans[0]), indent=1) + "\n")
    if as_json:
        typer.echo(json.dumps(robust_json(result), indent=1))
        return
    what = "worst snapshot" if q == 1.0 else f"{q:g}-quantile"
    title = f"Robust plans for {inst.name} ({options.method}; time on the {what} of {len(paths)})"
    console.print(plans_table(result.plans, title))
    console.print(snapshots_table(result))
    s = result.stats
    console.print(
        f"planning matrix: {result.planning.source}; {result.candidates} candidates scored; "
        f"{s.wall_time_s:.1f} s" + (f"; best plan written to {out}" if out else ""),
        highlight=False,
    )
