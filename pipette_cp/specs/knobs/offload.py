"""The offload knobs: Megatron-Core's hybrid device optimizer (the optimizer state to the
host) and its fine-grained activation offloading (saved activations to the host)."""

from __future__ import annotations

from typing import Protocol

from pipette_cp.errors import LayoutError
from pipette_cp.specs.knobs.base import Degrees, Flag, Job, Knob, Phase, PlanFlag, Rule, SpaceFlag
from pipette_cp.specs.knobs.precision import megatron_refusal
from pipette_cp.specs.knobs.recompute import selective_modules
from pipette_cp.specs.training import (
    OffloadModule,
    Recompute,
    RecomputeModule,
    Sharding,
    TrainingSpec,
)


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
#: and host Adam, :func:`pipette_cp.cost.compute.optimizer_step.optimizer_step_time_s`).
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


# --------------------------------------------------- fine-grained activation offloading
Offloaded = tuple[OffloadModule, ...] | None
#: The recomputed module whose activations an offloaded one also drops (both at once
#: would count the same bytes twice).
_RECOMPUTED_TOO: dict[OffloadModule, RecomputeModule] = {
    "core_attn": "core_attn", "moe_act": "moe_act", "attn_norm": "layernorm",
    "mlp_norm": "layernorm",
}  # fmt: skip


class _ActivationsOffloaded(Degrees, Protocol):
    @property
    def offload_modules(self) -> Offloaded: ...
    @property
    def recompute(self) -> Recompute: ...
    @property
    def recompute_modules(self) -> tuple[RecomputeModule, ...] | None: ...


def _activation_offload_refusal(
    job: Job, layout: _ActivationsOffloaded, modules: tuple[OffloadModule, ...]
) -> str:
    """Why ``modules`` cannot be offloaded ('' if they can): Megatron-Core's frameworks;
    not with full recomputation (the layers keep only their inputs) nor under LoRA (not
    modelled); the expert modules on a mixture-of-experts model; no module that the
    plan also recomputes (Megatron-Core's ``fine_grained_activation_offloading`` guide
    pairs them, one module each way)."""
    if why := megatron_refusal(job, "--fine-grained-activation-offloading"):
        return why
    if job.training.lora is not None:
        return "offloading under LoRA fine-tuning (training.lora) is not modelled"
    if layout.recompute == "full":
        return "full recomputation keeps the layer inputs alone: offload with recompute none or selective"
    if not job.model.is_moe and (experts := [m for m in modules if m in ("expert_fc1", "moe_act")]):
        return f"{experts[0]} needs a mixture-of-experts model, {job.model.name} is dense"
    recomputed = selective_modules(layout)
    if both := [m for m in modules if _RECOMPUTED_TOO.get(m) in recomputed]:
        return f"{both[0]} is recomputed too ({_RECOMPUTED_TOO[both[0]]}): offload or recompute it"
    return ""


def _activation_offload_choices(job: Job, layout: _ActivationsOffloaded) -> list[Offloaded]:
    """The space's module sets the layout can run, off first; off alone where none can."""
    wanted = job.space.offload_modules
    if wanted == (None,):
        return _OFF
    runs = [m for m in wanted if m is None or not _activation_offload_refusal(job, layout, m)]
    return runs or _OFF


#: The choices when the space offloads nothing (shared: only read).
_OFF: list[Offloaded] = [None]


def _activation_offload_runs(job: Job, plan: _ActivationsOffloaded) -> None:
    if (modules := plan.offload_modules) and (
        why := _activation_offload_refusal(job, plan, modules)
    ):
        raise LayoutError("plan.offload_modules", ",".join(modules), why)


def _activation_offload_megatron(training: TrainingSpec, plan: _ActivationsOffloaded) -> list[Flag]:
    if not (modules := plan.offload_modules):
        return []
    return [
        ("--fine-grained-activation-offloading", None),
        ("--offload-modules", " ".join(modules)),
    ]


#: Priced by :func:`pipette_cp.cost.stack.offload.offload_savings`: the bytes a layer no
#: longer keeps (:func:`pipette_cp.cost.memory.activations.kept_layer_bytes`) and the
#: host copies not hidden behind the layer's compute
#: (:func:`pipette_cp.cost.compute.model_chunks.layer_times`).
ACTIVATION_OFFLOAD: Knob[_ActivationsOffloaded] = Knob(
    name="offload_modules",
    choices=_activation_offload_choices,
    rules=(Rule(Phase.SCHEDULE, _activation_offload_runs),),
    label=lambda plan: (f"off:{'+'.join(m)}",) if (m := plan.offload_modules) else (),
    megatron=_activation_offload_megatron,
    lightest=lambda space: space.offload_modules,
    solve_flags=(
        SpaceFlag(
            "offload_modules",
            "--offload-modules",
            "Activation offloading to try: none or module sets joined by +, e.g. "
            "none,core_attn+attn_proj (attn_norm, core_attn, attn_proj, mlp_norm, expert_fc1, "
            "moe_act) [default: none].",
            "words",
        ),
    ),
    predict_flags=(
        PlanFlag(
            "offload_modules",
            "offload_modules",
            ("--offload-modules",),
            "Modules whose saved activations go to host memory, e.g. core_attn,attn_proj "
            "(Megatron-Core --fine-grained-activation-offloading --offload-modules).",
            str,
        ),
    ),
)

KNOBS = (OPTIMIZER_OFFLOAD, ACTIVATION_OFFLOAD)
