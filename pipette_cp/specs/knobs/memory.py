"""The memory knobs: sequence parallelism, recomputation (:mod:`.recompute`), data-parallel
sharding and the precision-aware optimizer."""

from __future__ import annotations

from typing import Protocol

from pipette_cp.errors import LayoutError
from pipette_cp.specs.knobs.base import (
    Degrees,
    Flag,
    Job,
    Knob,
    Phase,
    PlanFlag,
    Rule,
    SpaceFlag,
    switch,
)
from pipette_cp.specs.knobs.recompute import MEGATRON_CORE, RECOMPUTE
from pipette_cp.specs.training import GRADIENT_SHARDING, Sharding, TrainingSpec


# ------------------------------------------------------------- sequence parallelism
class _SequenceParallel(Degrees, Protocol):
    @property
    def sequence_parallel(self) -> bool: ...


def _sp_choices(job: Job, layout: Degrees) -> list[bool]:
    """On / off where tp > 1 (without tensor parallelism it is the same as off); on only
    for a mixture-of-experts model with tp > 1 (Megatron's rule)."""
    if job.model.is_moe and layout.tp > 1:
        return [True]
    return sorted({sp and layout.tp > 1 for sp in job.space.sequence_parallel}, reverse=True)


def _sp_with_experts(job: Job, plan: _SequenceParallel) -> None:
    if job.model.is_moe and plan.tp > 1 and not plan.sequence_parallel:
        raise LayoutError("plan.sequence_parallel", False, f"a mixture-of-experts model with "
                          f"tp={plan.tp} needs sequence_parallel (Megatron)")  # fmt: skip


def _sp_megatron(training: TrainingSpec, plan: _SequenceParallel) -> list[Flag]:
    """``--sequence-parallel`` with tensor parallelism only (Megatron turns it off at tp 1)."""
    return [("--sequence-parallel", None)] if plan.sequence_parallel and plan.tp > 1 else []


SEQUENCE_PARALLEL: Knob[_SequenceParallel] = Knob(
    name="sequence_parallel",
    choices=_sp_choices,
    rules=(Rule(Phase.EXPERT_TENSOR, _sp_with_experts),),
    label=lambda plan: ("sp",) if plan.sequence_parallel else (),
    megatron=_sp_megatron,
    predict_flags=(
        PlanFlag(
            "sequence_parallel",
            "sp",
            ("--sp/--no-sp",),
            "Sequence parallelism [default: on where tp > 1, as solve tries first].",
            bool,
            auto=lambda degrees: degrees["tp"] > 1,
        ),
    ),
)


# ------------------------------------------------------------ data-parallel sharding
class _Sharded(Degrees, Protocol):
    @property
    def distributed_optimizer(self) -> bool: ...
    @property
    def dp_sharding(self) -> Sharding | None: ...
    @property
    def dp_shard_size(self) -> int | None: ...
    @property
    def sharding(self) -> Sharding: ...
    @property
    def shard_group(self) -> int: ...
    @property
    def hybrid(self) -> bool: ...
    @property
    def replicas(self) -> int: ...


_SHARDINGS: tuple[Sharding, ...] = ("none", "optim", "optim_grads", "optim_grads_params")
#: Layout labels of the sharding levels (none has none).
_SHARDING_LABEL = {"optim": "do", "optim_grads": "zero2", "optim_grads_params": "zero3"}


def _sharding_levels(job: Job, replicas: int, pp: int) -> list[Sharding]:
    """The levels worth trying: ``space.dp_sharding`` (or, when unset, none/optim from
    ``space.distributed_optimizer``); every level needs dp x cp > 1, gradient sharding
    also pp = 1; most sharded first."""
    space = job.space
    if space.dp_sharding is None:
        wanted: list[Sharding] = ["optim" if do else "none" for do in space.distributed_optimizer]
    else:
        wanted = list(space.dp_sharding)
    # LoRA: sharding gradients or parameters not modelled (_sharding_with_lora)
    gradients_ok = job.training.lora is None
    ok = [
        level
        for level in wanted
        if level == "none"
        or (replicas > 1 and (level not in GRADIENT_SHARDING or (pp == 1 and gradients_ok)))
    ]
    rank = ("optim_grads_params", "optim_grads", "optim", "none")
    return sorted(set(ok or ["none"]), key=rank.index)


def _shard_groups(job: Job, level: Sharding, replicas: int) -> list[int | None]:
    """Shard groups of a level: all dp x cp ranks (None), and the space's HSDP sizes that
    divide them and are smaller."""
    sizes = job.space.dp_shard_size
    if level == "none" or sizes is None:
        return [None]
    return [None, *(g for g in sizes if g < replicas and replicas % g == 0)]


def _sharding_choices(job: Job, layout: Degrees) -> list[tuple[bool, Sharding, int | None]]:
    """(distributed_optimizer, dp_sharding, dp_shard_size) of every level and shard group."""
    replicas = layout.dp * layout.cp
    return [
        (level != "none", level, group)
        for level in _sharding_levels(job, replicas, layout.pp)
        for group in _shard_groups(job, level, replicas)
    ]


def _sharding_with_experts(job: Job, plan: _Sharded) -> None:
    if job.model.is_moe and plan.sharding in GRADIENT_SHARDING:
        raise LayoutError("plan.dp_sharding", plan.sharding, "sharding gradients or parameters "
                          "of a mixture-of-experts model is not modelled (use none or optim)")  # fmt: skip


def _sharding_with_lora(job: Job, plan: _Sharded) -> None:
    if job.training.lora is not None and plan.sharding in GRADIENT_SHARDING:
        raise LayoutError("plan.dp_sharding", plan.sharding, "sharding gradients or parameters "
                          "under LoRA fine-tuning (training.lora) is not modelled (use none or "
                          "optim)")  # fmt: skip


def _hybrid_groups(job: Job, plan: _Sharded) -> None:
    if (size := plan.dp_shard_size) is None:
        return
    if plan.sharding == "none":
        raise LayoutError("plan.dp_shard_size", size,
                          "hybrid sharding needs a sharding level (dp_sharding optim or above)")  # fmt: skip
    if plan.replicas % size:
        what = f"dp={plan.dp}" if plan.cp == 1 else f"dp x cp={plan.replicas}"
        raise LayoutError("plan.dp_shard_size", size, f"must divide {what}")


def _gradients_without_pipeline(job: Job, plan: _Sharded) -> None:
    # DeepSpeed: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"; the
    # gradients of every micro-batch would be reduced while the pipeline holds others.
    if plan.sharding in GRADIENT_SHARDING and plan.pp > 1:
        raise LayoutError("plan.dp_sharding", plan.sharding,
                          f"sharding gradients (optim_grads, optim_grads_params) needs pp=1, got pp={plan.pp}")  # fmt: skip


def _sharding_label(plan: _Sharded) -> tuple[str, ...]:
    level = (_SHARDING_LABEL[plan.sharding],) if plan.distributed_optimizer else ()
    return (*level, f"hsdp{plan.shard_group}") if plan.hybrid else level


def _sharding_megatron(training: TrainingSpec, plan: _Sharded) -> list[Flag]:
    """The distributed optimizer; Megatron-FSDP's names of ZeRO-2/3 (Megatron-Core >=
    0.11); HSDP as one copy of the sharded state per group of shard_group DP ranks."""
    flags: list[Flag] = (
        [("--use-distributed-optimizer", None)] if plan.distributed_optimizer else []
    )
    if plan.sharding in GRADIENT_SHARDING:
        flags += [("--use-megatron-fsdp", None),
                  ("--data-parallel-sharding-strategy", plan.sharding)]  # fmt: skip
    if plan.hybrid:
        flags.append(("--num-distributed-optimizer-instances", str(plan.dp // plan.shard_group)))
        if plan.sharding in GRADIENT_SHARDING:
            flags.append(("--outer-dp-sharding-strategy", "no_shard"))
    return flags


SHARDING: Knob[_Sharded] = Knob(
    name="sharding",
    fields=("distributed_optimizer", "dp_sharding", "dp_shard_size"),
    choices=_sharding_choices,
    rules=(
        Rule(Phase.EXPERT_STATE, _sharding_with_experts),
        Rule(Phase.SCHEDULE, _sharding_with_lora),
        Rule(Phase.SCHEDULE, _hybrid_groups),
        Rule(Phase.SCHEDULE, _gradients_without_pipeline),
    ),
    label=_sharding_label,
    key=("sharding", "shard_group"),
    megatron=_sharding_megatron,
    solve_flags=(
        SpaceFlag(
            "dp_sharding",
            "--dp-sharding",
            "Data-parallel sharding levels to try, e.g. optim,optim_grads_params "
            "(none, optim, optim_grads, optim_grads_params).",
            "words",
        ),
        SpaceFlag(
            "dp_shard_size",
            "--dp-shard-size",
            "Hybrid sharding (HSDP) shard-group sizes to try, e.g. 8.",
            "ints",
        ),
    ),
    predict_flags=(
        PlanFlag(
            "distributed_optimizer",
            "dist_opt",
            ("--dist-opt/--no-dist-opt",),
            "Distributed optimizer (ZeRO-1; solve's default space tries it first).",
            bool,
            True,
        ),
        PlanFlag(
            "dp_sharding",
            "dp_sharding",
            (),
            "Data-parallel sharding: none, optim (ZeRO-1), optim_grads (ZeRO-2), "
            "optim_grads_params (ZeRO-3); overrides --dist-opt.",
            _SHARDINGS,
        ),
        PlanFlag(
            "dp_shard_size",
            "dp_shard_size",
            ("--dp-shard-size",),
            "Hybrid sharding (HSDP): shard over groups of this many DP ranks, replicate "
            "across them [default: shard over all].",
            int,
        ),
    ),
)


# ------------------------------------------------------ precision-aware optimizer
def _precision_aware_refusal(job: Job, sharding: Sharding) -> str | None:
    """Why the precision-aware optimizer cannot run (None: it can).  Megatron-Core's
    OptimizerConfig: Adam and the distributed optimizer only; modelled for bf16 weights
    (their remainders) without Megatron-FSDP's ZeRO-2/3."""
    t = job.training
    if t.optimizer != "adam":
        return f"needs Adam (Transformer Engine's FusedAdam), training.optimizer is {t.optimizer}"
    if t.precision == "fp16":
        return "is modelled for bf16 weights (precision bf16 or fp8), precision is fp16"
    if t.framework.name not in MEGATRON_CORE:
        return f"is Megatron-Core's (framework {', '.join(MEGATRON_CORE)}), not {t.framework.name}"
    if sharding != "optim":
        return f"needs the distributed optimizer (dp_sharding optim), dp_sharding is {sharding}"
    return None


#: Priced by :func:`pipette_cp.cost.stack.frameworks.optimizer_state_bytes` (moments and
#: master weights) and :func:`~pipette_cp.cost.stack.frameworks.optimizer_update_bytes`.
PRECISION_AWARE_OPTIMIZER = switch(
    "precision_aware_optimizer",
    refusal=_precision_aware_refusal,
    megatron=[
        ("--use-precision-aware-optimizer", None),
        ("--exp-avg-dtype", "bf16"),
        ("--exp-avg-sq-dtype", "bf16"),
    ],
    label="bf16adam",
    solve_flag=(
        "--bf16-adam",
        "Precision-aware optimizer with bf16 Adam moments off / on to try: false, true or "
        "false,true (where the distributed optimizer runs) [default: false].",
    ),
    predict_flag=(
        "bf16_adam",
        "--bf16-adam/--no-bf16-adam",
        "Precision-aware optimizer with bf16 Adam moments (needs --dist-opt).",
    ),
)

KNOBS = (SEQUENCE_PARALLEL, RECOMPUTE, SHARDING, PRECISION_AWARE_OPTIMIZER)
