"""Training frameworks: state bytes per parameter and compute speed, by name.

Every framework keeps Megatron's mixed-precision layout unless a source says
otherwise: bf16 weights (2 B), fp32 gradient buffer (4 B), fp32 master weights
(4 B) and two fp32 Adam moments (8 B) per parameter
(``megatron/training/theoretical_memory_usage.py``: 18 B, or 6 + 12/dp with the
distributed optimizer).  ``compute_efficiency`` scales the calibrated compute
model (fitted on Megatron-LM and Megatron-Core runs, so 1.0 for both); for the
others it is the one parameter fitted per framework (llm-foundry also fits its
attention efficiency, torchtitan its ring attention's speed with context parallelism):
``1 / median(predicted / measured throughput)`` over the fit side of the published
runs (``python -m pipette_cp.experiments.models.published_runs_report --fit``; torchtitan's rows
are in ``published_runs_moe_cp.csv``: ``python -m pipette_cp.experiments.models.fp8_accuracy
--fit``), the median so that outliers do not move it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from pipette_cp.cost.stack.calibration import GpuCalibration
from pipette_cp.errors import SpecError
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import FrameworkProfile, TrainingSpec
from pipette_cp.units import BYTES_PER_ELEMENT


@dataclass(frozen=True)
class Framework:
    """A framework with every value resolved (bytes per parameter; speed relative to 1.0)."""

    name: str
    compute_efficiency: float
    weight_bytes: float
    gradient_bytes: float
    master_weight_bytes: float
    optimizer_state_bytes: float
    provenance: str = ""
    attention_efficiency: float = 1.0
    #: per GPU family (``GpuCalibration.gpu_family``), a factor on ``compute_efficiency``
    gpu_efficiency: tuple[tuple[str, float], ...] = ()
    #: whether ZeRO-3 keeps a sharded compute copy beside the fp32 master (FSDP: no)
    keeps_compute_weights: bool = True
    #: the upper bound's allowance, a fraction of the per-micro-batch memory
    memory_margin: float = 0.0
    #: constant memory beyond the tensors (None: the calibrated MEMORY_CALIBRATION value)
    runtime_bytes: float | None = None
    #: FP8 and NVFP4 (Transformer Engine): the quantised weight copies are cast once per
    #: step and kept (Megatron passes ``is_first_microbatch``), and a GEMM keeps its
    #: quantised input for the weight gradient instead of the bf16 one; false for torchao's
    #: Float8Linear, which saves the high-precision input and weight and casts them at
    #: every GEMM (and runs no NVFP4)
    keeps_quantized_tensors: bool = True
    #: factor on the fused attention's efficiency with context parallelism (cp > 1): the
    #: ring attention's own cost beyond one kernel call's (Transformer Engine's fused p2p
    #: ring: 1.0)
    cp_attention_efficiency: float = 1.0
    #: bytes per logit alive at the peak of an unfused loss (None: Megatron's
    #: ``cost.kernels.LOGITS_KEPT_BYTES``); a fused loss keeps the bf16 logits alone
    loss_logit_bytes: float | None = None
    #: ``selective`` recomputation is per-op checkpointing with torchtitan's policy
    #: (``cost.memory_recompute``) rather than Megatron's (the attention core)
    op_selective_recompute: bool = False
    #: the routed experts apply the routing probabilities in their activation (Megatron-
    #: Core's ``TEGroupedMLP`` with ``weighted_bias_swiglu_impl``), so the un-permutation
    #: keeps no expert outputs for the probabilities' gradient; false: it multiplies them
    #: there and keeps the outputs (``cost.memory.moe_activations``)
    moe_probs_in_activation: bool = False

    def compute_scale(self, gpu_family: str) -> float:
        """The factor on the calibrated compute rates on a GPU of ``gpu_family``."""
        return self.compute_efficiency * dict(self.gpu_efficiency).get(gpu_family, 1.0)


def _megatron_layout(
    name: str, compute_efficiency: float, provenance: str, **extra: Any
) -> Framework:
    """A framework with Megatron's mixed-precision bytes: 2 + 4 + 4 + 8 per parameter."""
    return Framework(name, compute_efficiency, weight_bytes=2.0, gradient_bytes=4.0,
                     master_weight_bytes=4.0, optimizer_state_bytes=8.0,
                     provenance=provenance, **extra)  # fmt: skip


_FIT = "fitted: 1 / median(predicted / measured) on the fit side of published_runs_more.csv"

#: PyTorch FSDP has none of DeepSpeed's communication buckets, which the fitted runtime
#: constant (BLOOM, Megatron-DeepSpeed) includes: ``reduce_bucket_size`` and
#: ``allgather_bucket_size``, 5e8 elements each by default (DeepSpeed ZeRO config), in
#: fp16: 2 x 5e8 x 2 B less than the fitted 5.56 GiB.
_FSDP_RUNTIME_BYTES = 5.56 * 2**30 - 2 * 5e8 * 2


#: The frameworks by name.
FRAMEWORKS: dict[str, Framework] = {
    "megatron-core": _megatron_layout("megatron-core", 1.0, "the compute calibration's runs"),
    "megatron-lm": _megatron_layout("megatron-lm", 1.0, "the compute calibration's runs (SC21)"),
    # Megatron-Core as the Megatron-Bridge containers of 2025-2026 (25.09 and later) run it:
    # Megatron-Core's bytes and speed; its MoE experts apply the routing probabilities in
    # the activation (megatron/core/transformer/moe/experts.py), the un-permutation keeps
    # no expert outputs.
    "megatron-bridge": replace(
        _megatron_layout("megatron-bridge", 1.0, "as megatron-core; MoE memory of 2025-2026"),
        moe_probs_in_activation=True,
    ),
    # NVIDIA DGX Cloud benchmarking recipes v24.11.1 (NeMo on Megatron-Core, H100):
    # step times include what the recipes' timers include.
    "nemo": _megatron_layout("nemo", 0.926, f"{_FIT} (DGX Cloud, 5 rows)"),
    # BigScience BLOOM layout search (Megatron-DeepSpeed, ZeRO-1, fp16 optimizer).
    "megatron-deepspeed": _megatron_layout("megatron-deepspeed", 0.978, f"{_FIT} (BLOOM, 26 rows)"),
    # Megatron-DeepSpeed with DeepSpeed's BF16 optimizer (runtime/bf16_optimizer.py): the
    # bf16 .grad of every parameter (2 B) lives until it is added into the full-size fp32
    # accumulation buffer (4 B); master weights and moments sharded as ZeRO-1.  No rows:
    # the compute speed of the fp16-optimizer runs.
    "megatron-deepspeed-bf16": replace(
        _megatron_layout("megatron-deepspeed-bf16", 0.978, "as megatron-deepspeed (no rows)"),
        gradient_bytes=6.0,
    ),
    # Hagemann et al. 2023: Aleph Alpha's Megatron-style trainer on A100.  Its gradients
    # are bf16 (2 B): the sheets ran 13B with tp = pp = 1 and ZeRO-1 over 64 A100 80GB,
    # where bf16 weights (26 GB) and an fp32 gradient buffer (52 GB) alone would not fit.
    # Its memory margin: the published_runs_fit.fit_memory_margins rule on the fit side's
    # 228 rows (129 out of memory); the other frameworks' fit sides hold no run that ran
    # out of memory predicted to fit, so their margin is 0.
    "aleph-alpha": replace(
        _megatron_layout("aleph-alpha", 0.916, f"{_FIT} (Hagemann et al., 99 rows)"),
        gradient_bytes=2.0,
        memory_margin=0.17,
    ),
    # MosaicML llm-foundry benchmarks (PyTorch FSDP, MPT models, A100 and H100): the
    # compute efficiency per GPU family (Megatron-Core's Transformer Engine gains more on
    # H100), and its attention (ALiBi): the grid value with the smallest fit-side MAPE.
    # PyTorch FSDP mixed precision keeps only the fp32 shard of each parameter and casts it
    # at every all-gather (torch.distributed.fsdp.MixedPrecision, param_dtype: "outside
    # forward and backward, the sharded parameters are kept in full precision"): 16 B per
    # parameter under full sharding, no compute copy outside the gathered units.
    "llm-foundry": _megatron_layout(
        "llm-foundry",
        1.0,
        f"{_FIT}, per GPU family; attention efficiency by grid (50 rows)",
        attention_efficiency=0.55,
        gpu_efficiency=(("A100", 1.043), ("H100", 0.887)),
        keeps_compute_weights=False,
        runtime_bytes=_FSDP_RUNTIME_BYTES,
    ),
    # torchtitan (FSDP2, the same fp32-shard mixed precision as FSDP; SDPA flash attention;
    # its H100 rows in published_runs_moe_cp.csv, 500 W HBM2e parts).  H100 compute speed:
    # the frameworks' rule on the fit side's 4 BF16 rows without context parallelism (8B,
    # 8 and 128 GPUs, eager and compiled: median predicted / measured throughput 1.000),
    # `python -m pipette_cp.experiments.models.fp8_accuracy --fit`; A100: llm-foundry's (no rows).
    "torchtitan": _megatron_layout(
        "torchtitan",
        1.0,
        "fitted: H100 on the fit side's 4 torchtitan BF16 rows (published_runs_moe_cp.csv); "
        "A100 llm-foundry's (no rows); cp attention efficiency by grid (3 rows)",
        gpu_efficiency=(("A100", 1.043), ("H100", 0.738)),
        keeps_compute_weights=False,
        # The GPU holds FSDP's runtime constant (CUDA context, NCCL buffers), which the
        # fit decision needs.  Its rows' memory is the caching allocator's reserved peak
        # (train.py logs torch.cuda.memory_stats()["reserved_bytes.all.peak"];
        # instances/calibration/README.md), without them: the accuracy experiments compare
        # it with MemoryBreakdown.reserved_bytes (the peak less the runtime constant; the
        # allocator's reserve, allocator_fraction, stays).
        runtime_bytes=_FSDP_RUNTIME_BYTES,
        # Its loss (train.py at 9dec370, not compiled): cross_entropy(pred.float(), labels)
        # keeps the fp32 log-softmax output (4 B) for its backward, where the fp32
        # gradient from the NLL (4 B) and the log-softmax's fp32 input gradient (4 B) are
        # alive with it: 12 B per logit; the bf16 logits are freed first (`del pred`).
        loss_logit_bytes=12.0,
        # `selective` is its per-op checkpointing (activation_checkpoint "op" policy)
        op_selective_recompute=True,
        # PyTorch's ring attention (torch.distributed.tensor.experimental._attention, the
        # torch of these runs): one SDPA call per ring step on half-chunks, every step's
        # output and log-sum-exp merged in fp32, dQ/dK/dV accumulated and dK/dV passed
        # round the ring in fp32, K/V copied (concatenated) every step at the query heads'
        # width (torchtitan repeats K/V before SDPA) and all-gathered after the first step.
        # How much slower that makes the attention is not derived from the sources:
        # fitted, the grid value minimising the step-time MAPE of the fit side's 3
        # torchtitan rows with cp > 1 (8B at cp 2, 4, 8: +30.9, -0.4, -3.6 %),
        # `python -m pipette_cp.experiments.models.moe_cp_accuracy --fit`.
        cp_attention_efficiency=0.73,
        # torchao float8 (torchtitan's Float8): matmul_with_hp_or_float8_args saves
        # (input_hp, weight_hp_t) for backward and casts both at every call
        keeps_quantized_tensors=False,
    ),
}

_FIELDS = ("compute_efficiency", "weight_bytes", "gradient_bytes", "master_weight_bytes",
           "optimizer_state_bytes")  # fmt: skip
_OPTIONAL = ("attention_efficiency", "keeps_compute_weights", "memory_margin", "runtime_bytes")


@functools.lru_cache(maxsize=64)
def resolve_framework(profile: FrameworkProfile) -> Framework:
    """The named framework with the profile's non-None fields applied.

    Raises
    ------
    SpecError
        An unknown name without every field given.
    """
    given = {
        f: getattr(profile, f) for f in (*_FIELDS, *_OPTIONAL) if getattr(profile, f) is not None
    }
    base = FRAMEWORKS.get(profile.name)
    if base is None:
        missing = [f for f in _FIELDS if f not in given]
        if missing:
            raise SpecError(
                "training.framework.name",
                profile.name,
                f"unknown framework; known: {', '.join(FRAMEWORKS)} (or give "
                f"{', '.join(missing)} too)",
            )
        return Framework(name=profile.name, provenance="user-defined", **given)
    if "compute_efficiency" in given:  # one value for every GPU family
        given["gpu_efficiency"] = ()
    return replace(base, **given) if given else base


class GradientBytes(NamedTuple):
    """Bytes of the gradients per parameter, as each part of the cost model reads them
    (:func:`gradient_bytes`)."""

    #: the gradient buffer a GPU keeps (memory: :mod:`pipette_cp.cost.memory.state`)
    buffer: float
    #: per element on the data-parallel collectives (reduce-scatter, all-reduce)
    wire: float
    #: per element the optimizer step reads (norm, update) and zeroes
    step: float


#: Megatron's main gradients in bf16 (``--grad-reduce-in-bf16``), bytes per element.
BF16_GRADIENT_BYTES = 2.0


def gradient_bytes(training: TrainingSpec, plan: Plan | None = None) -> GradientBytes:
    """The gradients' bytes per parameter, the one place that prices them.

    By default the framework's buffer (Megatron's fp32 main gradients: 4 B); on the wire
    under bf16 (and fp8, bf16 mixed precision with FP8 GEMMs) that buffer (a framework
    keeping two copies, such as DeepSpeed's BF16 optimizer, reduces the fp32 one: at
    most 4 B), under fp16 the 2-byte gradients; the optimizer step reads and zeroes the
    fp32 main gradient (4 B).  With ``plan.grad_reduce_in_bf16`` Megatron keeps the main
    gradients in bf16 and reduces them in bf16 (``--grad-reduce-in-bf16`` turns off
    ``accumulate_allreduce_grads_in_fp32``, the DDP's ``grad_reduce_in_fp32``: the grad
    buffer takes the parameters' dtype): 2 B for all three."""
    if plan is not None and plan.grad_reduce_in_bf16:
        return GradientBytes(BF16_GRADIENT_BYTES, BF16_GRADIENT_BYTES, BF16_GRADIENT_BYTES)
    buffer = resolve_framework(training.framework).gradient_bytes
    if training.precision in ("bf16", "fp8", "fp4"):
        wire = min(buffer, 4.0)
    else:
        wire = float(BYTES_PER_ELEMENT[training.precision])
    return GradientBytes(buffer, wire, 4.0)


#: HBM bytes a fused optimizer update moves per parameter of its shard: Adam reads the
#: fp32 gradient, master weight and two moments and writes the last three and the bf16
#: weight (30 B); SGD with momentum one moment fewer (22 B).
OPTIMIZER_UPDATE_BYTES = {"adam": 30.0, "sgd": 22.0}
#: The fp32 gradient's part of :data:`OPTIMIZER_UPDATE_BYTES` (read once).
_UPDATE_GRADIENT_BYTES = 4.0


def _keeps_remainders(training: TrainingSpec, plan: Plan) -> bool:
    """Whether the precision-aware optimizer holds the master weights as 16-bit
    remainders: Megatron-Core gives Transformer Engine's FusedAdam the master weights
    (``master_weights``, ``store_param_remainders``, TE >= 2.1) unless FP8 runs a recipe
    other than delayed scaling, where the distributed optimizer keeps its fp32 copy.
    FusedAdam stores remainders of bf16 weights only ("works only when param type is
    BF16"), so FP8 primary weights (``plan.fp8_param_gather``) keep the fp32 master
    (counted for every parameter: errs high for the bf16 norms and embeddings)."""
    if plan.fp8_param_gather:
        return False
    return training.precision != "fp8" or (training.fp8_recipe or "delayed") == "delayed"


def optimizer_state_bytes(training: TrainingSpec, plan: Plan) -> tuple[float, float]:
    """(master weight, moments) bytes per parameter of the optimizer state, before any
    sharding: the framework's (Adam two moments, SGD one); with the precision-aware
    optimizer the moments in bf16 (half) and the master weights as the 16 bits the bf16
    weight lacks (half, :func:`_keeps_remainders`).  Offloading a fraction ``f`` of the
    optimizer (``plan.optimizer_offload_fraction``) keeps ``1 - f`` of it on the GPU:
    Megatron-Core's ``HybridDeviceOptimizer`` puts the first ``f`` of the shard's
    elements on the host and gives the rest an fp32 copy and torch's Adam moments on the
    device (``param_update_in_fp32``): the framework's fp32 bytes, 12 B with Adam."""
    fw = resolve_framework(training.framework)
    moments = fw.optimizer_state_bytes * (1.0 if training.optimizer == "adam" else 0.5)
    master = fw.master_weight_bytes
    if plan.precision_aware_optimizer:
        moments /= 2
        master /= 2 if _keeps_remainders(training, plan) else 1
    if kept := 1.0 - plan.optimizer_offload_fraction:  # the rest lives on the host
        return master * kept, moments * kept
    return 0.0, 0.0


def optimizer_update_bytes(training: TrainingSpec, plan: Plan) -> float:
    """HBM bytes the optimizer update moves per parameter of its shard
    (:data:`OPTIMIZER_UPDATE_BYTES`).  The precision-aware optimizer reads and writes
    the two moments in bf16 (8 B less) and, with remainders, the master weight as the
    bf16 weight and its remainder, written in place (the separate bf16 write, 2 B, gone):
    Adam 20 B (22 B without remainders).  The gradient is read at
    :attr:`GradientBytes.step` (bf16 main gradients: 2 B less)."""
    update = OPTIMIZER_UPDATE_BYTES[training.optimizer]
    step = gradient_bytes(training, plan).step
    if step != _UPDATE_GRADIENT_BYTES:
        update += step - _UPDATE_GRADIENT_BYTES
    if plan.precision_aware_optimizer:
        update -= 8.0 + (2.0 if _keeps_remainders(training, plan) else 0.0)
    return update


#: The host link of a GPU that offloads its optimizer, bytes/s each way: PCIe 4.0 x16
#: (PCI-SIG: 16 GT/s per lane, 128b/130b coding: 31.5 GB/s) at 80 % of it (assumption;
#: PCIe 5.0 on H100/B200 and Grace's NVLink-C2C are faster, so this errs slow).
HOST_LINK_BYTES_PER_S = 0.8 * 31.5e9
#: Bytes per offloaded parameter over that link in one step: its gradient down and its
#: updated weight up, each at the wider of the two dtypes the copies convert between
#: (the host keeps fp32: 4 + 4 B; assumption, errs slow for bf16 gradients).
HOST_LINK_BYTES_PER_PARAM = 8.0
#: Host memory traffic of the CPU Adam step per parameter: it reads the fp32 weight,
#: gradient and two moments and writes the weight and moments (28 B).
HOST_ADAM_BYTES_PER_PARAM = 28.0
#: Host memory bandwidth one GPU's CPU optimizer gets, bytes/s (assumption: a two-socket
#: host, a few hundred GB/s of DDR5, shared by its 8 GPUs' optimizers at well under
#: peak: 20 GB/s each, conservative).
HOST_ADAM_BYTES_PER_S = 20e9


def host_optimizer_time_s(offloaded_params: float) -> float:
    """The host part of an offloaded optimizer step for ``offloaded_params`` parameters
    of one GPU's shard: the gradients' copy to the host, the CPU Adam update and the
    weights' copy back, one after the other (Megatron-Core's ``HybridDeviceOptimizer``
    without ``--overlap-cpu-optimizer-d2h-h2d``, which the export does not set: the
    device optimizer steps first, then the host ones, each after its gradients arrived).
    The rates are conservative assumptions (:data:`HOST_LINK_BYTES_PER_S`,
    :data:`HOST_ADAM_BYTES_PER_S`)."""
    link = HOST_LINK_BYTES_PER_PARAM / HOST_LINK_BYTES_PER_S
    return offloaded_params * (link + HOST_ADAM_BYTES_PER_PARAM / HOST_ADAM_BYTES_PER_S)


def framework_calibration(cal: GpuCalibration, training: TrainingSpec) -> GpuCalibration:
    """``cal`` with the GEMM ceilings (bf16 and FP8) and the HBM rate scaled by the
    framework's ``compute_efficiency`` (fused attention: :func:`attention_scale`)."""
    eff = resolve_framework(training.framework).compute_scale(cal.gpu_family)
    if eff == 1.0:
        return cal
    return replace(
        cal,
        gemm_efficiency_max=cal.gemm_efficiency_max * eff,
        hbm_efficiency=cal.hbm_efficiency * eff,
        fp8_gemm_efficiency_max=cal.fp8_gemm_efficiency_max * eff,
    )


def attention_scale(training: TrainingSpec, gpu_family: str, cp: int = 1) -> float:
    """Factor on a fused attention kernel's efficiency: the framework's compute scale on
    that GPU family and its attention efficiency (with ``cp > 1`` also its
    ``cp_attention_efficiency``)."""
    fw = resolve_framework(training.framework)
    ring = fw.cp_attention_efficiency if cp > 1 else 1.0
    return fw.compute_scale(gpu_family) * fw.attention_efficiency * ring
