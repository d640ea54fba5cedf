"""``pipette-cp explain``: which links and nodes a plan depends on most."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from pipette_cp.cli.console import console
from pipette_cp.cli.options import PlanInstanceOption, load_plan
from pipette_cp.errors import SpecError
from pipette_cp.io.output_paths import check_output_file, save_figure
from pipette_cp.report.sensitivity.analysis import sensitivity
from pipette_cp.report.sensitivity.view import (
    sensitivity_figure,
    sensitivity_json,
    sensitivity_tables,
)


def explain(
    plan_file: Annotated[
        Path, typer.Argument(help="Plan JSON written by `pipette-cp solve --out`.")
    ],
    instance: PlanInstanceOption = None,
    factor: Annotated[
        float,
        typer.Option("--factor", help="Bandwidth multiplier of one link or node, in (0, 1)."),
    ] = 0.5,
    top: Annotated[int, typer.Option("--top", help="Links and nodes listed.")] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="PNG bar chart of the top links and nodes.")
    ] = None,
) -> None:
    """How much the predicted iteration time grows when one link, one node's NIC or one
    node's NVLink loses bandwidth (analytic model, one perturbation at a time)."""
    if not 0.0 < factor < 1.0:
        raise SpecError("--factor", factor, "a bandwidth multiplier in (0, 1), e.g. 0.5 = halved")
    if top < 1:
        raise SpecError("--top", top, "must be at least 1")
    check_output_file(plot, "--plot")
    plan, inst = load_plan(plan_file, instance)
    report = sensitivity(inst, plan, factor=factor, top=top)
    if as_json:
        typer.echo(json.dumps(sensitivity_json(report), indent=1))
    else:
        console.print(sensitivity_tables(report))
    if plot is not None:
        save_figure(sensitivity_figure(report), plot, "--plot")
        message = f"wrote {plot}"
        if as_json:
            typer.echo(message, err=True)
        else:
            console.print(message, highlight=False)
