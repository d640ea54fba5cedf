"""The precision knobs of Megatron-Core's mixed precision: FP8 primary weights and bf16
main gradients."""

from __future__ import annotations

from typing import Protocol

from pipette_cp.errors import LayoutError
from pipette_cp.specs.knobs.base import Degrees, Flag, Job, Knob, Phase, PlanFlag, Rule, SpaceFlag
from pipette_cp.specs.knobs.recompute import MEGATRON_CORE
from pipette_cp.specs.training import Sharding, TrainingSpec


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


# ------------------------------------------------------------ FP8 primary weights
class _Fp8Params(Degrees, Protocol):
    @property
    def fp8_param_gather(self) -> bool: ...
    @property
    def sharding(self) -> Sharding: ...


def _fp8_params_refusal(job: Job, sharding: Sharding) -> str | None:
    """Why FP8 primary weights cannot run (None: they can): FP8 training (Transformer
    Engine keeps the weights as FP8 tensors), Megatron-Core's distributed optimizer
    (Megatron's ``validate_args`` also allows Megatron-FSDP and FSDP2, whose FP8 weights
    are not modelled)."""
    if why := megatron_refusal(job, "--fp8-param-gather"):
        return why
    if job.training.precision != "fp8":
        return f"needs FP8 training (precision fp8), precision is {job.training.precision}"
    if sharding != "optim":
        return f"needs the distributed optimizer (dp_sharding optim), dp_sharding is {sharding}"
    return None


class _ShardingChosen(Protocol):
    @property
    def dp_sharding(self) -> Sharding | None: ...


#: The choices of a boolean knob the space leaves off (shared: the search only reads it).
OFF: list[bool] = [False]


def _fp8_params_choices(job: Job, layout: _ShardingChosen) -> list[bool]:
    if job.space.fp8_param_gather == (False,):
        return OFF
    runs = _fp8_params_refusal(job, layout.dp_sharding or "none") is None
    return [on for on in job.space.fp8_param_gather if runs or not on] or [False]


def _fp8_params_run(job: Job, plan: _Fp8Params) -> None:
    if plan.fp8_param_gather and (why := _fp8_params_refusal(job, plan.sharding)):
        raise LayoutError("plan.fp8_param_gather", True, why)


def _fp8_params_megatron(training: TrainingSpec, plan: _Fp8Params) -> list[Flag]:
    return [("--fp8-param-gather", None)] if plan.fp8_param_gather else []


#: Priced by :func:`pipette_cp.cost.memory.state.stage_fp8_weight_bytes` (the FP8 copies
#: are the weights: no bf16 copy), :func:`pipette_cp.cost.network.data_parallel.
#: param_wire_bytes` (the parameter all-gather in FP8, read by the evaluator and the
#: placement masters) and :func:`pipette_cp.cost.stack.frameworks.optimizer_state_bytes`
#: (no 16-bit remainders of FP8 weights).
FP8_PARAM_GATHER: Knob[_Fp8Params] = Knob(
    name="fp8_param_gather",
    choices=_fp8_params_choices,
    rules=(Rule(Phase.SCHEDULE, _fp8_params_run),),
    label=lambda plan: ("fp8param",) if plan.fp8_param_gather else (),
    megatron=_fp8_params_megatron,
    lightest=lambda space: space.fp8_param_gather,
    solve_flags=(
        SpaceFlag(
            "fp8_param_gather",
            "--fp8-param-gather",
            "FP8 primary weights (gathered in FP8) off / on to try: false, true or false,true "
            "(with FP8 training and the distributed optimizer) [default: false].",
            "words",
        ),
    ),
    predict_flags=(
        PlanFlag(
            "fp8_param_gather",
            "fp8_param_gather",
            ("--fp8-param-gather/--no-fp8-param-gather",),
            "FP8 primary weights, gathered in FP8 (Megatron --fp8-param-gather; needs "
            "precision fp8 and --dist-opt).",
            bool,
            False,
        ),
    ),
)


# ----------------------------------------------------------- bf16 main gradients
class _Bf16Gradients(Degrees, Protocol):
    @property
    def grad_reduce_in_bf16(self) -> bool: ...


def _bf16_grads_choices(job: Job, layout: Degrees) -> list[bool]:
    if job.space.grad_reduce_in_bf16 == (False,):
        return OFF
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

KNOBS = (FP8_PARAM_GATHER, GRAD_REDUCE_IN_BF16)
