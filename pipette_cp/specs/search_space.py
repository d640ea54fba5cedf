"""Which layouts may be tried: the allowed values of every layout knob."""

from __future__ import annotations

from pydantic import Field, field_validator

from pipette_cp.specs._base import FrozenSpec
from pipette_cp.specs.training import (
    OFFLOAD_MODULES,
    AttentionKernel,
    Objective,
    OffloadModule,
    Recompute,
    RecomputeModule,
    Sharding,
    module_set,
)


class SearchSpace(FrozenSpec):
    """The allowed values of every layout knob.  ``None`` means every valid value."""

    tp: tuple[int, ...] | None = Field(default=None, description="Tensor-parallel sizes.")
    pp: tuple[int, ...] | None = Field(default=None, description="Pipeline-parallel sizes.")
    dp: tuple[int, ...] | None = Field(default=None, description="Data-parallel sizes.")
    cp: tuple[int, ...] | None = Field(
        default=None,
        description="Context-parallel sizes; None: 1, and for sequences of 16,384 tokens or "
        "more also the powers of two that keep at least 4,096 tokens per GPU.",
    )
    ep: tuple[int, ...] | None = Field(
        default=None,
        description="Expert-parallel sizes; None: 1 for a dense model, every valid size for "
        "a mixture-of-experts model.",
    )
    etp: tuple[int, ...] | None = Field(
        default=None,
        description="Expert tensor-parallel sizes; None: tp (Megatron-Core's default) and 1.",
    )
    micro_batch_size: tuple[int, ...] = Field(
        default=(1, 2, 4, 8), description="Micro-batch sizes, sequences."
    )
    vpp: tuple[int, ...] = Field(
        default=(1, 2, 4, 8),
        description="Model chunks per pipeline stage (1 = plain 1F1B, >1 = interleaved 1F1B).",
    )
    sequence_parallel: tuple[bool, ...] = Field(
        default=(True, False), description="Megatron --sequence-parallel on / off."
    )
    recompute: tuple[Recompute, ...] = Field(
        default=("none", "selective", "full"), description="Activation recomputation granularity."
    )
    recompute_modules: tuple[tuple[RecomputeModule, ...], ...] | None = Field(
        default=None,
        description="Module sets of selective recomputation to try (Megatron-Core's "
        "--recompute-modules; each a list such as [core_attn, mlp], or core_attn+mlp), where "
        "the model has those modules; None: Megatron's default, core_attn alone.",
    )
    distributed_optimizer: tuple[bool, ...] = Field(
        default=(True, False), description="Megatron --use-distributed-optimizer (ZeRO-1) on / off."
    )
    flash_attention: tuple[bool, ...] = Field(
        default=(True, False),
        description="FlashAttention on / off (on only where the training spec makes it available).",
    )
    dp_sharding: tuple[Sharding, ...] | None = Field(
        default=None,
        description="Data-parallel sharding levels to try (none, optim, optim_grads, "
        "optim_grads_params); None: none and optim as distributed_optimizer allows.",
    )
    dp_shard_size: tuple[int, ...] | None = Field(
        default=None,
        description="Hybrid sharding (HSDP) shard-group sizes to try beside sharding over all "
        "dp ranks, for every sharding level above none (each dividing dp and below it; e.g. "
        "the GPUs of a node over tp); None: no hybrid sharding.",
    )
    attention_kernel: tuple[AttentionKernel, ...] | None = Field(
        default=None,
        description="Attention kernels the stack has and the search may choose among "
        "(replaces flash_attention); None: the training stack's kernel only.",
    )
    fused_norm: tuple[bool, ...] | None = Field(
        default=None,
        description="Fused norm kernels on / off to try; None: as training.fused_norm.",
    )
    precision_aware_optimizer: tuple[bool, ...] = Field(
        default=(False,),
        description="Megatron's precision-aware optimizer (bf16 Adam moments) off / on to try, "
        "where the distributed optimizer runs.",
    )
    fp8_param_gather: tuple[bool, ...] = Field(
        default=(False,),
        description="Megatron's --fp8-param-gather (FP8 primary weights) off / on to try, "
        "where FP8 training runs with the distributed optimizer.",
    )
    grad_reduce_in_bf16: tuple[bool, ...] = Field(
        default=(False,),
        description="Megatron's --grad-reduce-in-bf16 (main gradients in bf16) off / on to "
        "try, where the training precision is bf16 or fp8.",
    )
    optimizer_offload_fraction: tuple[float, ...] = Field(
        default=(0.0,),
        description="Fractions of the optimizer state offloaded to the host to try (Megatron-"
        "Core's --optimizer-offload-fraction, each in [0, 1]; 0: off), where the distributed "
        "optimizer runs with Adam.",
    )
    offload_modules: tuple[tuple[OffloadModule, ...] | None, ...] = Field(
        default=(None,),
        description="Fine-grained activation offloading to try (Megatron-Core's "
        "--fine-grained-activation-offloading --offload-modules): None (off) or module sets "
        "such as [core_attn, attn_proj] (attn_norm, core_attn, attn_proj, mlp_norm, "
        "expert_fc1, moe_act) whose saved inputs go to host memory.",
    )
    use_all_gpus: bool | None = Field(
        default=None,
        description="true: dp x pp x tp equals the GPUs of the nodes not excluded; false: it "
        "may also leave GPUs of one node idle; None (default): it may leave whole nodes idle "
        "(down to min_gpus, by default a few nodes: see the search's GPU totals).",
    )
    min_gpus: int | None = Field(
        default=None,
        gt=0,
        description="Fewest GPUs a layout may use (whole nodes idle in between are allowed).",
    )
    exclude_nodes: tuple[str, ...] = Field(
        default=(),
        description="Host names of nodes that hold no rank (a bad NIC, failed links).",
    )
    objective: Objective = Field(
        default="time",
        description="What the search minimises: the iteration time, or GPU-seconds per "
        "iteration (throughput-per-gpu: time x GPUs used, for cost).",
    )

    @field_validator("recompute_modules", mode="before")
    @classmethod
    def _module_sets(cls, values: object) -> object:
        if isinstance(values, (list, tuple)):
            return tuple(dict.fromkeys(module_set(v) for v in values))  # type: ignore[misc]
        return values

    @field_validator("recompute_modules")
    @classmethod
    def _named_modules(
        cls, values: tuple[tuple[RecomputeModule, ...], ...] | None
    ) -> tuple[tuple[RecomputeModule, ...], ...] | None:
        if values is not None and (not values or not all(values)):
            raise ValueError("must name at least one module set of at least one module")
        return values

    @field_validator("offload_modules", mode="before")
    @classmethod
    def _offload_sets(cls, values: object) -> object:
        if isinstance(values, (list, tuple)):
            sets = (None if v in (None, "none") else module_set(v, OFFLOAD_MODULES) for v in values)
            return tuple(dict.fromkeys(sets))  # type: ignore[misc]
        return values

    @field_validator("offload_modules")
    @classmethod
    def _named_offload_modules(
        cls, values: tuple[tuple[OffloadModule, ...] | None, ...]
    ) -> tuple[tuple[OffloadModule, ...] | None, ...]:
        if any(v is not None and not v for v in values):
            raise ValueError("a module set names at least one module (none: no offloading)")
        return values

    @field_validator("optimizer_offload_fraction")
    @classmethod
    def _fractions(cls, values: tuple[float, ...]) -> tuple[float, ...]:
        if bad := [v for v in values if not 0.0 <= v <= 1.0]:
            raise ValueError(f"fractions must lie in [0, 1], got {bad}")
        return values

    @field_validator("exclude_nodes")
    @classmethod
    def _distinct_names(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(values)) != len(values):
            raise ValueError(f"names a node twice: {list(values)}")
        return values

    @field_validator(
        "tp", "pp", "dp", "cp", "ep", "etp", "micro_batch_size", "vpp", "dp_shard_size"
    )
    @classmethod
    def _positive(cls, values: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if values is not None:
            if not values:
                raise ValueError("must not be empty (omit it to allow every value)")
            bad = [v for v in values if v <= 0]
            if bad:
                raise ValueError(f"values must be positive, got {bad}")
            return tuple(sorted(set(values)))
        return values

    @field_validator(
        "sequence_parallel",
        "recompute",
        "distributed_optimizer",
        "flash_attention",
        "dp_sharding",
        "attention_kernel",
        "fused_norm",
        "precision_aware_optimizer",
        "fp8_param_gather",
        "grad_reduce_in_bf16",
        "optimizer_offload_fraction",
        "offload_modules",
    )
    @classmethod
    def _not_empty(cls, values: tuple | None) -> tuple | None:
        if values is None:
            return None
        if not values:
            raise ValueError("must not be empty")
        return tuple(dict.fromkeys(values))
