"""``pipette-cp solve``: the main job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from pipette_cp.api import solve_with_stats
from pipette_cp.cli.console import console
from pipette_cp.cli.options import (
    NO_REPLACEMENTS,
    InstanceArgument,
    Replacements,
    instance_options,
    resolve_instance,
)
from pipette_cp.cli.progress import search_progress
from pipette_cp.cli.robust import QuantileOption, SnapshotsOption, solve_robust
from pipette_cp.errors import SpecError
from pipette_cp.io.cluster_file import cluster_to_mapping
from pipette_cp.io.files import write_yaml
from pipette_cp.io.instance_file import DEFAULT_INSTANCE
from pipette_cp.report.plans import plans_json, plans_table
from pipette_cp.solvers import METHODS
from pipette_cp.specs import Instance, SearchSpace, validate_spec


def _ints(option: str, text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise SpecError(option, text, "expected comma-separated integers, e.g. 1,2,4") from None


def _override(space: SearchSpace, **lists: tuple | None) -> SearchSpace:
    update = {k: v for k, v in lists.items() if v is not None}
    if not update:
        return space
    return validate_spec(SearchSpace, {**space.model_dump(), **update}, "search_space")


@instance_options
def solve(
    instance: InstanceArgument = DEFAULT_INSTANCE,
    top: Annotated[int, typer.Option("--top", help="Plans to show.")] = 5,
    time_limit: Annotated[
        float | None,
        typer.Option(
            "--time-limit", help="Total wall-clock budget, s [default: 0.12 s per GPU, 8-540 s]."
        ),
    ] = None,
    method: Annotated[str, typer.Option(help="Split/placement method.")] = "cpsat",
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    tp: Annotated[str | None, typer.Option("--tp", help="Allowed tp sizes, e.g. 2,4,8.")] = None,
    pp: Annotated[str | None, typer.Option("--pp", help="Allowed pp sizes.")] = None,
    dp: Annotated[str | None, typer.Option("--dp", help="Allowed dp sizes.")] = None,
    mb: Annotated[str | None, typer.Option("--mb", help="Allowed micro-batch sizes.")] = None,
    vpp: Annotated[
        str | None, typer.Option("--vpp", help="Allowed model chunks per stage.")
    ] = None,
    dp_sharding: Annotated[
        str | None,
        typer.Option(
            "--dp-sharding",
            help="Data-parallel sharding levels to try, e.g. optim,optim_grads_params "
            "(none, optim, optim_grads, optim_grads_params).",
        ),
    ] = None,
    dp_shard_size: Annotated[
        str | None,
        typer.Option(
            "--dp-shard-size", help="Hybrid sharding (HSDP) shard-group sizes to try, e.g. 8."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plans as JSON.")] = False,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write the best plan (JSON).")
    ] = None,
    replace: Replacements = NO_REPLACEMENTS,  # --model, --cluster, ... (instance_options)
    snapshots: SnapshotsOption = None,
    quantile: QuantileOption = 1.0,
) -> None:
    """Find the fastest layouts that fit: degrees, knobs, layer split and GPU placement."""
    if method not in METHODS:
        raise SpecError("--method", method, f"unknown method; known: {', '.join(sorted(METHODS))}")
    inst = resolve_instance(instance, replace)
    cluster, profile = replace.cluster, replace.profile
    if replace.any():  # the instance file no longer describes it
        instance = str(_write_instance(inst, out, cluster, profile)) if out else inst.name
    space = _override(
        inst.search_space,
        tp=_ints("--tp", tp), pp=_ints("--pp", pp), dp=_ints("--dp", dp),
        micro_batch_size=_ints("--mb", mb), vpp=_ints("--vpp", vpp),
        dp_sharding=None if dp_sharding is None else tuple(dp_sharding.split(",")),
        dp_shard_size=_ints("--dp-shard-size", dp_shard_size),
    )  # fmt: skip
    if snapshots:  # plans robust over bandwidth snapshots (pipette_cp/cli/robust.py)
        return solve_robust(
            inst, snapshots, quantile, method=method, top=top, time_limit=time_limit, seed=seed,
            space=space, as_json=as_json, out=out, cluster=cluster, profile=profile,
            write_instance=_write_instance,
        )  # fmt: skip
    with search_progress(disable=as_json) as progress:
        result = solve_with_stats(
            inst,
            method=method,
            top_k=top,
            time_limit_s=time_limit,
            seed=seed,
            space=space,
            progress=progress,
        )
    plans = [p.model_copy(update={"instance": instance}) for p in result.plans]
    if out is not None:
        out.write_text(plans[0].model_dump_json(indent=1) + "\n", encoding="utf-8")
    if as_json:
        typer.echo(json.dumps(plans_json(plans), indent=1))
        return
    s = result.stats
    console.print(plans_table(plans, f"Top plans for {inst.name} ({method})"))
    console.print(
        f"{s.layouts} layouts: {s.invalid} invalid, {s.pruned_memory} never fit, {s.scored} scored, "
        f"{s.pruned_bound} pruned by the time bound, {s.solved} solved, {s.skipped_budget} over budget; "
        f"{s.wall_time_s:.1f} s" + (f"; best plan written to {out}" if out else ""),
        highlight=False,
    )


def _write_instance(inst: Instance, out: Path, cluster: Path | None, profile: Path | None) -> Path:
    """Write the instance a custom solve used next to its plan, so that ``export`` and
    ``plot`` find it again (the plan's ``instance`` field points at it)."""
    path = out.with_name(out.stem + ".instance.yaml")
    data = {
        "name": inst.name,
        "model": inst.model.model_dump(mode="json"),
        "cluster": {"file": str(cluster.resolve())} if cluster else None,
        "training": inst.training.model_dump(mode="json"),
        "search_space": inst.search_space.model_dump(mode="json"),
        "profile": str(profile.resolve()) if profile else None,
    }
    if cluster is None:
        data["cluster"] = cluster_to_mapping(inst.cluster, decimals=None)
    write_yaml(path, {k: v for k, v in data.items() if v is not None})
    return path.resolve()
