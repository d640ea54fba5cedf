"""A training layout (the answer) and its evaluation."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    Field,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
    model_validator,
)

from pipette_cp.specs._base import FrozenSpec
from pipette_cp.specs.knobs import knob_labels
from pipette_cp.specs.training import (
    FUSED_ATTENTION,
    OFFLOAD_MODULES,
    AttentionKernel,
    OffloadModule,
    Recompute,
    RecomputeModule,
    Sharding,
    module_set,
)

_PART = "Part of the sum (the causes add up to iteration_time_s). "


def _cause(description: str, *, signed: bool = False) -> Any:
    """A field of :class:`TimeBreakdown`: 0 unless given, >= 0 unless ``signed`` (a
    difference of schedule times, which rounding may leave a few 1e-15 s below zero)."""
    return Field(default=0.0, ge=None if signed else 0, description=_PART + description)


class TimeBreakdown(FrozenSpec):
    """An iteration's time by cause, s (``Evaluation.breakdown_s``).

    Every cause is a part of the sum: together they make ``iteration_time_s`` (to
    rounding); none is informational only.  The pipeline phase is ``compute + tp_comm +
    cp_comm + ep_comm + pp_comm + bubble`` plus, under ZeRO-2/3, the per-layer collectives
    the compute does not hide (counted in ``dp_comm``); the tail after it is the rest of
    ``dp_comm`` and ``optimizer``.
    ``bubble`` and ``dp_comm`` are differences of schedule times, so rounding may leave
    them a few 1e-15 s below zero; the others are never negative.  In JSON: an object of
    these keys (a cause missing from an older file reads as 0).
    """

    compute: float = _cause(
        "The busiest pipeline stage's forward and backward computation over the iteration, "
        "its TP, CP, EP and exposed ZeRO-2/3 collectives taken out, s."
    )
    bubble: float = _cause(
        "The rest of the pipeline phase: the busiest stage idle (warm-up, cool-down, "
        "imbalance), s; rounding may leave it a few 1e-15 s below zero.",
        signed=True,
    )
    pp_comm: float = _cause(
        "What the pipeline's point-to-point hops add: the pipeline phase less the same "
        "schedule with free hops, s."
    )
    dp_comm: float = _cause(
        "Exposed data-parallel communication: the gradient syncs (dense and expert rings) "
        "and the tied-embedding all-reduce after the pipeline, the parameter all-gather "
        "after the step, and under ZeRO-2/3 the per-layer collectives the compute does not "
        "hide, s; rounding may leave it a few 1e-15 s below zero.",
        signed=True,
    )
    tp_comm: float = _cause(
        "The busiest stage's tensor-parallel collectives over the iteration (not overlapped), s."
    )
    cp_comm: float = _cause(
        "The busiest stage's context-parallel K/V ring transfers over the iteration that its "
        "attention does not hide, s."
    )
    ep_comm: float = _cause(
        "The busiest stage's expert-parallel all-to-alls (dispatch and combine, not "
        "overlapped) over the iteration, s."
    )
    optimizer: float = _cause("The optimizer step of the slowest stage, s.")

    def items(self) -> tuple[tuple[str, float], ...]:
        """(cause, seconds) of every cause, in the order of the fields (the JSON's).

        >>> parts = TimeBreakdown(compute=1.2, bubble=0.3)
        >>> parts.bubble, [name for name, _ in parts.items()][:3]
        (0.3, ['compute', 'bubble', 'pp_comm'])
        >>> round(sum(seconds for _, seconds in parts.items()), 12)
        1.5
        """
        return tuple((name, getattr(self, name)) for name in type(self).model_fields)


class Evaluation(FrozenSpec):
    """What the cost model predicts for a plan (filled by ``pipette_cp.cost``).

    MFU counts model FLOPs only (6 N per token plus attention, no recompute);
    HFU also counts the recomputed forward passes.
    """

    iteration_time_s: float = Field(ge=0, description="Predicted time of one optimizer step, s.")
    tokens_per_s: float = Field(ge=0, description="Global batch tokens / iteration time.")
    model_tflops_per_gpu: float = Field(
        ge=0, description="Model FLOP/s per GPU / 1e12 (no recompute)."
    )
    hardware_tflops_per_gpu: float = Field(ge=0, description="Executed FLOP/s per GPU / 1e12.")
    mfu: float = Field(ge=0, description="Model FLOPs utilisation (fraction of peak).")
    hfu: float = Field(ge=0, description="Hardware FLOPs utilisation (fraction of peak).")
    memory_bytes_by_stage: tuple[float, ...] = Field(
        description="Peak memory of the most loaded GPU of each pipeline stage, bytes."
    )
    memory_bytes_max: float = Field(ge=0, description="Largest peak memory over all GPUs, bytes.")
    memory_bound_bytes_by_stage: tuple[float, ...] = Field(
        default=(),
        description="Upper bound of each stage's memory: the peak plus the framework's "
        "calibrated margin, bytes ('fits' is judged on it).",
    )
    memory_limit_bytes: float = Field(
        ge=0,
        description="Usable memory of the smallest GPU used (capacity less the headroom), bytes.",
    )
    memory_margin_bytes: float = Field(
        default=0.0,
        description="Smallest usable memory less memory bound over the stages, bytes "
        "(negative: that much too little).",
    )
    fits: bool = Field(description="Whether every stage's memory bound is within its limit.")
    breakdown_s: TimeBreakdown = Field(
        default_factory=TimeBreakdown,
        description="Iteration time by cause (compute, bubble, pp_comm, dp_comm, tp_comm, "
        "cp_comm, ep_comm, optimizer: they sum to iteration_time_s), s.",
    )
    model: str = Field(
        default="analytic", description="Which predictor made this (analytic, simulator)."
    )


class SolveInfo(FrozenSpec):
    """How the plan was found: the solver's own report."""

    method: str = Field(description="Method name from the solver registry, e.g. 'cpsat'.")
    status: str = Field(description="optimal, feasible, infeasible, timeout, heuristic.")
    objective: float | None = Field(default=None, description="Solver objective value, s.")
    bound: float | None = Field(default=None, description="Best proven lower bound, s.")
    gap: float | None = Field(default=None, ge=0, description="(objective - bound) / objective: "
                              "the placement's, for its layout and layer split.")  # fmt: skip
    wall_time_s: float = Field(default=0.0, ge=0, description="Solver wall time, s.")
    search_gap: float | None = Field(
        default=None, ge=0, description="(objective - the search's lower bound over every "
        "layout) / objective; None: the search left layouts unbounded (or no search).")  # fmt: skip


#: ids of placements built once and shared by many plans (:func:`share_placement`)
_SHARED: dict[int, tuple[tuple[int, ...], ...]] = {}


def share_placement(placement: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
    """Mark ``placement`` (a tuple of int tuples, kept alive here) as one that plans take
    as it is, without the copy validation makes: the search builds thousands of plans on
    a few placements, each megabytes at 100,000 GPUs."""
    _SHARED[id(placement)] = placement
    return placement


def _keep_shared(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    return value if _SHARED.get(id(value)) is value else handler(value)


class Plan(FrozenSpec):
    """A complete layout: degrees, knobs, layer split and GPU placement.

    ``layer_split`` lists the transformer layers of each model chunk in
    Megatron's order: virtual stage ``c * pp + s`` is chunk ``c`` of stage
    ``s``, so its length is ``pp * vpp``.  ``placement`` lists, for every
    unit ``stage * replicas + replica``, the ``tp`` GPUs that hold that unit's
    tensor-parallel ranks (in tp-rank order).  A stage has ``replicas = dp * cp``
    units in Megatron's rank order (tp-cp-dp-pp): replica ``dp_rank * cp + cp_rank``,
    so the ``cp`` units of one context-parallel ring are consecutive.  The experts of
    a mixture-of-experts layer re-split each stage's ``tp * cp * dp`` ranks as
    ``etp * ep * expert_dp`` (Megatron-Core's expert rank order, etp fastest), see
    :meth:`expert_groups`.
    """

    dp: int = Field(gt=0, description="Data-parallel size.")
    pp: int = Field(gt=0, description="Pipeline-parallel size.")
    tp: int = Field(gt=0, description="Tensor-parallel size.")
    micro_batch_size: int = Field(gt=0, description="Sequences per micro-batch.")
    cp: int = Field(
        default=1, gt=0,
        description="Context-parallel size (Megatron --context-parallel-size): every sequence "
        "is split over cp GPUs, which pass key/value chunks around a ring in attention.",
    )  # fmt: skip
    ep: int = Field(
        default=1, gt=0,
        description="Expert-parallel size (--expert-model-parallel-size): the experts of every "
        "mixture-of-experts layer are split over ep GPUs; tokens reach them by all-to-all.",
    )  # fmt: skip
    etp: int | None = Field(
        default=None, gt=0,
        description="Expert tensor-parallel size (--expert-tensor-parallel-size); None: tp, "
        "Megatron-Core's default.",
    )  # fmt: skip
    vpp: int = Field(default=1, gt=0, description="Model chunks per stage (interleaving).")
    sequence_parallel: bool = Field(default=False, description="Megatron --sequence-parallel.")
    recompute: Recompute = Field(default="none", description="Activation recomputation.")
    recompute_modules: tuple[RecomputeModule, ...] | None = Field(
        default=None,
        description="The modules selective recomputation redoes (Megatron-Core's "
        "--recompute-modules: core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, "
        "shared_experts), in Megatron's order; None: Megatron's default, core_attn alone "
        "(also what [core_attn] reads as).  Only with recompute selective.",
    )
    offload_modules: tuple[OffloadModule, ...] | None = Field(
        default=None,
        description="Megatron-Core's fine-grained activation offloading "
        "(--fine-grained-activation-offloading --offload-modules: attn_norm, core_attn, "
        "attn_proj, mlp_norm, expert_fc1, moe_act): the modules whose saved inputs go to "
        "host memory after their forward and come back before their backward; None: off.",
    )
    distributed_optimizer: bool = Field(default=False, description="ZeRO-1 optimizer sharding.")
    attention_kernel: AttentionKernel | None = Field(
        default=None,
        description="The attention kernel this plan runs (sets flash_attention: on for the "
        "fused ones); None: the training stack's (training.attention_kernel).",
    )
    fused_norm: bool | None = Field(
        default=None,
        description="Whether this plan runs fused norm kernels; None: as training.fused_norm.",
    )
    dp_sharding: Sharding | None = Field(
        default=None,
        description="Data-parallel sharding (Megatron-FSDP's names): none, optim (ZeRO-1, the "
        "distributed optimizer), optim_grads (ZeRO-2), optim_grads_params (ZeRO-3 / FSDP); "
        "None: none or optim as distributed_optimizer says.",
    )
    dp_shard_size: int | None = Field(
        default=None,
        gt=0,
        description="Hybrid sharding (HSDP): the sharded state is split over groups of this "
        "many consecutive data-parallel ranks and replicated across the dp / dp_shard_size "
        "groups (Megatron --num-distributed-optimizer-instances = dp / dp_shard_size; PyTorch "
        "FSDP HYBRID_SHARD); None: over all dp ranks.",
    )
    precision_aware_optimizer: bool = Field(
        default=False,
        description="Megatron-Core's precision-aware optimizer with bf16 Adam moments "
        "(--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16): "
        "Transformer Engine's FusedAdam keeps both moments in bf16 and the fp32 master "
        "weights as the 16 bits the bf16 weights lack (store_param_remainders); needs the "
        "distributed optimizer and Adam.",
    )
    fp8_param_gather: bool = Field(
        default=False,
        description="Megatron's --fp8-param-gather (FP8 primary weights, Transformer Engine's "
        "fp8_model_init): the layer GEMM weights kept in FP8 only (no bf16 copy), gathered "
        "by the distributed optimizer in FP8; needs precision fp8 and dp_sharding optim.",
    )
    grad_reduce_in_bf16: bool = Field(
        default=False,
        description="Megatron's --grad-reduce-in-bf16: the main gradients kept, accumulated "
        "and reduced over the data-parallel ranks in bf16 (2 B per parameter instead of "
        "the fp32 4 B, half the reduce-scatter / all-reduce bytes).",
    )
    optimizer_offload_fraction: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="Megatron-Core's optimizer CPU offload (--optimizer-cpu-offload "
        "--optimizer-offload-fraction): the fraction of each GPU's optimizer shard (fp32 "
        "master weights and Adam moments) kept and updated on the host; 0: off.  Needs the "
        "distributed optimizer and Adam.",
    )
    flash_attention: bool = Field(default=True, description="FlashAttention kernels.")
    layer_split: tuple[int, ...] = Field(description="Layers per model chunk, length pp * vpp.")
    placement: Annotated[tuple[tuple[int, ...], ...], WrapValidator(_keep_shared)] = Field(
        description="GPUs of each unit (stage * dp + replica), tp of them each."
    )
    instance: str = Field(
        default="", description="Name or path of the instance the plan was made for."
    )
    evaluation: Evaluation | None = Field(default=None, description="Predicted performance.")
    solve_info: SolveInfo | None = Field(default=None, description="How the plan was found.")

    @field_validator("recompute_modules", mode="before")
    @classmethod
    def _module_set(cls, value: object) -> object:
        return module_set(value)

    @field_validator("offload_modules", mode="before")
    @classmethod
    def _offload_set(cls, value: object) -> object:
        modules = None if value == "none" else module_set(value, OFFLOAD_MODULES)
        if modules == ():
            raise ValueError("must name at least one module (or be left out)")
        return modules

    @field_validator("recompute_modules")
    @classmethod
    def _default_modules(
        cls, value: tuple[RecomputeModule, ...] | None
    ) -> tuple[RecomputeModule, ...] | None:
        if value == ():
            raise ValueError("must name at least one module (or be left out)")
        return None if value == ("core_attn",) else value

    @model_validator(mode="before")
    @classmethod
    def _sharding_sets_distributed_optimizer(cls, data: object) -> object:
        """A given ``dp_sharding`` decides ``distributed_optimizer`` (on from optim up), a
        given ``attention_kernel`` decides ``flash_attention`` (on for the fused ones)."""
        if isinstance(data, dict) and data.get("dp_sharding") is not None:
            data = {**data, "distributed_optimizer": data["dp_sharding"] != "none"}
        if isinstance(data, dict) and data.get("attention_kernel") is not None:
            data = {**data, "flash_attention": data["attention_kernel"] in FUSED_ATTENTION}
        return data

    @model_validator(mode="after")
    def _shapes(self) -> Plan:
        if len(self.layer_split) != self.pp * self.vpp:
            raise ValueError(
                f"layer_split has {len(self.layer_split)} entries, expected pp*vpp="
                f"{self.pp}*{self.vpp}={self.pp * self.vpp}"
            )
        if any(n < 0 for n in self.layer_split):
            raise ValueError(f"layer_split has a negative entry: {self.layer_split}")
        if len(self.placement) != self.pp * self.replicas:
            expected = f"pp*dp={self.pp * self.dp}" if self.cp == 1 else \
                f"pp*dp*cp={self.pp * self.replicas}"  # fmt: skip
            raise ValueError(f"placement has {len(self.placement)} units, expected {expected}")
        for unit, gpus in enumerate(self.placement):
            if len(gpus) != self.tp:
                raise ValueError(
                    f"placement unit {unit} has {len(gpus)} GPUs, expected tp={self.tp}"
                )
        return self

    @property
    def sharding(self) -> Sharding:
        """The data-parallel sharding level (``dp_sharding``, or from the distributed optimizer)."""
        if not self.distributed_optimizer:
            return "none"
        return self.dp_sharding if self.dp_sharding not in (None, "none") else "optim"

    @property
    def shard_group(self) -> int:
        """Replicas that share one copy of the sharded state (dp * cp unless HSDP: Megatron
        shards and reduces gradients over the data- and context-parallel ranks together)."""
        if self.sharding == "none" or self.dp_shard_size is None:
            return self.replicas
        return self.dp_shard_size

    @property
    def hybrid(self) -> bool:
        """Whether the sharded state is replicated across several shard groups (HSDP)."""
        return self.shard_group < self.replicas

    @property
    def replicas(self) -> int:
        """Units per pipeline stage: ``dp * cp`` (each holds the stage's tp ranks)."""
        return self.dp * self.cp

    @property
    def placement_shape(self) -> tuple[int, int, int]:
        """(pp, replicas, tp): what a placement of this plan fits (plans of one shape
        can swap placements)."""
        return self.pp, self.replicas, self.tp

    @property
    def expert_tp(self) -> int:
        """Expert tensor-parallel size (``etp``, or ``tp`` when unset)."""
        return self.tp if self.etp is None else self.etp

    @property
    def expert_dp(self) -> int:
        """Expert data-parallel size: ``tp * cp * dp / (ep * etp)`` (Megatron-Core);
        0 when ``ep * etp`` does not divide the stage's ranks (an invalid layout)."""
        ranks, group = self.tp * self.cp * self.dp, self.ep * self.expert_tp
        return ranks // group if ranks % group == 0 else 0

    @property
    def num_gpus(self) -> int:
        return self.dp * self.cp * self.pp * self.tp

    def unit_gpus(self, stage: int, replica: int) -> tuple[int, ...]:
        """GPUs of the unit holding ``stage`` of ``replica`` (``dp_rank * cp + cp_rank``)."""
        return self.placement[stage * self.replicas + replica]

    def cp_groups(self) -> list[list[int]]:
        """Stage-local rank positions ``replica * tp + tp_rank`` of every context-parallel
        ring (one per dp rank and tp rank), in ring order."""
        tp, cp = self.tp, self.cp
        return [
            [(d * cp + c) * tp + t for c in range(cp)] for d in range(self.dp) for t in range(tp)
        ]

    def expert_groups(self) -> list[list[int]]:
        """Stage-local rank positions of every expert-parallel group (one per expert
        data-parallel rank and expert tensor rank): position ``etp_rank + etp * (ep_rank +
        ep * edp_rank)`` of the stage's ``tp * cp * dp`` ranks, Megatron-Core's order."""
        etp, ep = self.expert_tp, self.ep
        return [
            [t + etp * (e + ep * d) for e in range(ep)]
            for d in range(self.expert_dp)
            for t in range(etp)
        ]

    def stage_layers(self, stage: int) -> int:
        """Transformer layers on ``stage`` over all its chunks."""
        return sum(self.layer_split[c * self.pp + stage] for c in range(self.vpp))

    def layout(self) -> str:
        """Short label, e.g. 'dp4-pp2-tp8-mb1-vpp2-sp-sel-do' or 'dp2-pp4-tp2-cp2-ep8-mb1-sp':
        the degrees, then every knob's part (:func:`pipette_cp.specs.knobs.knob_labels`)."""
        parts = [f"dp{self.dp}", f"pp{self.pp}", f"tp{self.tp}"]
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        if self.etp is not None and self.etp != self.tp:
            parts.append(f"etp{self.etp}")
        parts.extend(knob_labels(self))
        return "-".join(parts)
