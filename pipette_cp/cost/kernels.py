"""Which kernels a plan runs on the software stack, and how fast the fused ones are.

The training spec names the stack's attention kernel and whether the norms are
fused (:class:`~pipette_cp.specs.training.TrainingSpec`); the plan's
``flash_attention`` chooses between the fused attention kernel and the unfused
path.  The time and memory models read the kernel through :func:`attention_kernel`
and :func:`uses_fused_attention`, so a kernel is named in one place.
"""

from __future__ import annotations

from pipette_cp.errors import SpecError
from pipette_cp.specs.gpu import GpuSpec
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import FUSED_ATTENTION, AttentionKernel, TrainingSpec

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


def is_hopper(gpu: GpuSpec) -> bool:
    """Whether ``gpu`` is a Hopper part (H100, H200): FlashAttention 3 runs only there
    (Blackwell B200/GB200 and AMD MI300X are not Hopper)."""
    return gpu.vendor == "NVIDIA" and any(tag in gpu.name.upper() for tag in ("H100", "H200"))


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
    kernel = named or training.attention_kernel or ("cudnn" if is_hopper(gpu) else "flash2")
    field = "plan.attention_kernel" if named else "training.attention_kernel"
    amd = gpu.vendor != "NVIDIA"
    refused = ("flash3", *NVIDIA_ONLY_ATTENTION) if amd else ("flash3",)
    others = ", ".join(k for k in ALTERNATIVES if k not in refused)
    if kernel == "flash3" and not is_hopper(gpu):
        raise SpecError(
            field,
            kernel,
            f"FlashAttention 3 runs on Hopper GPUs (H100, H200) only, not {gpu.name}; "
            f"use one of {others}",
        )
    if amd and kernel in NVIDIA_ONLY_ATTENTION:
        raise SpecError(
            field, kernel, f"runs on NVIDIA GPUs only, not {gpu.name} (AMD); use one of {others}"
        )
    return kernel


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
