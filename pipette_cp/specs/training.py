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
    fp8_attention: bool = Field(
        default=False,
        description="Transformer Engine's FP8 fused attention (NeMo and Megatron-Bridge "
        "fp8_dot_product_attention, MLPerf's FP8_DPA), only with precision fp8 or fp4: the "
        "attention core reads FP8 queries, keys and values and keeps them in FP8 for its "
        "backward; cuDNN's fused attention only.",
    )
    bf16_first_layers: int = Field(
        default=0,
        ge=0,
        description="Transformer layers at the start whose GEMMs stay bf16 under precision fp8 "
        "or fp4 (Megatron --first-last-layers-bf16 --num-layers-at-start-in-bf16; "
        "Megatron-Bridge's Nemotron-H providers keep 1 at each end); 0: none.",
    )
    bf16_last_layers: int = Field(
        default=0,
        ge=0,
        description="Transformer layers at the end whose GEMMs stay bf16 under precision fp8 or "
        "fp4 (Megatron --num-layers-at-end-in-bf16); 0: none.",
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

    @field_validator("fp8_attention", "bf16_first_layers", "bf16_last_layers")
    @classmethod
    def _quantized_only(cls, value: bool | int, info: ValidationInfo) -> bool | int:
        precision = info.data.get("precision")
        if value and precision is not None and precision not in ("fp8", "fp4"):
            raise ValueError(f"only with precision fp8 or fp4 (precision is {precision})")
        return value

    @field_validator("framework", mode="before")
    @classmethod
    def _framework_by_name(cls, value: object) -> object:
        return {"name": value} if isinstance(value, str) else value
