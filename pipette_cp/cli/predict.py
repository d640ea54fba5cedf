"""``pipette-cp predict``: evaluate one layout without solving anything."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from pipette_cp.cli.console import console, err_console
from pipette_cp.cli.knob_flags import NO_VALUES, plan_options, resolve_plan_defaults, splice
from pipette_cp.cli.options import (
    NO_REPLACEMENTS,
    InstanceArgument,
    Replacements,
    assumptions,
    instance_options,
    read_plan,
    resolve_instance,
)
from pipette_cp.cost.evaluator.evaluate import evaluate
from pipette_cp.cost.memory.peak import memory_by_stage
from pipette_cp.errors import LayoutError
from pipette_cp.io.instance_file import DEFAULT_INSTANCE
from pipette_cp.report.evaluation import evaluation_table
from pipette_cp.report.plan_file import plan_document
from pipette_cp.specs._base import spec_error_from
from pipette_cp.specs.layouts import make_plan
from pipette_cp.units import GB

#: ``predict``'s exit code for a layout that does not fit in memory (its prediction is
#: still printed): the code of "nothing fits" elsewhere.
NOT_FITTING_EXIT = 3


class Predictor(StrEnum):
    analytic = "analytic"
    simulator = "simulator"


#: The layout's sizes as options, in ``--help`` order: (option, plan field, default, help);
#: a default of None is derived (``--dp`` from the GPUs, ``--etp`` by the plan).
SIZES: tuple[tuple[str, str, int | None, str], ...] = (
    ("--tp", "tp", 1, "Tensor-parallel size."),
    ("--pp", "pp", 1, "Pipeline-parallel size."),
    ("--mb", "micro_batch_size", 1, "Micro-batch size (sequences)."),
    ("--dp", "dp", None, "Data-parallel size [default: GPUs/(tp*pp*cp)]."),
    ("--vpp", "vpp", 1, "Model chunks per stage (interleaving)."),
    ("--cp", "cp", 1, "Context-parallel size."),
    ("--ep", "ep", 1, "Expert-parallel size (MoE models)."),
    ("--etp", "etp", None, "Expert tensor-parallel size [default: tp]."),
)


def size_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Give ``command`` the :data:`SIZES` options in place of its ``sizes`` parameter,
    which receives ``{plan field: value}`` of every one."""
    options = [
        inspect.Parameter(field, inspect.Parameter.KEYWORD_ONLY, default=default,
                          annotation=Annotated[int if default is not None else int | None,
                                               typer.Option(flag, help=text)])
        for flag, field, default, text in SIZES
    ]  # fmt: skip
    return splice(command, "sizes", options, dict)


def _split(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.replace(" ", "").split(","))
    except ValueError:
        raise LayoutError(
            "--split", text, "expected comma-separated layer counts, e.g. 11,13,13,11"
        ) from None


@instance_options
@size_options
@plan_options
def predict(
    instance: InstanceArgument = DEFAULT_INSTANCE,
    sizes: Mapping[str, Any] = NO_VALUES,  # --tp, --pp, --mb, ... (size_options)
    knobs: Mapping[str, Any] = NO_VALUES,  # --sp, --recompute, ... (plan_options)
    placement: Annotated[
        str,
        typer.Option(
            help="'default' (Megatron tp-dp-pp order) or a plan JSON to take the placement from."
        ),
    ] = "default",
    split: Annotated[
        str | None, typer.Option(help="Layers per model chunk, comma-separated.")
    ] = None,
    predictor: Annotated[
        Predictor, typer.Option(help="Analytic model or schedule simulator.")
    ] = Predictor.analytic,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    replace: Replacements = NO_REPLACEMENTS,  # --model, --cluster, ... (instance_options)
) -> None:
    """Predict iteration time, throughput, MFU and memory per stage of one layout."""
    inst = resolve_instance(instance, replace)
    gpus = inst.cluster.num_gpus
    for flag, field, _, _ in SIZES:  # checked before dividing by tp * pp
        if (value := sizes[field]) is not None and value <= 0:
            raise LayoutError(flag, value, "must be a positive integer")
    tp, pp, cp, vpp, dp = (sizes[field] for field in ("tp", "pp", "cp", "vpp", "dp"))
    with_cp = ("*--cp", f" x cp={cp}") if cp > 1 else ("", "")
    if dp is None:
        if gpus % (tp * pp * cp):
            raise LayoutError(f"--tp*--pp{with_cp[0]}", tp * pp * cp,
                              f"must divide the {gpus} GPUs of the cluster (or give --dp)")  # fmt: skip
        dp = gpus // (tp * pp * cp)
    if (used := dp * pp * tp * cp) > gpus:  # before building a placement of that many units
        raise LayoutError(f"--dp*--pp*--tp{with_cp[0]}", used,
                          f"dp={dp} x pp={pp} x tp={tp}{with_cp[1]} = {used} GPUs, but the cluster has {gpus} GPUs")  # fmt: skip
    if pp * vpp > (layers := inst.model.num_layers):
        raise LayoutError("--pp*--vpp", pp * vpp,
                          f"pp={pp} x vpp={vpp} model chunks, but the model has {layers} layers")  # fmt: skip
    placed = None
    if placement != "default":
        source = read_plan(Path(placement))
        if (source.dp, source.pp, source.tp, source.cp) != (dp, pp, tp, cp):
            raise LayoutError(
                "--placement",
                placement,
                f"holds dp={source.dp} pp={source.pp} tp={source.tp}"
                + (f" cp={source.cp}" if max(source.cp, cp) > 1 else "")
                + f", not dp={dp} pp={pp} tp={tp}"
                + (f" cp={cp}" if max(source.cp, cp) > 1 else ""),
            )
        placed = source.placement
    knobs = resolve_plan_defaults(knobs, {**sizes, "dp": dp})
    try:  # a --split of the wrong length or with a negative count
        plan = make_plan(num_layers=inst.model.num_layers, **{**sizes, "dp": dp},
                         layer_split=_split(split), placement=placed, **knobs)  # fmt: skip
    except ValidationError as exc:
        raise spec_error_from(exc, "plan") from None
    evaluation = evaluate(inst, plan, predictor=predictor.value)
    memory = memory_by_stage(inst.model, inst.training, plan)
    if as_json:
        typer.echo(json.dumps(plan_document(plan, evaluation, memory), indent=2))
    else:
        steps = inst.training.global_batch_size // (plan.dp * plan.micro_batch_size)
        console.print(
            f"{assumptions(inst, replace)}; {steps} micro-batches per step", highlight=False
        )
        console.print(evaluation_table(plan, evaluation, memory))
    if not evaluation.fits:  # the prediction stands, but the layout would not run
        bound = evaluation.memory_bound_bytes_by_stage
        worst = max(range(len(bound)), key=bound.__getitem__)
        err_console.print(
            f"does not fit: stage {worst} needs {bound[worst] / GB:.1f} GB (peak and margin), "
            f"{evaluation.memory_limit_bytes / GB:.1f} GB usable (exit code {NOT_FITTING_EXIT})",
            highlight=False,
        )
        raise typer.Exit(NOT_FITTING_EXIT)
