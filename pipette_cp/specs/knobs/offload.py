"""The optimizer CPU offload knob: Megatron-Core's hybrid device optimizer."""

from __future__ import annotations

from typing import Protocol

from pipette_cp.errors import LayoutError
from pipette_cp.specs.knobs.base import Degrees, Flag, Job, Knob, Phase, PlanFlag, Rule, SpaceFlag
from pipette_cp.specs.knobs.precision import megatron_refusal
from pipette_cp.specs.training import Sharding, TrainingSpec


class _Offloaded(Degrees, Protocol):
    @property
    def optimizer_offload_fraction(self) -> float: ...
    @property
    def precision_aware_optimizer(self) -> bool: ...
    @property
    def fp8_param_gather(self) -> bool: ...
    @property
    def sharding(self) -> Sharding: ...


class _Chosen(Protocol):
    @property
    def dp_sharding(self) -> Sharding | None: ...
    @property
    def precision_aware_optimizer(self) -> bool: ...
    @property
    def fp8_param_gather(self) -> bool: ...


def _offload_refusal(
    job: Job, sharding: Sharding, bf16_moments: bool, fp8_params: bool
) -> str | None:
    """Why the optimizer cannot be offloaded (None: it can).  Megatron's ``validate_args``:
    the offload needs ``--use-precision-aware-optimizer`` (Adam with the distributed
    optimizer, ``OptimizerConfig``) and, with ``--fp8-param-gather``, delayed scaling;
    its hybrid optimizer runs torch's Adam with fp32 state, so bf16 moments
    (``precision_aware_optimizer``) do not apply."""
    t = job.training
    if why := megatron_refusal(job, "--optimizer-cpu-offload"):
        return why
    if t.optimizer != "adam":
        return (
            "needs Adam (Megatron's offload runs the precision-aware optimizer), "
            f"training.optimizer is {t.optimizer}"
        )
    if sharding != "optim":
        return f"needs the distributed optimizer (dp_sharding optim), dp_sharding is {sharding}"
    if bf16_moments:
        return (
            "keeps fp32 Adam state (torch's Adam on host and device): turn "
            "precision_aware_optimizer (bf16 moments) off"
        )
    if fp8_params and (recipe := t.fp8_recipe or "delayed") != "delayed":
        return (
            f"with fp8_param_gather needs the delayed FP8 recipe (Megatron), fp8_recipe is {recipe}"
        )
    return None


#: The choices when the space leaves the optimizer on the GPU (shared: only read).
_NONE: list[float] = [0.0]


def _offload_choices(job: Job, layout: _Chosen) -> list[float]:
    if job.space.optimizer_offload_fraction == (0.0,):
        return _NONE
    why = _offload_refusal(job, layout.dp_sharding or "none", layout.precision_aware_optimizer,
                           layout.fp8_param_gather)  # fmt: skip
    return [f for f in job.space.optimizer_offload_fraction if why is None or not f] or [0.0]


def _offload_runs(job: Job, plan: _Offloaded) -> None:
    fraction = plan.optimizer_offload_fraction
    if fraction and (why := _offload_refusal(job, plan.sharding, plan.precision_aware_optimizer,
                                             plan.fp8_param_gather)):  # fmt: skip
        raise LayoutError("plan.optimizer_offload_fraction", fraction, why)


def _offload_label(plan: _Offloaded) -> tuple[str, ...]:
    fraction = plan.optimizer_offload_fraction
    return (f"offload{fraction:g}",) if fraction else ()


def _offload_megatron(training: TrainingSpec, plan: _Offloaded) -> list[Flag]:
    """``--optimizer-cpu-offload`` with its fraction and the precision-aware optimizer's
    switch it runs under (fp32 state: ``--exp-avg-dtype`` and the others keep their fp32
    defaults)."""
    if not (fraction := plan.optimizer_offload_fraction):
        return []
    return [("--optimizer-cpu-offload", None), ("--optimizer-offload-fraction", f"{fraction:g}"),
            ("--use-precision-aware-optimizer", None)]  # fmt: skip


#: Priced by :func:`pipette_cp.cost.stack.frameworks.optimizer_state_bytes` (the offloaded
#: share of the master weights and moments leaves the GPU) and
#: :func:`~pipette_cp.cost.stack.frameworks.host_optimizer_time_s` (the step's transfers
#: and host Adam, :func:`pipette_cp.cost.compute.model_chunks.optimizer_step_time_s`).
OPTIMIZER_OFFLOAD: Knob[_Offloaded] = Knob(
    name="optimizer_offload_fraction",
    choices=_offload_choices,
    rules=(Rule(Phase.SCHEDULE, _offload_runs),),
    label=_offload_label,
    megatron=_offload_megatron,
    lightest=lambda space: space.optimizer_offload_fraction,
    solve_flags=(
        SpaceFlag(
            "optimizer_offload_fraction",
            "--optimizer-offload-fraction",
            "Fractions of the optimizer state offloaded to the host to try, e.g. 0,0.5,1 "
            "(with the distributed optimizer and Adam) [default: 0].",
            "words",
        ),
    ),
    predict_flags=(
        PlanFlag(
            "optimizer_offload_fraction",
            "optimizer_offload_fraction",
            ("--optimizer-offload-fraction",),
            "Fraction of the optimizer state offloaded to the host, 0 to 1 (Megatron "
            "--optimizer-cpu-offload; needs --dist-opt) [default: 0].",
            float,
            0.0,
        ),
    ),
)

KNOBS = (OPTIMIZER_OFFLOAD,)
