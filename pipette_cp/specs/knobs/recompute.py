"""The recomputation knob: none, selective (with Megatron-Core's named modules) or full."""

from __future__ import annotations

import functools
from typing import Protocol

from pipette_cp.errors import LayoutError
from pipette_cp.specs.knobs.base import Flag, Job, Knob, Phase, PlanFlag, Rule, SpaceFlag
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.search_space import SearchSpace
from pipette_cp.specs.training import Recompute, RecomputeModule, TrainingSpec

#: The frameworks whose selective recomputation is Megatron-Core's modules.
MEGATRON_CORE = ("megatron-core", "megatron-lm", "nemo", "megatron-bridge")


class _Recomputed(Protocol):
    @property
    def recompute(self) -> Recompute: ...
    @property
    def recompute_modules(self) -> tuple[RecomputeModule, ...] | None: ...


_RECOMPUTE: tuple[Recompute, ...] = ("none", "selective", "full")
_RECOMPUTE_LABEL = {"selective": "sel", "full": "full"}
Modules = tuple[RecomputeModule, ...] | None


def selective_modules(plan: _Recomputed) -> frozenset[RecomputeModule]:
    """The modules a plan's selective recomputation redoes: ``recompute_modules``, or
    Megatron's default ``core_attn``; none without selective recomputation."""
    if plan.recompute != "selective":
        return frozenset()
    return frozenset(plan.recompute_modules or ("core_attn",))


def _module_refusal(model: ModelSpec, training: TrainingSpec, module: RecomputeModule) -> str:
    """Why ``module`` cannot be recomputed for this model and training ('' if it can):
    the modules it must have (Megatron-Core's ``TransformerConfig``: ``moe_act`` needs
    the grouped GEMM, ``mla_up_proj`` latent attention, ``moe_act`` and ``layernorm``
    refuse FP8 delayed scaling)."""
    name = model.name
    if module in ("moe", "moe_act", "shared_experts") and not model.is_moe:
        return f"{module} needs a mixture-of-experts model, {name} is dense"
    if module == "mlp" and not model.num_dense_layers:
        return f"mlp recomputes dense MLP layers, {name} has none (moe recomputes its experts)"
    if module == "shared_experts" and not model.num_shared_experts:
        return f"shared_experts needs shared experts, {name} has none"
    if module == "moe_act" and not training.moe_grouped_gemm:
        return "moe_act needs moe_grouped_gemm (Megatron)"
    if module == "mla_up_proj" and not model.is_mla:
        return f"mla_up_proj needs latent attention, {name} has none"
    if module == "layernorm" and not (model.is_moe or model.is_mla):
        return (f"layernorm recomputes the norms not fused into a GEMM (mixture-of-experts and "
                f"latent-attention layers), {name} has none")  # fmt: skip
    delayed = training.precision == "fp8" and (training.fp8_recipe or "delayed") == "delayed"
    if module in ("moe_act", "layernorm") and delayed:
        return f"{module} does not run with FP8 delayed scaling (Megatron)"
    return ""


def _modules_refusal(job: Job, modules: tuple[RecomputeModule, ...]) -> str:
    if (framework := job.training.framework.name) not in MEGATRON_CORE:
        known = ", ".join(MEGATRON_CORE)
        return f"are Megatron-Core's (framework {known}), not {framework}"
    return next((why for m in modules if (why := _module_refusal(job.model, job.training, m))), "")


@functools.cache
def _plain(granularities: tuple[Recompute, ...]) -> list[tuple[Recompute, Modules]]:
    return [(g, None) for g in granularities]


def _recompute_choices(job: Job, layout: object) -> list[tuple[Recompute, Modules]]:
    """Each granularity of the space; selective once per module set of the space the
    job can run (Megatron's default when the space names none, or none of them runs)."""
    if job.space.recompute_modules is None:
        return _plain(job.space.recompute)  # shared: the search only reads it
    out: list[tuple[Recompute, Modules]] = []
    for granularity in job.space.recompute:
        if granularity != "selective":
            out.append((granularity, None))
            continue
        sets = [None if m == ("core_attn",) else m for m in job.space.recompute_modules or ()
                if not _modules_refusal(job, m)]  # fmt: skip
        out += [("selective", m) for m in dict.fromkeys(sets or [None])]
    return out


def _modules_run(job: Job, plan: _Recomputed) -> None:
    if (modules := plan.recompute_modules) is None:
        return
    shown = ",".join(modules)
    if plan.recompute != "selective":
        raise LayoutError("plan.recompute_modules", shown,
                          f"only with recompute selective, recompute is {plan.recompute}")  # fmt: skip
    if why := _modules_refusal(job, modules):
        raise LayoutError("plan.recompute_modules", shown, why)


def _recompute_label(plan: _Recomputed) -> tuple[str, ...]:
    if plan.recompute == "none":
        return ()
    label = _RECOMPUTE_LABEL[plan.recompute]
    return (f"{label}:{'+'.join(plan.recompute_modules)}",) if plan.recompute_modules else (label,)


def _recompute_megatron(training: TrainingSpec, plan: _Recomputed) -> list[Flag]:
    if plan.recompute == "selective":
        modules = [("--recompute-modules", " ".join(m))] if (m := plan.recompute_modules) else []
        return [("--recompute-granularity", "selective"), *modules]
    if plan.recompute == "full":
        return [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                ("--recompute-num-layers", "1")]  # fmt: skip
    return []


def _lightest(space: SearchSpace) -> list[tuple[Recompute, Modules]]:
    granularities = space.recompute or _RECOMPUTE
    sets = space.recompute_modules if "selective" in granularities else None
    return [(g, None) for g in granularities] + [("selective", m) for m in sets or ()]


#: Priced by :mod:`pipette_cp.cost.memory.activations` and
#: :mod:`pipette_cp.cost.memory.recompute` (what a layer keeps),
#: :func:`pipette_cp.cost.compute.model_chunks.layer_times` and
#: :mod:`pipette_cp.cost.compute.recompute_time` (what its backward redoes).
RECOMPUTE: Knob[_Recomputed] = Knob(
    name="recompute",
    fields=("recompute", "recompute_modules"),
    choices=_recompute_choices,
    rules=(Rule(Phase.SCHEDULE, _modules_run),),
    label=_recompute_label,
    megatron=_recompute_megatron,
    lightest=_lightest,
    solve_flags=(
        SpaceFlag(
            "recompute_modules",
            "--recompute-modules",
            "Module sets of selective recomputation to try, each joined by +, e.g. "
            "core_attn,core_attn+mlp (core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, "
            "shared_experts) [default: core_attn].",
            "words",
        ),
    ),
    predict_flags=(
        PlanFlag("recompute", "recompute", (), "Activation recomputation.", _RECOMPUTE, "none"),
        PlanFlag(
            "recompute_modules",
            "recompute_modules",
            ("--recompute-modules",),
            "Modules selective recomputation redoes, e.g. core_attn,mlp (Megatron-Core "
            "--recompute-modules; needs --recompute selective) [default: core_attn].",
            str,
        ),
    ),
)
