"""The batch knobs: the micro-batch size and the interleaving (model chunks per stage)."""

from __future__ import annotations

from typing import Protocol

from pipette_cp.errors import LayoutError
from pipette_cp.specs.knobs.base import Degrees, Flag, Job, Knob, Phase, Rule, SpaceFlag
from pipette_cp.specs.training import TrainingSpec


class _Batched(Degrees, Protocol):
    @property
    def micro_batch_size(self) -> int: ...


class _Interleaved(_Batched, Protocol):
    @property
    def vpp(self) -> int: ...


def micro_batches(job: Job, plan: _Batched) -> int:
    """Micro-batches per iteration per pipeline: ``global_batch / (dp x micro_batch)``."""
    return job.training.global_batch_size // (plan.dp * plan.micro_batch_size)


# ----------------------------------------------------------------- micro-batch size
def _divides_batch(job: Job, dp: int, mb: int) -> bool:
    return job.training.global_batch_size % (dp * mb) == 0


def _mb_choices(job: Job, layout: Degrees) -> list[int]:
    return [mb for mb in job.space.micro_batch_size if _divides_batch(job, layout.dp, mb)]


def _mb_divides_batch(job: Job, plan: _Batched) -> None:
    dp, mb, gbs = plan.dp, plan.micro_batch_size, job.training.global_batch_size
    if not _divides_batch(job, dp, mb):
        raise LayoutError("plan.micro_batch_size", mb,
                          f"dp={dp} x micro_batch_size={mb} = {dp * mb} must divide global_batch_size={gbs}")  # fmt: skip


def _mb_label(plan: _Batched) -> tuple[str, ...]:
    return (f"mb{plan.micro_batch_size}",)


def _mb_megatron(training: TrainingSpec, plan: _Batched) -> list[Flag]:
    """The micro-batch size, and the global batch it divides into micro-batches."""
    return [("--micro-batch-size", str(plan.micro_batch_size)),
            ("--global-batch-size", str(training.global_batch_size))]  # fmt: skip


MICRO_BATCH: Knob[_Batched] = Knob(
    name="micro_batch_size",
    choices=_mb_choices,
    rules=(Rule(Phase.BATCH, _mb_divides_batch),),
    label=_mb_label,
    megatron=_mb_megatron,
    lightest=lambda space: space.micro_batch_size or (1,),
    solve_flags=(SpaceFlag("micro_batch_size", "--mb", "Allowed micro-batch sizes.", "ints"),),
)


# ------------------------------------------------------------------- interleaving
def _interleaving_fits(pp: int, micro: int) -> bool:
    """Megatron's interleaved schedule: pp > 1 stages dividing the micro-batches."""
    return pp > 1 and micro % pp == 0


def _vpp_choices(job: Job, layout: _Batched) -> list[int]:
    """1, and the chunk counts that leave every chunk a layer where interleaving runs."""
    pp, layers = layout.pp, job.model.num_layers
    fits = _interleaving_fits(pp, micro_batches(job, layout))
    return [v for v in job.space.vpp if v == 1 or (fits and layers >= pp * v)]


def _vpp_needs_pipeline(job: Job, plan: _Interleaved) -> None:
    if plan.vpp > 1 and plan.pp == 1:
        raise LayoutError("plan.vpp", plan.vpp, f"vpp={plan.vpp} > 1 needs pp > 1, got pp=1")


def _vpp_divides_micro_batches(job: Job, plan: _Interleaved) -> None:
    vpp, pp = plan.vpp, plan.pp
    if vpp > 1 and not _interleaving_fits(pp, m := micro_batches(job, plan)):
        raise LayoutError("plan.vpp", vpp,
                          f"vpp={vpp}: interleaving needs pp={pp} to divide the {m} micro-batches (Megatron)")  # fmt: skip


def _vpp_label(plan: _Interleaved) -> tuple[str, ...]:
    return (f"vpp{plan.vpp}",) if plan.vpp > 1 else ()


#: Megatron's flag (``--num-virtual-stages-per-pipeline-rank``) goes with the layer
#: split (:func:`pipette_cp.report.megatron.flags.split_flags`: an uneven split's layout
#: string fixes the virtual stages instead).
VPP: Knob[_Interleaved] = Knob(
    name="vpp",
    choices=_vpp_choices,
    rules=(
        Rule(Phase.SCHEDULE, _vpp_needs_pipeline),
        Rule(Phase.SCHEDULE, _vpp_divides_micro_batches),
    ),
    label=_vpp_label,
    solve_flags=(SpaceFlag("vpp", "--vpp", "Allowed model chunks per stage.", "ints"),),
)

KNOBS = (MICRO_BATCH, VPP)
