"""``pipette-cp solve``: the main job."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import typer

from pipette_cp.api import solve_with_options
from pipette_cp.cli.console import STARTED_AT, console, err_console
from pipette_cp.cli.knob_flags import NO_VALUES, parse_space, space_options
from pipette_cp.cli.options import (
    NO_REPLACEMENTS,
    InstanceArgument,
    MilpSolverOption,
    RayAddressOption,
    Replacements,
    assumptions,
    check_deterministic,
    instance_options,
    milp_solver_of,
    resolve_instance,
)
from pipette_cp.cli.outputs import (
    check_output,
    check_run_options,
    check_workers,
    instance_path,
    instance_text,
    outside_folder,
    search_budget,
    write_atomically,
)
from pipette_cp.cli.progress import solve_progress
from pipette_cp.cli.robust import QuantileOption, SnapshotsOption, solve_robust
from pipette_cp.errors import SpecError
from pipette_cp.io.instance_file import DEFAULT_INSTANCE
from pipette_cp.report.plan_file import plan_document
from pipette_cp.report.plans import GAP_LEGEND, plans_json, plans_table, search_gap_text
from pipette_cp.report.summary import plan_summary
from pipette_cp.search.loop import default_time_limit_s
from pipette_cp.search.options import SearchOptions
from pipette_cp.search.rerank import plan_time
from pipette_cp.search.selection import check_selection, idle_nodes
from pipette_cp.search.snapshots import check_quantile
from pipette_cp.solvers import METHODS
from pipette_cp.specs import Instance, Plan, SearchSpace, validate_spec


def _override(space: SearchSpace, **lists: object) -> SearchSpace:
    update = {k: v for k, v in lists.items() if v is not None}
    if not update:
        return space
    return validate_spec(SearchSpace, {**space.model_dump(), **update}, "search_space")


@instance_options
@space_options
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
    milp_solver: MilpSolverOption = None,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    jobs: Annotated[
        int | None,
        typer.Option(
            "--jobs", help="Worker processes for the layouts [default: the machine's cores]."
        ),
    ] = None,
    executor: Annotated[
        str, typer.Option("--executor", help="Where the workers run: local | ray.")
    ] = "local",
    ray_address: RayAddressOption = None,
    space_texts: Mapping[str, str | None] = NO_VALUES,  # --tp, ..., --mb, ... (space_options)
    exclude_node: Annotated[
        list[str] | None,
        typer.Option("--exclude-node", help="A node (host name) that holds no rank; repeatable."),
    ] = None,
    min_gpus: Annotated[
        int | None,
        typer.Option(
            "--min-gpus",
            help="Fewest GPUs a layout may use [default: all but a few nodes: 1 per 8, 1-4].",
        ),
    ] = None,
    use_all_gpus: Annotated[
        bool | None,
        typer.Option(
            "--all-gpus/--any-gpus",
            help="Every GPU of the nodes not excluded / any count down to --min-gpus "
            "[default: whole nodes may stay idle].",
        ),
    ] = None,
    objective: Annotated[
        str | None,
        typer.Option(
            "--objective", help="time (default) or throughput-per-gpu (GPU-seconds per step)."
        ),
    ] = None,
    deterministic: Annotated[
        bool,
        typer.Option(
            "--deterministic",
            help="Budget by work, not wall time: --time-limit is reference seconds of work "
            "(about 1 s each on a 2-core machine); same plans on any machine, for any --jobs "
            "(cpsat, split-cpsat and the heuristics).",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plans as JSON.")] = False,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write the best plan (JSON).")
    ] = None,
    replace: Replacements = NO_REPLACEMENTS,  # --model, --cluster, ... (instance_options)
    snapshots: SnapshotsOption = None,
    quantile: QuantileOption = None,
) -> None:
    """Find the fastest layouts that fit: degrees, knobs, layer split and GPU placement."""
    check_run_options(top, time_limit, seed)
    if method not in METHODS:
        raise SpecError("--method", method, f"unknown method; known: {', '.join(sorted(METHODS))}")
    if quantile is not None and not snapshots:
        raise SpecError("--quantile", quantile, "applies to --snapshots only; give them too")
    if quantile is not None:
        check_quantile(quantile, "--quantile")
    if deterministic:
        check_deterministic(method, bool(snapshots))
    engine = milp_solver_of(milp_solver, method)
    workers = check_workers(jobs, executor, ray_address, bool(snapshots))
    check_output(out)  # before any work: a bad path must not cost the whole search
    inst = resolve_instance(instance, replace)
    cluster, profile = replace.cluster, replace.profile
    # the instance is written next to the plan when the command line replaced a part of
    # it, or when its file lies outside the plan's folder (a plan opens no file elsewhere)
    beside = replace.any() or (out is not None and outside_folder(instance, out.parent))
    if beside and out is not None:
        instance = instance_path(out).name  # written next to the plan, after the search
    elif replace.any():
        instance = inst.name
    space = _override(
        inst.search_space, **parse_space(space_texts),
        exclude_nodes=None if exclude_node is None else tuple(exclude_node),
        min_gpus=min_gpus, use_all_gpus=use_all_gpus, objective=objective,
    )  # fmt: skip
    check_selection(inst, space)
    limit = time_limit if time_limit is not None else default_time_limit_s(inst)
    # a work budget owes nothing to the clock: the start-up is not taken off it
    budget = limit if deterministic else search_budget(limit, STARTED_AT)
    options = SearchOptions(method=method, top_k=top, time_limit_s=budget, seed=seed, space=space,
                            milp_solver=engine, deterministic=deterministic, **workers)  # fmt: skip
    if snapshots:  # plans robust over bandwidth snapshots (pipette_cp/cli/robust.py)
        return solve_robust(inst, snapshots, 1.0 if quantile is None else quantile, options,
                            as_json=as_json, out=out, cluster=cluster, profile=profile)  # fmt: skip
    with solve_progress(time.perf_counter() + budget, disable=as_json) as (progress, on_best):
        try:
            reporting = dataclasses.replace(options, progress=progress, on_best=on_best)
            result = solve_with_options(inst, reporting)
        except KeyboardInterrupt:
            err_console.print("interrupted before any plan was found", highlight=False)
            raise typer.Exit(130) from None
    plans = [p.model_copy(update={"instance": instance}) for p in result.plans]
    for note in result.stats.notes if deterministic else []:  # what the work budget took
        if note.startswith("deterministic:"):
            err_console.print(note, style="dim", highlight=False)
    if out is not None:
        write_plan(plans[0], out, inst if beside else None, cluster, profile)
    if as_json:
        typer.echo(json.dumps(plans_json(plans), indent=1))
        return
    s = result.stats
    console.print(assumptions(inst, replace), highlight=False)
    console.print(plans_table(plans, f"Top plans for {inst.name} ({method})", console.width))
    console.print(GAP_LEGEND, style="dim", highlight=False)
    best = plans[0]
    console.print(search_gap_text(best, s.skipped_budget), highlight=False)
    steps = inst.training.global_batch_size // (best.dp * best.micro_batch_size)
    console.print(
        f"{s.layouts} layouts: {s.invalid} invalid, {s.pruned_memory} never fit, {s.scored} scored, "
        f"{s.pruned_bound} pruned by the time bound, {s.solved} solved, {s.skipped_budget} over budget; "
        f"{s.wall_time_s:.1f} s; the best runs {steps} micro-batches per step"
        + (f"; best plan written to {out}" if out else "")
        + ("; interrupted: the best plans found until then" if s.interrupted else ""),
        highlight=False,
    )
    idle = idle_nodes(inst.model_copy(update={"search_space": space}), best,
                      s.best_by_gpus, s.bound_by_gpus).describe(plan_time(best))  # fmt: skip
    console.print()
    for line in plan_summary(inst, best, width=min(console.width, 100)):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    if idle:
        console.print(idle, highlight=False)


def write_plan(
    plan: Plan, out: Path, inst: Instance | None, cluster: Path | None, profile: Path | None
) -> None:
    """The plan at ``out`` and, when given, its instance next to it (first), atomically."""
    if inst is not None:
        at = instance_path(out)
        write_atomically(at, instance_text(inst, at, cluster, profile))
    write_atomically(out, json.dumps(plan_document(plan), indent=1) + "\n")
