"""``pipette-cp predict``: evaluate one layout without solving anything."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from pipette_cp.cli.console import console
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


class RecomputeChoice(StrEnum):
    none = "none"
    selective = "selective"
    full = "full"


class ShardingChoice(StrEnum):
    none = "none"
    optim = "optim"
    optim_grads = "optim_grads"
    optim_grads_params = "optim_grads_params"


class KernelChoice(StrEnum):
    eager = "eager"
    sdpa_math = "sdpa-math"
    fused_softmax = "fused-softmax"
    flash1 = "flash1"
    flash2 = "flash2"
    flash3 = "flash3"
    cudnn = "cudnn"


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
    sp: Annotated[bool, typer.Option("--sp/--no-sp", help="Sequence parallelism.")] = False,
    recompute: Annotated[
        RecomputeChoice, typer.Option(help="Activation recomputation.")
    ] = RecomputeChoice.none,
    dist_opt: Annotated[
        bool, typer.Option("--dist-opt/--no-dist-opt", help="Distributed optimizer.")
    ] = False,
    flash_attn: Annotated[
        bool, typer.Option("--flash-attn/--no-flash-attn", help="FlashAttention.")
    ] = True,
    dp_sharding: Annotated[
        ShardingChoice | None,
        typer.Option(
            help="Data-parallel sharding: none, optim (ZeRO-1), optim_grads (ZeRO-2), "
            "optim_grads_params (ZeRO-3); overrides --dist-opt."
        ),
    ] = None,
    dp_shard_size: Annotated[
        int | None,
        typer.Option(
            "--dp-shard-size",
            help="Hybrid sharding (HSDP): shard over groups of this many DP ranks, replicate "
            "across them [default: shard over all].",
        ),
    ] = None,
    attention_kernel: Annotated[
        KernelChoice | None,
        typer.Option(
            help="Attention kernel of this plan (overrides --flash-attn and the stack's)."
        ),
    ] = None,
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
            sequence_parallel=sp,
            recompute=recompute.value,
            distributed_optimizer=dist_opt,
            dp_sharding=None if dp_sharding is None else dp_sharding.value,
            dp_shard_size=dp_shard_size,
            attention_kernel=None if attention_kernel is None else attention_kernel.value,
            flash_attention=flash_attn,
            layer_split=_split(split),
            placement=placed,
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
