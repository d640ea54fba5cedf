"""Which attention variants a layout can run, as Megatron-Core and Transformer Engine run them.

The cost model prices multi-head latent attention (:mod:`pipette_cp.cost.workload.latent_attention`,
:func:`pipette_cp.cost.workload.flops.attention_projection_gemms`), sliding windows
(:mod:`pipette_cp.cost.workload.sliding_window`), attention sinks and multi-token prediction
(:mod:`pipette_cp.cost.compute.stage_extras`); :func:`check_attention_variants` refuses the
combinations the software stack does not run, naming the field, value and rule:

- **latent attention** has query/key heads of ``nope + rope`` (192 for DeepSeek-V3) and
  value heads of ``v_head_dim`` (128).  FlashAttention 1 and 2 need one head width for
  Q, K and V (Transformer Engine disables its FlashAttention backend for MLA unless it
  is FlashAttention 3, which takes ``hdimQK=192, hdimV=128``); cuDNN (TE's
  FusedAttention) and the unfused kernels take them.  With cp > 1 TE runs MLA in its
  p2p ring only (``attn_forward_func_with_cp``: "The context parallel running configs
  cannot support MLA" for the others), the ring modelled here.
- **sliding windows** run in Transformer Engine's attention only: Megatron-Core's own
  ``DotProductAttention`` asserts ``window_size is None`` ("Sliding Window Attention is
  only supported by TEDotProductAttention!"); TE needs FusedAttention or FlashAttention
  >= 2.3 ("Sliding window attention only can work with FusedAttention or FlashAttention
  >= 2.3"), so not FlashAttention 1; and TE's context parallelism runs a window with
  ``cp_comm_type`` a2a or all_gather only (``attn_forward_func_with_cp``: "The context
  parallel running configs cannot support sliding window attention"), not the p2p ring
  this model prices.
- **attention sinks** (gpt-oss: a learned logit per head in the softmax denominator;
  Megatron-Core ``--softmax-type learnable``) cost no GEMM work: one more term per row
  of the softmax.  Transformer Engine runs them in cuDNN's fused kernel (its
  ``sink_token`` option) and its unfused attention, and disables FlashAttention for
  ``softmax_type = learnable`` (TE ``get_attention_backend``); its context-parallel
  attention takes a non-vanilla softmax with ``cp_comm_type`` a2a only (TE
  ``tests/pytorch/attention/test_attention_with_cp.py``: "No support for non-vanilla
  softmax with cp_comm_type=..."), not the p2p ring.
- **multi-token prediction** does not support learned absolute position embeddings
  (Megatron-LM ``docs/user-guide/features/multi_token_prediction.md``, "Unsupported
  Combinations").
- **FP8 attention** (``training.fp8_attention``: Transformer Engine's ``fp8_dpa``) runs in
  cuDNN's fused attention only (TE ``get_attention_backend`` disables FlashAttention and
  the unfused path for FP8 inputs) and with Transformer Engine's FP8 recipes (not
  torchao's); its core runs :data:`FP8_ATTENTION_SPEEDUP` faster and keeps queries,
  keys, values and output in FP8 (:func:`attention_element_bytes`).
"""

from __future__ import annotations

from collections.abc import Iterable

from pipette_cp.cost.stack.kernels import attention_kernel, keeps_quantized_tensors
from pipette_cp.errors import LayoutError
from pipette_cp.specs.gpu import GpuSpec
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import AttentionKernel, TrainingSpec

#: FP8 attention over bf16: FlashAttention-3's forward on H100 reaches close to 1.2
#: PFLOPs/s in FP8 against up to 740 TFLOPs/s in BF16 (Shah et al. 2024, abstract):
#: 1.6 x, assumed for the backward and on Blackwell's FP8 attention too.
FP8_ATTENTION_SPEEDUP = 1.2e15 / 740e12


def attention_element_bytes(training: TrainingSpec) -> float:
    """Bytes of one element of the queries, keys, values and output the attention keeps
    for its backward: 1 under FP8 attention, else 2 (bf16)."""
    return 1.0 if training.fp8_attention else 2.0


#: Kernels without unequal query/key and value head widths (latent attention).
_EQUAL_WIDTHS: tuple[AttentionKernel, ...] = ("flash1", "flash2")
#: Kernels of Transformer Engine's attention that take a sliding window.
_WINDOWED: tuple[AttentionKernel, ...] = ("flash2", "flash3", "cudnn")
#: Kernels that take learnable attention sinks.
_SINKS: tuple[AttentionKernel, ...] = ("cudnn", "fused-softmax", "eager", "sdpa-math")


def _kernels(training: TrainingSpec, plan: Plan, gpus: Iterable[GpuSpec]) -> set[AttentionKernel]:
    return {attention_kernel(training, plan, gpu) for gpu in gpus}


def check_attention_variants(
    model: ModelSpec, training: TrainingSpec, plan: Plan, gpus: Iterable[GpuSpec]
) -> None:
    """Raise :class:`LayoutError` for an attention variant the plan's kernel (on any of
    ``gpus``) or context parallelism cannot run (module docstring); nothing for a model
    without latent attention, windows, sinks or multi-token prediction."""
    if training.fp8_attention:
        field = "plan.attention_kernel" if plan.attention_kernel else "training.attention_kernel"
        for kernel in sorted(_kernels(training, plan, gpus)):
            if kernel != "cudnn":
                raise LayoutError(field, kernel, "training.fp8_attention runs in cuDNN's fused "
                                  "attention only (Transformer Engine): use cudnn")  # fmt: skip
        if not keeps_quantized_tensors(training):
            raise LayoutError("training.fp8_attention", True, "needs Transformer Engine's FP8 "
                              f"attention; {training.framework.name} casts with torchao")  # fmt: skip
    if model.mtp_layers and model.position_embedding == "learned":
        raise LayoutError("model.mtp_layers", model.mtp_layers, "multi-token prediction does "
                          "not support learned absolute position embeddings (Megatron-Core)")  # fmt: skip
    windowed, sinks = model.sliding_window is not None, model.attention_sinks
    if not (model.is_mla or windowed or sinks):
        return
    kernels = sorted(_kernels(training, plan, gpus))
    field = "plan.attention_kernel" if plan.attention_kernel else "training.attention_kernel"
    for kernel in kernels:
        if model.is_mla and kernel in _EQUAL_WIDTHS:
            raise LayoutError(field, kernel, f"{kernel} needs one head width for queries, "
                              f"keys and values; latent attention has {model.head_size} "
                              f"(q/k) and {model.v_head_size} (v): use cudnn or flash3")  # fmt: skip
        if windowed and kernel not in _WINDOWED:
            what = "FlashAttention 1" if kernel == "flash1" else "an unfused attention kernel"
            raise LayoutError(field, kernel, f"sliding_window={model.sliding_window}: runs in "
                              f"Transformer Engine's fused attention or FlashAttention >= 2.3 "
                              f"only, not {what} (use cudnn, flash2 or flash3)")  # fmt: skip
        if sinks and kernel not in _SINKS:
            raise LayoutError(field, kernel, "attention_sinks: FlashAttention has no learnable "
                              "softmax (Transformer Engine runs sinks in cuDNN's fused "
                              "attention or unfused): use cudnn")  # fmt: skip
    if plan.cp > 1 and windowed:
        raise LayoutError("plan.cp", plan.cp, f"cp={plan.cp} with sliding_window="
                          f"{model.sliding_window}: Transformer Engine's p2p context "
                          "parallelism (the one modelled) does not run sliding windows")  # fmt: skip
    if plan.cp > 1 and sinks:
        raise LayoutError("plan.cp", plan.cp, f"cp={plan.cp} with attention_sinks: Transformer "
                          "Engine's p2p context parallelism (the one modelled) has no "
                          "learnable softmax")  # fmt: skip
