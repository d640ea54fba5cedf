"""LoRA fine-tuning (low-rank adapters on frozen weights) as a property of the job:
:class:`LoraSpec`, the ``training.lora`` field of
:class:`~pipette_cp.specs.training.TrainingSpec` (``None``: every weight trained).

What it means, as Megatron-Bridge's PEFT runs it (``src/megatron/bridge/peft/lora.py``,
``LoRA``; ``docs/training/peft.md``; Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large
Language Models"): the base weights are frozen (no gradient, no optimizer state, no
weight-gradient GEMM); each target linear of in-width ``a`` and out-width ``b`` gets an
adapter ``A`` (``a x r``) and ``B`` (``r x b``), ``r (a + b)`` trained parameters, whose
output ``alpha / r x B A x`` is added to the linear's.  The cost model's terms live in
:mod:`pipette_cp.cost.workload.lora`.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, field_validator

from pipette_cp.specs._base import FrozenSpec

#: Megatron-Bridge's names of the linears an adapter may wrap (``LoRA.target_modules``):
#: the fused QKV projection, the attention output projection, the MLP's FC1 and FC2.
LoraTarget = Literal["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]
LORA_TARGETS: tuple[LoraTarget, ...] = get_args(LoraTarget)
#: Largest adapter rank accepted: far above any published run (ranks of 4 to 256) and
#: below what overflows the cost model.
MAX_LORA_RANK = 2**16
#: Catalogue frameworks (:data:`pipette_cp.cost.stack.frameworks.FRAMEWORKS`) without
#: LoRA fine-tuning: Megatron-LM's own scripts and argument parser (LoRA lives in
#: Megatron-Bridge and NeMo), Megatron-DeepSpeed, Aleph Alpha's trainer, llm-foundry's
#: pretraining benchmarks and torchtitan (none has a PEFT path the cost model knows).
NO_LORA_FRAMEWORKS = (
    "megatron-lm", "megatron-deepspeed", "megatron-deepspeed-bf16", "aleph-alpha",
    "llm-foundry", "torchtitan",
)  # fmt: skip


def _names(value: object) -> object:
    """Target modules as given (a list, or text: ``linear_qkv,linear_proj``) as a tuple in
    :data:`LORA_TARGETS`' order without repeats; other values as they are."""
    if isinstance(value, str):
        value = [name for part in value.replace("+", ",").split(",") if (name := part.strip())]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        order = {name: i for i, name in enumerate(LORA_TARGETS)}
        return tuple(sorted(dict.fromkeys(value), key=lambda v: order.get(v, len(order))))
    return value


class LoraSpec(FrozenSpec):
    """LoRA adapters on frozen base weights (defaults: Megatron-Bridge's ``LoRA``)."""

    rank: int = Field(
        default=32,
        gt=0,
        le=MAX_LORA_RANK,
        description="Adapter rank r (Megatron-Bridge's LoRA dim; default 32).",
    )
    alpha: float = Field(
        default=32.0,
        gt=0,
        description="Scale of the adapter output, alpha / r (default 32); it changes no cost.",
    )
    target_modules: tuple[str, ...] = Field(
        default=LORA_TARGETS,
        description="Linears of every transformer layer that carry an adapter: linear_qkv, "
        "linear_proj, linear_fc1, linear_fc2 (default: all four).",
    )

    @field_validator("target_modules", mode="before")
    @classmethod
    def _as_names(cls, value: object) -> object:
        return _names(value)

    @field_validator("target_modules")
    @classmethod
    def _known(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError(f"must name at least one of {', '.join(LORA_TARGETS)}")
        if unknown := [name for name in value if name not in LORA_TARGETS]:
            raise ValueError(f"unknown module {unknown[0]!r}; allowed: {', '.join(LORA_TARGETS)}")
        return value


def framework_refusal(framework: str) -> str | None:
    """Why ``framework`` cannot run LoRA (None: it can: Megatron-Bridge, NeMo, Megatron-Core
    as they drive it, or a user-defined framework)."""
    if framework not in NO_LORA_FRAMEWORKS:
        return None
    return (
        f"framework {framework!r} has no LoRA fine-tuning; use megatron-bridge, nemo or "
        "megatron-core (or drop training.lora)"
    )
