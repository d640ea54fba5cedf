"""``pipette-cp export`` and ``pipette-cp plot``: what a user launches and looks at."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from pipette_cp.cli.app import app, console
from pipette_cp.cost.evaluate import simulate
from pipette_cp.cost.layout_check import validate_layout
from pipette_cp.errors import InputFileError, SpecError
from pipette_cp.io.files import read_text
from pipette_cp.io.instance_file import load_instance
from pipette_cp.report.launch import write_launch_files
from pipette_cp.report.megatron import megatron_args, megatron_notes
from pipette_cp.report.plots import placement_figure, timeline_figure
from pipette_cp.specs import Instance, Plan
from pipette_cp.specs._base import spec_error_from

_INSTANCE = typer.Option(
    "--instance", help="Instance the plan is for [default: the one recorded in the plan]."
)


def load_plan(path: Path, instance: str | None) -> tuple[Plan, Instance]:
    """A plan file and its instance (from ``--instance`` or the plan's own record)."""
    try:
        plan = Plan.model_validate_json(read_text(path))
    except ValidationError as exc:  # name the file, not just its first bytes
        raise InputFileError(path, str(spec_error_from(exc, "plan"))) from None
    name = instance or plan.instance
    if not name:
        raise SpecError("--instance", None, f"{path} does not record its instance; pass --instance")
    inst = load_instance(name)
    validate_layout(inst, plan)  # a plan made for another instance (or edited by hand)
    return plan, inst


@app.command()
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
            help="Directory for rank_map.csv, rankfile, slurm_hostfile, launch scripts.",
        ),
    ] = None,
    instance: Annotated[str | None, _INSTANCE] = None,
) -> None:
    """Megatron-LM arguments and the rank order that realises the plan's placement."""
    plan, inst = load_plan(plan_file, instance)
    args = megatron_args(inst, plan)
    if megatron or hostfile is None:
        typer.echo(
            "".join(f"# {note}\n" for note in megatron_notes(inst, plan)) + " \\\n".join(args)
        )
    if hostfile is not None:
        for path in write_launch_files(inst, plan, hostfile, args):
            console.print(f"wrote {path}", highlight=False)


@app.command()
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
    instance: Annotated[str | None, _INSTANCE] = None,
) -> None:
    """Draw the simulated pipeline timeline and the placement over the bandwidth matrix."""
    if timeline is None and placement is None:
        raise SpecError("--timeline/--placement", None, "give at least one output file")
    plan, inst = load_plan(plan_file, instance)
    if timeline is not None:
        figure = timeline_figure(simulate(inst, plan), f"{inst.name}: {plan.layout()}")
        figure.savefig(timeline, dpi=130)
        console.print(f"wrote {timeline}", highlight=False)
    if placement is not None:
        placement_figure(inst, plan).savefig(placement, dpi=130)
        console.print(f"wrote {placement}", highlight=False)
