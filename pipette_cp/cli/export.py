"""``pipette-cp export`` and ``pipette-cp plot``: what a user launches and looks at."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipette_cp.cli.console import console
from pipette_cp.cli.options import PlanInstanceOption, load_plan
from pipette_cp.cost.evaluator.evaluate import simulate
from pipette_cp.errors import SpecError
from pipette_cp.io.output_paths import (
    check_output_dir,
    check_output_file,
    output_error,
    save_figure,
)
from pipette_cp.report.launch import write_launch_files
from pipette_cp.report.megatron.flags import check_export, megatron_args, megatron_notes
from pipette_cp.report.plots import placement_figure, timeline_figure


def export(
    plan_file: Annotated[
        Path, typer.Argument(help="Plan JSON written by `pipette-cp solve --out`.")
    ],
    megatron: Annotated[
        bool, typer.Option("--megatron", help="Print the Megatron-LM arguments.")
    ] = False,
    hostfile: Annotated[
        Path | None,
        typer.Option(
            "--hostfile",
            help="Directory for rank_map.csv, rankfile, slurm_hostfile, rank_wrapper.sh and "
            "the Slurm, Open MPI and torchrun launchers.",
        ),
    ] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check/--no-check",
            help="Check the flags and the launch environment against Megatron-LM's argument "
            "table (commit d98e8a6) and its validate_args rules.",
        ),
    ] = True,
    instance: PlanInstanceOption = None,
) -> None:
    """Megatron-LM arguments and the launch files that realise the plan's placement.

    Plans that do not fit in memory, with an empty stage, or (with --check) with flags
    Megatron-LM would reject are refused."""
    check_output_dir(hostfile, "--hostfile")
    plan, inst = load_plan(plan_file, instance)
    check_export(inst, plan, flags=check)
    args = megatron_args(inst, plan)
    if megatron or hostfile is None:
        typer.echo(
            "".join(f"# {note}\n" for note in megatron_notes(inst, plan)) + " \\\n".join(args)
        )
    if hostfile is not None:
        try:
            written = write_launch_files(inst, plan, hostfile, args)
        except OSError as exc:
            raise output_error("--hostfile", hostfile, exc) from None
        for path in written:
            console.print(f"wrote {path}", highlight=False)


def plot(
    plan_file: Annotated[
        Path, typer.Argument(help="Plan JSON written by `pipette-cp solve --out`.")
    ],
    timeline: Annotated[
        Path | None, typer.Option("--timeline", help="PNG of the simulated schedule.")
    ] = None,
    placement: Annotated[
        Path | None, typer.Option("--placement", help="PNG of the placement.")
    ] = None,
    instance: PlanInstanceOption = None,
) -> None:
    """Draw the simulated pipeline timeline and the placement over the bandwidth matrix."""
    if timeline is None and placement is None:
        raise SpecError("--timeline/--placement", None, "give at least one output file")
    check_output_file(timeline, "--timeline")
    check_output_file(placement, "--placement")
    plan, inst = load_plan(plan_file, instance)
    if timeline is not None:
        figure = timeline_figure(simulate(inst, plan), f"{inst.name}: {plan.layout()}")
        save_figure(figure, timeline, "--timeline")
        console.print(f"wrote {timeline}", highlight=False)
    if placement is not None:
        save_figure(placement_figure(inst, plan), placement, "--placement")
        console.print(f"wrote {placement}", highlight=False)
