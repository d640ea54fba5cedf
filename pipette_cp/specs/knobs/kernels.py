"""The kernel knobs: the attention kernel (FlashAttention on / off) and fused norms."""

from __future__ import annotations

from typing import Protocol

from pipette_cp.errors import LayoutError
from pipette_cp.specs.knobs.base import Degrees, Job, Knob, Phase, PlanFlag, Rule
from pipette_cp.specs.training import FUSED_ATTENTION, AttentionKernel


# ------------------------------------------------------------------------ attention
class _Attention(Degrees, Protocol):
    @property
    def flash_attention(self) -> bool: ...
    @property
    def attention_kernel(self) -> AttentionKernel | None: ...


_KERNELS: tuple[AttentionKernel, ...] = (
    "eager", "sdpa-math", "fused-softmax", "flash1", "flash2", "flash3", "cudnn",
)  # fmt: skip


def _attention_choices(job: Job, layout: Degrees) -> list[tuple[bool, AttentionKernel | None]]:
    """(flash_attention, attention_kernel) pairs: the space's kernels, or the stack's
    kernel with the space's FlashAttention on / off where the stack has it; only fused
    ones with context parallelism (whose ring runs in Transformer Engine's attention).
    Kernels the cluster's GPUs cannot run are refused before the search
    (:func:`pipette_cp.search.space.check_kernels`)."""
    space, training = job.space, job.training
    if space.attention_kernel is None:
        fused = training.attention_kernel in (None, *FUSED_ATTENTION)
        available = training.flash_attention_available and fused
        flash = [f for f in space.flash_attention if available or not f] or [False]
        pairs: list[tuple[bool, AttentionKernel | None]] = [(f, None) for f in flash]
    else:
        pairs = [(k in FUSED_ATTENTION, k) for k in space.attention_kernel]
    return pairs if layout.cp == 1 else [(fa, k) for fa, k in pairs if fa]


def _context_needs_fused(job: Job, plan: _Attention) -> None:
    if (
        plan.cp > 1 and not plan.flash_attention
    ):  # Megatron-Core's CP runs inside TE's fused attention
        raise LayoutError("plan.flash_attention", False, f"cp={plan.cp} needs a fused attention "
                          "kernel (Transformer Engine's context-parallel attention)")  # fmt: skip


def _attention_label(plan: _Attention) -> tuple[str, ...]:
    off = ("nofa",) if not plan.flash_attention else ()
    return off if plan.attention_kernel is None else (*off, plan.attention_kernel)


#: Megatron's ``--attention-backend`` names the kernel the stack resolves on the GPU
#: (:func:`pipette_cp.report.megatron.flags.attention_args`, through the cost model's
#: kernel table), so it is exported there.  Further rules that need the GPUs (latent
#: attention, windows and sinks per kernel) are the cost model's
#: (:func:`pipette_cp.cost.stack.attention_variants.check_attention_variants`).
ATTENTION: Knob[_Attention] = Knob(
    name="attention",
    fields=("flash_attention", "attention_kernel"),
    choices=_attention_choices,
    rules=(Rule(Phase.CONTEXT, _context_needs_fused),),
    label=_attention_label,
    lightest=lambda space: [(f, None) for f in space.flash_attention or (True, False)],
    predict_flags=(
        PlanFlag(
            "flash_attention",
            "flash_attn",
            ("--flash-attn/--no-flash-attn",),
            "FlashAttention.",
            bool,
            True,
        ),
        PlanFlag(
            "attention_kernel",
            "attention_kernel",
            (),
            "Attention kernel of this plan (overrides --flash-attn and the stack's).",
            _KERNELS,
        ),
    ),
)


# ---------------------------------------------------------------------- fused norm
class _Norm(Protocol):
    @property
    def fused_norm(self) -> bool | None: ...


def _norm_choices(job: Job, layout: Degrees) -> list[bool | None]:
    """The space's settings for RMSNorm models (PyTorch's LayerNorm is one kernel either
    way), else the training stack's (None)."""
    if job.space.fused_norm is not None and job.model.norm == "rmsnorm":
        return list(job.space.fused_norm)
    return [None]


#: No Megatron flag: Megatron's norms are fused (Transformer Engine or Apex).
FUSED_NORM: Knob[_Norm] = Knob(
    name="fused_norm",
    choices=_norm_choices,
    label=lambda plan: ("nofusednorm",) if plan.fused_norm is False else (),
)

KNOBS = (ATTENTION, FUSED_NORM)
