"""What is trained (batch, sequence, precision, optimizer) and which layouts may be tried."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, ValidationInfo, field_validator, model_validator

from pipette_cp.specs._base import FrozenSpec
from pipette_cp.specs.lora import LoraSpec, framework_refusal

Precision = Literal["bf16", "fp16", "fp8", "fp4"]
#: Megatron-Core's ``--fp8-recipe`` scaling recipes (Transformer Engine's DelayedScaling,
#: Float8CurrentScaling, Float8BlockScaling, MXFP8BlockScaling).
Fp8Recipe = Literal["delayed", "tensorwise", "blockwise", "mxfp8"]
#: Megatron-Core's ``--fp8-format``: E4M3 everywhere, or E4M3 forward and E5M2 gradients.
Fp8Format = Literal["e4m3", "hybrid"]
Optimizer = Literal["adam", "sgd"]
Recompute = Literal["none", "selective", "full"]
#: Megatron-Core's ``--recompute-modules`` (``TransformerConfig.recompute_modules``) of
#: selective recomputation, in Megatron's order; its default is ``core_attn`` alone.
RecomputeModule = Literal[
    "core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"
]
RECOMPUTE_MODULES: tuple[RecomputeModule, ...] = get_args(RecomputeModule)
#: Megatron-Core's ``--offload-modules`` of fine-grained activation offloading (the
#: modules whose saved inputs go to host memory), in Megatron's order.
OffloadModule = Literal["attn_norm", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act"]
OFFLOAD_MODULES: tuple[OffloadModule, ...] = get_args(OffloadModule)
Sharding = Literal["none", "optim", "optim_grads", "optim_grads_params"]
Objective = Literal["time", "throughput-per-gpu"]
#: Megatron --moe-token-dispatcher-type (flex: DeepEP's node-deduplicating all-to-all)
Dispatcher = Literal["alltoall", "allgather", "flex"]
#: The sharding levels that shard more than the optimizer state (ZeRO-2, ZeRO-3).
GRADIENT_SHARDING: tuple[Sharding, ...] = ("optim_grads", "optim_grads_params")
AttentionKernel = Literal[
    "eager", "sdpa-math", "fused-softmax", "flash1", "flash2", "flash3", "cudnn"
]
#: The attention kernels that never store the s x s scores (FlashAttention-style).
FUSED_ATTENTION: tuple[AttentionKernel, ...] = ("flash1", "flash2", "flash3", "cudnn")

#: Upper bounds of the sizes, far above any published run (16k sequences of 1M tokens)
#: and far below what overflows the cost model or makes its simulator run for hours.
MAX_GLOBAL_BATCH_SIZE = 2**20
MAX_SEQ_LENGTH = 2**21
#: Bytes per parameter of one kind of training state (fp64 Adam would be 24).
MAX_BYTES_PER_PARAMETER = 64.0
#: Largest memory amount (headroom, runtime) in bytes: 1 PiB.
MAX_MEMORY_BYTES = float(2**50)


def module_set(value: object, modules: tuple[str, ...] = RECOMPUTE_MODULES) -> object:
    """A set of modules as given (a tuple, or text: ``core_attn,mlp``, ``core_attn+mlp`` or
    ``core_attn mlp``) in Megatron's order of ``modules`` without repeats; other values as
    they are, for the field's own validation."""
    if isinstance(value, str):
        value = [name for part in value.replace("+", ",").replace(" ", ",").split(",")
                 if (name := part.strip())]  # fmt: skip
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        order = {name: i for i, name in enumerate(modules)}
        return tuple(sorted(dict.fromkeys(value), key=lambda v: order.get(v, len(order))))
    return value


class FrameworkProfile(FrozenSpec):
    """The training framework: a catalogue name, with any of its values overridden.

    ``None`` fields take the named framework's values
    (:data:`pipette_cp.cost.stack.frameworks.FRAMEWORKS`); a name outside the catalogue
    needs every field.
    """

    name: str = Field(
        default="megatron-core",
        description="megatron-core, megatron-lm, nemo, megatron-deepspeed, "
        "megatron-deepspeed-bf16, aleph-alpha, llm-foundry, torchtitan, megatron-bridge, or a "
        "new name with every byte field and compute_efficiency given.",
    )
    compute_efficiency: float | None = Field(
        default=None,
        gt=0,
        le=2,
        description="Speed of the framework's layer compute relative to Megatron-Core's "
        "(1.0, the calibrated compute model), fitted per framework (and, where its runs "
        "cover several, per GPU family) on published runs; a value given here holds on "
        "every GPU.",
    )
    attention_efficiency: float | None = Field(
        default=None,
        gt=0,
        le=2,
        description="Speed of the framework's fused attention relative to the kernel's "
        "cited efficiency (1.0), on top of compute_efficiency; fitted where a framework "
        "runs attention its own way (llm-foundry's ALiBi attention).",
    )
    weight_bytes: float | None = Field(
        default=None,
        gt=0,
        le=MAX_BYTES_PER_PARAMETER,
        description="Bytes per parameter of the compute weights (bf16: 2).",
    )
    gradient_bytes: float | None = Field(
        default=None,
        gt=0,
        le=MAX_BYTES_PER_PARAMETER,
        description="Bytes per parameter of the gradient buffer (fp32: 4).",
    )
    master_weight_bytes: float | None = Field(
        default=None,
        ge=0,
        le=MAX_BYTES_PER_PARAMETER,
        description="Bytes per parameter of the fp32 master weights (4).",
    )
    optimizer_state_bytes: float | None = Field(
        default=None,
        ge=0,
        le=MAX_BYTES_PER_PARAMETER,
        description="Bytes per parameter of Adam's two fp32 moments (8); SGD keeps half.",
    )
    keeps_compute_weights: bool | None = Field(
        default=None,
        description="Whether full sharding (ZeRO-3) keeps a sharded compute copy of the "
        "weights beside the fp32 master (DeepSpeed ZeRO-3, Megatron: true) or casts the fp32 "
        "shard at each all-gather (PyTorch FSDP mixed precision: false).",
    )
    runtime_bytes: float | None = Field(
        default=None,
        ge=0,
        le=MAX_MEMORY_BYTES,
        description="Constant memory per GPU beyond the tensors: CUDA context, NCCL and "
        "workspaces, and the framework's communication buckets (default: the value fitted "
        "on Megatron-DeepSpeed's BLOOM runs, 5.56 GiB).",
    )
    memory_margin: float | None = Field(
        default=None,
        ge=0,
        le=2,
        description="Calibrated allowance on top of the predicted peak, as a fraction of the "
        "memory allocated per micro-batch (activations, logits, temporaries): the upper "
        "bound 'fits' is judged on.  Fitted per framework on published runs that ran out "
        "of memory; 0 where no such runs were seen.",
    )


class TrainingSpec(FrozenSpec):
    """One training job's fixed settings (what the layout search must not change)."""

    global_batch_size: int = Field(
        gt=0, le=MAX_GLOBAL_BATCH_SIZE, description="Sequences per optimizer step."
    )
    seq_length: int = Field(gt=0, le=MAX_SEQ_LENGTH, description="Tokens per sequence.")
    precision: Precision = Field(
        default="bf16",
        description="Mixed-precision compute type.  fp8: bf16 mixed precision whose "
        "transformer-layer GEMMs (QKV, attention projection, MLP) run in FP8 through "
        "Transformer Engine (Megatron --fp8-format); attention, LM head and element-wise "
        "kernels stay bf16.  fp4: the same GEMMs in NVFP4 (E2M1 values, an E4M3 scale "
        "per 16; Megatron --fp4-format e2m1 --fp4-recipe nvfp4), Blackwell only.",
    )
    fp8_recipe: Fp8Recipe | None = Field(
        default=None,
        description="FP8 scaling recipe (Megatron --fp8-recipe), only with precision fp8: "
        "delayed (amax history), tensorwise (current per-tensor scaling), blockwise "
        "(1x128 / 128x128 blocks; Hopper, Blackwell), mxfp8 (1x32 blocks; Blackwell only).  "
        "None: delayed, Megatron's default.",
    )
    fp8_format: Fp8Format | None = Field(
        default=None,
        description="FP8 format (Megatron --fp8-format), only with precision fp8: e4m3 "
        "everywhere, or hybrid (e4m3 forward, e5m2 gradients).  None: Transformer Engine's "
        "default of the recipe (hybrid for delayed and tensorwise, e4m3 for blockwise and "
        "mxfp8).",
    )
    optimizer: Optimizer = Field(
        default="adam",
        description="'adam' (Megatron mixed precision: fp32 master weights, two fp32 moments) "
        "or 'sgd' (fp32 master weights, one momentum).",
    )
    flash_attention_available: bool = Field(
        default=True,
        description="Whether FlashAttention kernels may be used on this software stack.",
    )
    attention_kernel: AttentionKernel | None = Field(
        default=None,
        description="The stack's attention kernel: fused (flash1, flash2, flash3 = "
        "FlashAttention 1/2/3; cudnn = Transformer Engine's cuDNN fused attention), used "
        "by plans with flash_attention on; or unfused (fused-softmax = Megatron's fused "
        "scale-mask-softmax; eager, sdpa-math = PyTorch's separate scale, mask, softmax "
        "and dropout kernels), used by every plan.  Plans with flash_attention off run "
        "fused-softmax unless an unfused kernel is named.  None: Megatron-Core's default, "
        "cudnn on Hopper, flash2 elsewhere.",
    )
    fused_norm: bool = Field(
        default=True,
        description="Fused LayerNorm/RMSNorm kernels (Apex or Transformer Engine, as in "
        "Megatron).  False: an RMSNorm written in PyTorch (fp32 up-cast, square, mean, "
        "rsqrt, scale, down-cast: more HBM traffic, and an fp32 copy kept for backward); "
        "PyTorch's own LayerNorm is one kernel either way.",
    )
    fused_bias_activation: bool = Field(
        default=True,
        description="Megatron's fused bias-GeLU / bias-SwiGLU kernels (--bias-gelu-fusion, "
        "--bias-swiglu-fusion, on by default).  False: the bias add and the activation (for "
        "SwiGLU: SiLU, then the product) run as separate kernels, and SwiGLU keeps the SiLU "
        "output for its backward.",
    )
    fused_cross_entropy: bool = Field(
        default=False,
        description="Megatron --cross-entropy-loss-fusion (off by default): the loss and "
        "its gradient in one pass over the bf16 logits, no fp32 copy kept.",
    )
    overlap_grad_reduce: bool = Field(
        default=False,
        description="Megatron --overlap-grad-reduce: overlap the DP gradient reduce with backward.",
    )
    overlap_param_gather: bool = Field(
        default=False,
        description="Megatron --overlap-param-gather (with the distributed optimizer).",
    )
    tp_comm_overlap: bool = Field(
        default=False,
        description="Megatron --tp-comm-overlap: overlap tensor-parallel collectives with GEMMs.",
    )
    dropout: bool = Field(
        default=True, description="Whether dropout masks are kept (Korthikanti et al. assume so)."
    )
    moe_load_imbalance: float = Field(
        default=1.0,
        ge=1.0,
        le=64.0,
        description="Mixture-of-experts load imbalance, dimensionless: tokens of the busiest "
        "expert-parallel rank over the even share (1: perfectly balanced routing; the step "
        "waits for the busiest rank).  Ignored with a capacity factor (padded to capacity).",
    )
    moe_token_dispatcher: Dispatcher = Field(
        default="alltoall",
        description="How tokens reach their experts (Megatron --moe-token-dispatcher-type): "
        "alltoall over the expert-parallel group, allgather of every token, or flex (DeepEP: "
        "a token bound for several experts on one remote node crosses the network once).",
    )
    moe_grouped_gemm: bool = Field(
        default=True,
        description="Megatron --moe-grouped-gemm: one grouped GEMM over a rank's local experts "
        "instead of one GEMM per expert.",
    )
    moe_pad_to_capacity: bool = Field(
        default=False,
        description="Megatron --moe-pad-expert-input-to-capacity: with a capacity factor every "
        "expert computes its full capacity (padded) whatever it receives.",
    )
    memory_headroom_bytes: float | None = Field(
        default=None,
        gt=0,
        le=MAX_MEMORY_BYTES,
        description="Memory kept free on every GPU, bytes (or memory_headroom_fraction; "
        "neither: 2 % of the GPU's memory, at least 1 GiB).",
    )
    memory_headroom_fraction: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="Memory kept free on every GPU, a fraction of its memory.",
    )
    framework: FrameworkProfile = Field(
        default_factory=FrameworkProfile,
        description="The training framework (a name, or a mapping of FrameworkProfile "
        "fields): state bytes per parameter and compute speed.",
    )
    lora: LoraSpec | None = Field(
        default=None,
        description="LoRA fine-tuning (Megatron-Bridge / NeMo PEFT): frozen base weights and "
        "low-rank adapters (rank, alpha, target_modules) on the layers' linears; None: "
        "every weight trained.",
    )

    @field_validator("lora")
    @classmethod
    def _lora_framework(cls, value: LoraSpec | None, info: ValidationInfo) -> LoraSpec | None:
        framework = info.data.get("framework")
        why = None if value is None or framework is None else framework_refusal(framework.name)
        if why:
            raise ValueError(why)
        return value

    @model_validator(mode="after")
    def _one_headroom(self) -> TrainingSpec:
        if self.memory_headroom_bytes is not None and self.memory_headroom_fraction is not None:
            raise ValueError("give memory_headroom_bytes or memory_headroom_fraction, not both")
        return self

    @field_validator("fp8_recipe", "fp8_format")
    @classmethod
    def _only_with_fp8(cls, value: str | None, info: ValidationInfo) -> str | None:
        precision = info.data.get("precision")
        if value is not None and precision is not None and precision != "fp8":
            raise ValueError(f"only with precision fp8 (precision is {precision})")
        return value

    @field_validator("framework", mode="before")
    @classmethod
    def _framework_by_name(cls, value: object) -> object:
        return {"name": value} if isinstance(value, str) else value


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
        default=(1, 2, 4),
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
