"""``pipette-cp predict``: evaluate one layout without solving anything."""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from pipette_cp.cli.console import console
from pipette_cp.cli.knob_flags import NO_VALUES, plan_options
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
from pipette_cp.report.evaluation import evaluation_json, evaluation_table
from pipette_cp.specs._base import spec_error_from
from pipette_cp.specs.layouts import make_plan


class Predictor(StrEnum):
    analytic = "analytic"
    simulator = "simulator"


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
@plan_options
def predict(
    instance: InstanceArgument = DEFAULT_INSTANCE,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel size.")] = 1,
    pp: Annotated[int, typer.Option("--pp", help="Pipeline-parallel size.")] = 1,
    mb: Annotated[int, typer.Option("--mb", help="Micro-batch size (sequences).")] = 1,
    dp: Annotated[
        int | None, typer.Option("--dp", help="Data-parallel size [default: GPUs/(tp*pp*cp)].")
    ] = None,
    vpp: Annotated[int, typer.Option("--vpp", help="Model chunks per stage (interleaving).")] = 1,
    cp: Annotated[int, typer.Option("--cp", help="Context-parallel size.")] = 1,
    ep: Annotated[int, typer.Option("--ep", help="Expert-parallel size (MoE models).")] = 1,
    etp: Annotated[
        int | None, typer.Option("--etp", help="Expert tensor-parallel size [default: tp].")
    ] = None,
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
    given = 1 if dp is None else dp  # checked before dividing by tp * pp
    sizes = (("--tp", tp), ("--pp", pp), ("--mb", mb), ("--dp", given), ("--vpp", vpp),
             ("--cp", cp), ("--ep", ep), ("--etp", 1 if etp is None else etp))  # fmt: skip
    for name, value in sizes:
        if value <= 0:
            raise LayoutError(name, value, "must be a positive integer")
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
    try:  # a --split of the wrong length or with a negative count
        plan = make_plan(
            num_layers=inst.model.num_layers,
            dp=dp,
            pp=pp,
            tp=tp,
            cp=cp,
            ep=ep,
            etp=etp,
            micro_batch_size=mb,
            vpp=vpp,
            layer_split=_split(split),
            placement=placed,
            **knobs,
        )
    except ValidationError as exc:
        raise spec_error_from(exc, "plan") from None
    evaluation = evaluate(inst, plan, predictor=predictor.value)
    memory = memory_by_stage(inst.model, inst.training, plan)
    if as_json:
        typer.echo(json.dumps(evaluation_json(plan, evaluation, memory), indent=2))
    else:
        steps = inst.training.global_batch_size // (plan.dp * plan.micro_batch_size)
        console.print(
            f"{assumptions(inst, replace)}; {steps} micro-batches per step", highlight=False
        )
        console.print(evaluation_table(plan, evaluation, memory))
