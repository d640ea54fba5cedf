"""Which kernels a plan runs on the software stack, and how fast the fused ones are.

The training spec names the stack's attention kernel and whether the norms are
fused (:class:`~pipette_cp.specs.training.TrainingSpec`); the plan's
``flash_attention`` chooses between the fused attention kernel and the unfused
path.  The time and memory models read the kernel through :func:`attention_kernel`
and :func:`uses_fused_attention`, so a kernel is named in one place.  FP8 training
(``training.precision``) is named here too: which GPUs run which recipe
(:func:`check_precision`), the recipe and format in effect, and the traffic of the casts
to FP8.
"""

from __future__ import annotations

from pipette_cp.cost.stack.frameworks import resolve_framework
from pipette_cp.cost.workload.latent_attention import attention_cast_elements
from pipette_cp.errors import SpecError
from pipette_cp.specs.gpu import Architecture, GpuSpec
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import (
    FUSED_ATTENTION,
    AttentionKernel,
    Fp8Format,
    Fp8Recipe,
    TrainingSpec,
)

#: Fraction of peak reached by fused attention (forward + backward) on Hopper, by kernel.
#: FlashAttention-2 reaches 35 % of H100 peak and FlashAttention-3 1.5-2.0x that
#: (Shah et al. 2024, "FlashAttention-3", sec. 1 and 4.1): 0.35 and 0.60;
#: FlashAttention-2 is about 2x FlashAttention (Dao 2023, sec. 4.1): 0.175.  cuDNN
#: (Megatron-Core's default on Hopper) takes the calibrated value of the GPU family.
HOPPER_ATTENTION_EFFICIENCY: dict[str, float] = {"flash1": 0.175, "flash2": 0.35, "flash3": 0.60}
#: Elsewhere FlashAttention-2 and cuDNN take the calibrated value; FlashAttention 1 half of it.
FLASH1_RELATIVE = 0.5
#: HBM bytes per score element of the unfused softmax path, forward, without dropout:
#: Megatron's fused scale-mask-softmax reads and writes 2 B once; PyTorch's eager path
#: runs scale, mask and softmax as three kernels (read 2 B + write 2 B each).
SOFTMAX_BYTES: dict[str, float] = {"fused-softmax": 4.0, "eager": 12.0, "sdpa-math": 12.0}
#: HBM bytes per element of one RMSNorm forward: fused, read + write 2 B; written in
#: PyTorch (HF ``LlamaRMSNorm``): up-cast (2 + 4), square (4 + 4), mean (4), scale (4 + 4),
#: down-cast (4 + 2), weight (2 + 2) = 36 B.
NORM_BYTES = {True: 4.0, False: 36.0}
#: Bytes per element one norm keeps for its backward beyond the 2 B input Korthikanti et
#: al. count: the PyTorch RMSNorm keeps its fp32 up-cast (4 B) and the bf16 normalised
#: output (2 B) instead of the input (2 B): +4 B.
UNFUSED_NORM_EXTRA_BYTES = 4.0


#: HBM bytes per element of T f / t of the activation, forward.  Fused (Megatron's
#: bias-GeLU, bias-SwiGLU): GeLU reads and writes 2 B; SwiGLU reads gate and up and writes
#: the product (6 B).  Unfused: GeLU alone the same, the bias add before it another read
#: and write (4 B, only with biases); SwiGLU as SiLU (read + write) then the product
#: (read 2 x 2, write 2): 10 B.
ACTIVATION_BYTES = {("gelu", True): 4.0, ("gelu", False): 4.0, ("swiglu", True): 6.0, ("swiglu", False): 10.0}  # fmt: skip
#: Unfused SwiGLU keeps the SiLU output (2 B per element of T f / t) for the product's
#: backward; the fused kernel recomputes it from the gate.
UNFUSED_SWIGLU_EXTRA_BYTES = 2.0
#: Cross-entropy HBM bytes per logit, (forward, backward).  Megatron's vocab-parallel
#: loss: fp32 copy, max, subtract, exp, sum, divide (~38 B) and a backward of ~22 B with
#: the bf16 cast; fused (--cross-entropy-loss-fusion): two reads of the bf16 logits and
#: the gradient written over them (6 B), a scaled copy back (4 B) (assumption).
CROSS_ENTROPY_BYTES = {False: (38.0, 22.0), True: (6.0, 4.0)}
#: Bytes per logit alive at the last stage's peak: the bf16 logits and the fp32 copy the
#: unfused loss saves (6 B); the fused loss keeps only the bf16 logits (2 B).
LOGITS_KEPT_BYTES = {False: 6.0, True: 2.0}


#: Fused kernels built for NVIDIA GPUs only: FlashAttention 1 (CUDA only; the ROCm port
#: of FlashAttention starts at version 2) and Transformer Engine's cuDNN attention.
NVIDIA_ONLY_ATTENTION: tuple[AttentionKernel, ...] = ("flash1", "cudnn")
#: The kernels an error message offers instead, in this order.
ALTERNATIVES: tuple[AttentionKernel, ...] = (
    "flash2", "flash1", "cudnn", "fused-softmax", "eager", "sdpa-math"
)  # fmt: skip


def is_blackwell(gpu: GpuSpec) -> bool:
    """Whether ``gpu`` is a data-centre Blackwell part (B200, GB200, B300, GB300), by its
    ``architecture``.

    >>> from pipette_cp.specs.gpu import resolve_gpu
    >>> is_blackwell(resolve_gpu("gb300")), is_blackwell(resolve_gpu("h100"))
    (True, False)
    """
    return gpu.architecture == "blackwell"


def is_hopper(gpu: GpuSpec) -> bool:
    """Whether ``gpu`` is a Hopper part (H100, H200, H800, H20, GH200), by its
    ``architecture``: FlashAttention 3 runs only there."""
    return gpu.architecture == "hopper"


def default_attention_kernel(gpu: GpuSpec) -> AttentionKernel:
    """The kernel Megatron-Core's Transformer Engine attention runs on ``gpu`` when none is
    named: cuDNN's fused attention on Hopper and Blackwell (FlashAttention 2 supports
    Ampere, Ada and Hopper only, per its README; Transformer Engine's backend selection
    takes FusedAttention on compute capability 9.0 and 10.x), FlashAttention 2 elsewhere.

    >>> from pipette_cp.specs.gpu import resolve_gpu
    >>> [default_attention_kernel(resolve_gpu(g)) for g in ("a100", "h100", "b200", "gb300")]
    ['flash2', 'cudnn', 'cudnn', 'cudnn']
    """
    return "cudnn" if is_hopper(gpu) or is_blackwell(gpu) else "flash2"


def stack_kernel(training: TrainingSpec, gpu: GpuSpec, plan: Plan | None = None) -> AttentionKernel:
    """The attention kernel of ``plan`` (if it names one), else of the stack, on ``gpu``
    (Megatron-Core's default when neither says).

    Raises
    ------
    SpecError
        FlashAttention 3 on a GPU other than Hopper; FlashAttention 1 or cuDNN attention
        on an AMD GPU.
    """
    named = plan.attention_kernel if plan is not None else None
    kernel = named or training.attention_kernel or default_attention_kernel(gpu)
    field = "plan.attention_kernel" if named else "training.attention_kernel"
    amd = gpu.vendor != "NVIDIA"
    refused = ("flash3", *NVIDIA_ONLY_ATTENTION) if amd else ("flash3",)
    others = ", ".join(k for k in ALTERNATIVES if k not in refused)
    if kernel == "flash3" and not is_hopper(gpu):
        raise SpecError(
            field,
            kernel,
            f"FlashAttention 3 runs on Hopper GPUs (H100, H200) only, not {gpu.name}"
            f"{unknown_architecture_hint(gpu, 'hopper')}; use one of {others}",
        )
    if amd and kernel in NVIDIA_ONLY_ATTENTION:
        raise SpecError(
            field, kernel, f"runs on NVIDIA GPUs only, not {gpu.name} (AMD); use one of {others}"
        )
    return kernel


def unknown_architecture_hint(gpu: GpuSpec, needed: str) -> str:
    """What a refusal adds for a GPU of unknown architecture: how to set it (``needed``:
    the architectures the feature runs on); nothing for a known one."""
    if gpu.architecture != "unknown":
        return ""
    return (f" (its architecture is unknown: not given, and its name tells none; set "
            f"gpu.architecture to {needed} if it is one)")  # fmt: skip


def uses_fused_attention(training: TrainingSpec, plan: Plan) -> bool:
    """Whether the plan runs a fused attention kernel (no s x s scores stored)."""
    if plan.attention_kernel is not None:
        return plan.attention_kernel in FUSED_ATTENTION
    stack = training.attention_kernel
    fused = stack is None or stack in FUSED_ATTENTION
    return plan.flash_attention and training.flash_attention_available and fused


def attention_kernel(training: TrainingSpec, plan: Plan, gpu: GpuSpec) -> AttentionKernel:
    """The attention kernel ``plan`` runs on ``gpu``."""
    kernel = stack_kernel(training, gpu, plan)
    if uses_fused_attention(training, plan):
        return kernel
    return kernel if kernel not in FUSED_ATTENTION else "fused-softmax"


def fused_attention_efficiency(kernel: AttentionKernel, gpu: GpuSpec, calibrated: float) -> float:
    """Fraction of peak of a fused kernel (``calibrated``: the GPU family's fitted value,
    that of Megatron-Core's default kernel there)."""
    if is_hopper(gpu):
        return HOPPER_ATTENTION_EFFICIENCY.get(kernel, calibrated)
    return FLASH1_RELATIVE * calibrated if kernel == "flash1" else calibrated


def fused_norm(model: ModelSpec, training: TrainingSpec, plan: Plan) -> bool:
    """Whether the norms run as fused kernels (the plan's choice, else the stack's;
    PyTorch's LayerNorm is one kernel either way)."""
    fused = training.fused_norm if plan.fused_norm is None else plan.fused_norm
    return fused or model.norm != "rmsnorm"


def norm_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """HBM bytes per element of one norm's forward."""
    return NORM_BYTES[fused_norm(model, training, plan)]


def unfused_norm_extra_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """Bytes per element one norm keeps beyond its input (0 when fused)."""
    return 0.0 if fused_norm(model, training, plan) else UNFUSED_NORM_EXTRA_BYTES


def activation_bytes(model: ModelSpec, training: TrainingSpec) -> float:
    """HBM bytes per element of the activation's input, forward (fused or not)."""
    fused = training.fused_bias_activation
    if model.activation == "swiglu":
        return ACTIVATION_BYTES[("swiglu", fused)]
    bias_add = 0.0 if fused or not model.linear_bias else 4.0
    return ACTIVATION_BYTES[("gelu", fused)] + bias_add


def unfused_activation_extra_bytes(model: ModelSpec, training: TrainingSpec) -> float:
    """Bytes per element of T f / t the activation keeps beyond Korthikanti's count."""
    unfused_swiglu = model.activation == "swiglu" and not training.fused_bias_activation
    return UNFUSED_SWIGLU_EXTRA_BYTES if unfused_swiglu else 0.0


# ------------------------------------------------------------------------------ FP8
#: Transformer Engine's default format of each recipe (``transformer_engine.common.recipe``:
#: DelayedScaling and Float8CurrentScaling default to HYBRID, Float8BlockScaling and
#: MXFP8BlockScaling to E4M3).
FP8_DEFAULT_FORMAT: dict[Fp8Recipe, Fp8Format] = {
    "delayed": "hybrid", "tensorwise": "hybrid", "blockwise": "e4m3", "mxfp8": "e4m3"
}  # fmt: skip
#: HBM bytes per element of one FP8 cast of a GEMM input (an activation in forward, an
#: output gradient in backward): read the bf16 tensor (2 B), write the FP8 row-wise and
#: column-wise copies (1 + 1 B; Hopper needs the column-wise one transposed, MXFP8's
#: 32 x 1 blocks differ from its 1 x 32 ones: Transformer Engine, "Performance
#: considerations" and "MXFP8", Handling transposes), in one fused kernel.  Delayed
#: scaling takes last step's scale and records the amax in that kernel; block scaling
#: finds each block's amax locally; current (tensorwise) scaling first reads the
#: tensor once more for its amax (+2 B).
FP8_CAST_BYTES: dict[Fp8Recipe, float] = {
    "delayed": 4.0, "tensorwise": 6.0, "blockwise": 4.0, "mxfp8": 4.0
}  # fmt: skip
#: Achieved FP8 GEMM rate of each recipe relative to delayed and tensor-wise scaling's
#: kernel: Transformer Engine's "GEMM speedups across precisions" (5B model's layer GEMMs
#: with quantization, over BF16): on H200 delayed 1.69x and block scaling 1.41x (0.83);
#: on B300 delayed 1.61x and MXFP8 1.44x (0.89).
FP8_RECIPE_RATE: dict[Fp8Recipe, float] = {
    "delayed": 1.0, "tensorwise": 1.0, "blockwise": 0.83, "mxfp8": 0.89
}  # fmt: skip
#: The architectures that run each recipe: Transformer Engine, "Datatype and hardware
#: support matrix" (FP8 per tensor, i.e. delayed and current scaling, needs compute
#: capability 8.9: Ada, Hopper, Blackwell; FP8 block scaling runs on Hopper and
#: Blackwell; MXFP8 on data-centre Blackwell, 10.0 and 10.3, only), as the Megatron-Core
#: low-precision training guide's "Hardware and recipe compatibility".  AMD Instinct GPUs
#: with FP8 tensor cores (cdna3: MI300X; cdna4) run the tensor-scaled recipes.
FP8_RECIPE_ARCHITECTURES: dict[Fp8Recipe, tuple[Architecture, ...]] = {
    "delayed": ("ada", "hopper", "blackwell", "cdna3", "cdna4"),
    "tensorwise": ("ada", "hopper", "blackwell", "cdna3", "cdna4"),
    "blockwise": ("hopper", "blackwell"),
    "mxfp8": ("blackwell",),
}
#: How the refusals of the block recipes name their GPUs.
_BLOCK_RECIPES = {"blockwise": "Hopper or Blackwell GPUs (H100, H200, B200, GB200)",
                  "mxfp8": "Blackwell GPUs (B200, GB200)"}  # fmt: skip


# ---------------------------------------------------------------------------- NVFP4
#: Bytes per element of an NVFP4 tensor: a 4-bit E2M1 value and one E4M3 scale per block
#: of 16 (NVIDIA, "Introducing NVFP4 for efficient and accurate low-precision
#: inference", and Transformer Engine's NVFP4BlockScaling recipe; the one fp32 scale per
#: tensor is negligible).
NVFP4_BYTES = 0.5 + 1.0 / 16
#: HBM bytes per element of one NVFP4 cast of a GEMM input: the amax pass for the
#: per-tensor scale (read 2 B: NVFP4's second-level scale is current scaling), then read
#: the bf16 tensor (2 B) and write the row-wise and column-wise NVFP4 copies (the
#: column-wise one of a weight-gradient operand through the random Hadamard transform,
#: fused in the cast kernel: Transformer Engine, NVFP4BlockScaling).
NVFP4_CAST_BYTES = 2.0 + 2.0 + 2 * NVFP4_BYTES
#: The architectures with NVFP4 tensor cores: data-centre Blackwell (Transformer Engine,
#: "Datatype and hardware support matrix": NVFP4 on compute capability 10.0 and 10.3).
NVFP4_ARCHITECTURES: tuple[Architecture, ...] = ("blackwell",)


def uses_fp8(training: TrainingSpec) -> bool:
    """Whether the transformer layers' GEMMs run in FP8."""
    return training.precision == "fp8"


def uses_fp4(training: TrainingSpec) -> bool:
    """Whether the transformer layers' GEMMs run in NVFP4."""
    return training.precision == "fp4"


def uses_quantized_gemms(training: TrainingSpec) -> bool:
    """Whether the transformer layers' GEMMs run quantised (FP8 or NVFP4), their inputs
    cast by Transformer Engine (:func:`quantization_cast_bytes`)."""
    return training.precision in ("fp8", "fp4")


def keeps_quantized_tensors(training: TrainingSpec) -> bool:
    """Whether quantised training keeps quantised weight copies and quantised GEMM inputs
    for backward (Transformer Engine), rather than bf16 ones (torchao): the framework
    says."""
    framework = resolve_framework(training.framework)
    return uses_quantized_gemms(training) and framework.keeps_quantized_tensors


def quantized_bytes(training: TrainingSpec) -> float:
    """Bytes of one element of a kept quantised tensor: FP8 1 B, NVFP4
    :data:`NVFP4_BYTES`."""
    return NVFP4_BYTES if uses_fp4(training) else 1.0


def fp8_recipe(training: TrainingSpec) -> Fp8Recipe:
    """The FP8 scaling recipe (Megatron's default, delayed, when none is named)."""
    return training.fp8_recipe or "delayed"


def fp8_format(training: TrainingSpec) -> Fp8Format:
    """The FP8 format (Transformer Engine's default of the recipe when none is named)."""
    return training.fp8_format or FP8_DEFAULT_FORMAT[fp8_recipe(training)]


def check_precision(training: TrainingSpec, gpu: GpuSpec) -> None:
    """Refuse a precision ``gpu`` cannot run, by its ``architecture``
    (:data:`FP8_RECIPE_ARCHITECTURES`) and its FP8 peak.

    Raises
    ------
    SpecError
        A block recipe on another architecture (blockwise elsewhere than on Hopper or
        Blackwell, MXFP8 elsewhere than on Blackwell), first, so that a GPU without FP8
        tensor cores hears which architectures run it; FP8 on a GPU without FP8 tensor
        cores (no ``peak_fp8_flops_per_s``: V100, A100); a tensor-scaled recipe on an
        architecture before Ada (a user GPU that gives an FP8 peak anyway).
    """
    if uses_fp4(training):
        _check_fp4(training, gpu)
    if not uses_fp8(training):
        return
    recipe = fp8_recipe(training)
    allowed = FP8_RECIPE_ARCHITECTURES[recipe]
    fp8_cores = gpu.peak_fp8_flops_per_s is not None
    if recipe in _BLOCK_RECIPES and gpu.architecture not in allowed:
        if fp8_cores and gpu.architecture != "unknown":
            raise SpecError(
                "training.fp8_recipe",
                recipe,
                f"runs on {_BLOCK_RECIPES[recipe]} only, not {gpu.name}; use delayed, "
                + ("tensorwise or blockwise" if is_hopper(gpu) else "or tensorwise"),
            )
        raise SpecError("training.fp8_recipe", recipe, _architecture_refusal(gpu, allowed))
    if not fp8_cores:
        raise SpecError(
            "training.precision",
            "fp8",
            f"FP8 needs FP8 tensor cores (H100, H200, B200, GB200, MI300X); {gpu.name} has "
            "none (its peak_fp8_flops_per_s is not set)",
        )
    if gpu.architecture not in (*allowed, "unknown"):
        raise SpecError("training.precision", "fp8", _architecture_refusal(gpu, allowed))


def _check_fp4(training: TrainingSpec, gpu: GpuSpec) -> None:
    """Refuse NVFP4 outside Transformer Engine (a framework that keeps no quantised
    tensors, torchao's) and on a GPU without NVFP4 tensor cores
    (:data:`NVFP4_ARCHITECTURES`)."""
    if not resolve_framework(training.framework).keeps_quantized_tensors:
        raise SpecError(
            "training.precision", "fp4",
            f"is Transformer Engine's NVFP4 recipe, which framework "
            f"{training.framework.name} does not run: use fp8 or bf16",
        )  # fmt: skip
    if gpu.architecture in NVFP4_ARCHITECTURES and gpu.peak_fp4_flops_per_s is not None:
        return
    if gpu.architecture == "unknown" and gpu.peak_fp4_flops_per_s is not None:
        return  # a user GPU that gives an NVFP4 peak
    if gpu.peak_fp4_flops_per_s is None and gpu.architecture in NVFP4_ARCHITECTURES:
        why = f"{gpu.name} gives no peak_fp4_flops_per_s"
    else:
        why = f"{gpu.name}'s architecture is '{gpu.architecture}'"
    raise SpecError(
        "training.precision", "fp4",
        f"NVFP4 needs Blackwell GPUs (B200, GB200, B300, GB300); {why}: use fp8 or bf16",
    )  # fmt: skip


def _architecture_refusal(gpu: GpuSpec, allowed: tuple[Architecture, ...]) -> str:
    """``needs gpu.architecture a, b or c; <name>'s is '<arch>'`` and what to do instead."""
    names = ", ".join(allowed[:-1]) + f" or {allowed[-1]}" if len(allowed) > 1 else allowed[0]
    text = f"needs gpu.architecture {names}; {gpu.name}'s is '{gpu.architecture}'"
    if gpu.architecture == "unknown":
        text += " (not given, and its name tells none): set gpu.architecture if it is one"
        return text + (", else use delayed or tensorwise" if gpu.peak_fp8_flops_per_s else
                       ", else train in bf16")  # fmt: skip
    if gpu.peak_fp8_flops_per_s is None:
        return text + ", without FP8 tensor cores: train in bf16"
    return text + ": train in bf16"


def fp8_gemm_rate(training: TrainingSpec) -> float:
    """The FP8 GEMM rate of the training's recipe relative to delayed scaling's."""
    return FP8_RECIPE_RATE[fp8_recipe(training)]


def quantization_cast_bytes(
    model: ModelSpec, training: TrainingSpec, plan: Plan
) -> tuple[float, float]:
    """HBM bytes of one layer's casts to FP8 or NVFP4 for one micro-batch on one GPU,
    (forward, backward): the inputs of QKV, projection, FC1 and FC2 in forward (the QKV
    and FC1 inputs before the sequence-parallel all-gather, which then moves FP8), their
    output gradients in backward, :func:`cast_bytes_per_element` per element.  A framework that
    keeps no FP8 weights (torchao) also casts every GEMM's weight in forward and again in
    backward; Transformer Engine casts them once per step (not counted), or under LoRA,
    whose recipes turn its weight cache off, once per micro-batch in forward."""
    tokens = training.seq_length * plan.micro_batch_size
    h, f, t = model.hidden_size, model.ffn_hidden_size, plan.tp
    fc1 = (2 if model.activation == "swiglu" else 1) * f
    hidden = h / t if plan.sequence_parallel else float(h)  # per token, one hidden vector
    # the attention's projections (latent attention's too): cost.latent_attention
    attn_fwd, attn_bwd, attn_weights = attention_cast_elements(model, tokens, plan)
    forward = attn_fwd + tokens * (hidden + f / t)
    backward = attn_bwd + tokens * (fc1 / t + hidden)
    weights = attn_weights + (h * fc1 + f * h) / t
    if not keeps_quantized_tensors(training):
        forward, backward = forward + weights, backward + weights
    elif training.lora is not None:
        forward += weights
    per_element = cast_bytes_per_element(training)
    return forward * per_element, backward * per_element


def cast_bytes_per_element(training: TrainingSpec) -> float:
    """HBM bytes of one element's cast to the training's quantised format:
    :data:`FP8_CAST_BYTES` of the recipe, or :data:`NVFP4_CAST_BYTES`."""
    return NVFP4_CAST_BYTES if uses_fp4(training) else FP8_CAST_BYTES[fp8_recipe(training)]
