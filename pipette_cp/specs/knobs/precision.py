"""The precision knobs of Megatron-Core's mixed precision: bf16 main gradients."""

from __future__ import annotations

from typing import Protocol

from pipette_cp.errors import LayoutError
from pipette_cp.specs.knobs.base import Degrees, Flag, Job, Knob, Phase, PlanFlag, Rule, SpaceFlag
from pipette_cp.specs.knobs.memory import MEGATRON_CORE
from pipette_cp.specs.training import TrainingSpec


def megatron_refusal(job: Job, flag: str) -> str | None:
    """Why Megatron's ``flag`` is not modelled for the job's framework and precision (None:
    it is): Megatron-Core's frameworks, bf16 weights (precision bf16 or fp8)."""
    t = job.training
    if t.framework.name not in MEGATRON_CORE:
        known = ", ".join(MEGATRON_CORE)
        return f"is Megatron-Core's {flag} (framework {known}), not {t.framework.name}"
    if t.precision == "fp16":
        return f"{flag} needs bf16 weights (precision bf16 or fp8), precision is fp16"
    return None


# ----------------------------------------------------------- bf16 main gradients
class _Bf16Gradients(Degrees, Protocol):
    @property
    def grad_reduce_in_bf16(self) -> bool: ...


def _bf16_grads_choices(job: Job, layout: Degrees) -> list[bool]:
    runs = megatron_refusal(job, "--grad-reduce-in-bf16") is None
    return [on for on in job.space.grad_reduce_in_bf16 if runs or not on] or [False]


def _bf16_grads_runs(job: Job, plan: _Bf16Gradients) -> None:
    if plan.grad_reduce_in_bf16 and (why := megatron_refusal(job, "--grad-reduce-in-bf16")):
        raise LayoutError("plan.grad_reduce_in_bf16", True, why)


def _bf16_grads_megatron(training: TrainingSpec, plan: _Bf16Gradients) -> list[Flag]:
    return [("--grad-reduce-in-bf16", None)] if plan.grad_reduce_in_bf16 else []


#: Priced by :func:`pipette_cp.cost.stack.frameworks.gradient_bytes` (the gradient buffer,
#: the data-parallel collectives' bytes, the optimizer step's reads), which every part of
#: the cost model and the placement masters read.
GRAD_REDUCE_IN_BF16: Knob[_Bf16Gradients] = Knob(
    name="grad_reduce_in_bf16",
    choices=_bf16_grads_choices,
    rules=(Rule(Phase.SCHEDULE, _bf16_grads_runs),),
    label=lambda plan: ("bf16grad",) if plan.grad_reduce_in_bf16 else (),
    megatron=_bf16_grads_megatron,
    lightest=lambda space: space.grad_reduce_in_bf16,
    solve_flags=(
        SpaceFlag(
            "grad_reduce_in_bf16",
            "--grad-reduce-in-bf16",
            "Main gradients kept and reduced in bf16 off / on to try: false, true or "
            "false,true [default: false].",
            "words",
        ),
    ),
    predict_flags=(
        PlanFlag(
            "grad_reduce_in_bf16",
            "grad_reduce_in_bf16",
            ("--grad-reduce-in-bf16/--no-grad-reduce-in-bf16",),
            "Main gradients kept and reduced in bf16 (Megatron --grad-reduce-in-bf16).",
            bool,
            False,
        ),
    ),
)

KNOBS = (GRAD_REDUCE_IN_BF16,)
