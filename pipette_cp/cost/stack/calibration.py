"""Fitted and fixed parameters of the compute and memory models, per GPU type.

A deliberately small table: two fitted compute parameters per GPU type
(``gemm_efficiency_max``, ``gemm_half_saturation_flops``; the FP8 GEMM ceiling
``fp8_gemm_efficiency_max`` where the GPU has FP8 tensor cores), two fitted memory
parameters shared by every GPU (``runtime_bytes``, ``allocator_fraction``), and a
few fixed physical constants with their sources.  Every fitted number says on
which rows of ``instances/calibration/published_runs_calibration.csv`` and by
which command it was obtained; re-run that command after changing a model and
paste its output here.

The fitting code itself lives in :mod:`pipette_cp.experiments.models.accuracy` (it needs
the end-to-end evaluator, which sits above the cost models); this module only
holds the result, so the cost models stay pure and import nothing above specs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from pipette_cp.specs.gpu import GpuSpec
from pipette_cp.units import TFLOPS, GiB

#: Command that re-fits the compute and memory parameters and prints this table.
FIT_COMMAND = "python -m pipette_cp.experiments.models.accuracy --fit"
#: Command that re-fits the FP8 GEMM ceiling and prints its held-out accuracy.
FP8_FIT_COMMAND = "python -m pipette_cp.experiments.models.fp8_accuracy --fit"


@dataclass(frozen=True)
class GpuCalibration:
    """Compute-model parameters of one GPU type.

    Achieved GEMM FLOP/s = ``peak x gemm_efficiency_max x W / (W + W_half)`` where
    ``W`` is the FLOPs of one GEMM call (equivalently: every GEMM pays a fixed
    ``W_half / (peak x eta_max)`` seconds of tail/launch cost on top of its
    work at ``eta_max`` of peak), capped by the HBM roofline.
    """

    gpu_family: str
    num_sms: int
    gemm_efficiency_max: float
    gemm_half_saturation_flops: float
    hbm_efficiency: float
    flash_attention_efficiency: float
    fitted: bool
    provenance: str
    #: ceiling of the FP8 layer GEMMs as a fraction of the FP8 peak (``eta_fp8``; the fixed
    #: per-GEMM time ``W_half / (peak x eta_max)`` is the bf16 GEMMs'); NaN: no FP8 cores
    fp8_gemm_efficiency_max: float = math.nan
    #: ceiling of the NVFP4 layer GEMMs as a fraction of the dense FP4 peak (``eta_fp4``;
    #: the fixed per-GEMM time as for FP8); NaN: no NVFP4 cores or no fit
    fp4_gemm_efficiency_max: float = math.nan


@dataclass(frozen=True)
class MemoryCalibration:
    """What the GPU holds beyond the tensors the formulas count.

    ``runtime_bytes``: CUDA context and kernels, NCCL communicator buffers,
    framework workspaces (cuBLAS), a constant per process.
    ``allocator_fraction``: the PyTorch caching allocator's reserve and
    fragmentation, as a fraction of the memory that is allocated and freed
    every micro-batch (activations, logits, temporaries).
    """

    runtime_bytes: float
    allocator_fraction: float
    provenance: str


# hbm_efficiency: streaming kernels reach ~80-90% of datasheet HBM bandwidth
# (NVIDIA A100 tuning guide; STREAM-like copies on A100-80GB ~1.7-1.8 TB/s of
# 2.04); 0.8 is used for every GPU (fixed, not fitted).
_HBM_EFFICIENCY = 0.80

# flash_attention_efficiency: fraction of peak reached by fused attention,
# FlashAttention-2 (Dao 2023): 50-73% of peak fwd+bwd on A100, ~35% on H100;
# cuDNN / FlashAttention-3 (Shah et al. 2024) 50-75% on H100.  Fixed, not fitted.
_FLASH_EFF_A100 = 0.55
_FLASH_EFF_H100 = 0.50

_A100_ROWS = "SC21 Table 1 (10 rows), Megatron GPT-3 175B (1 row), BLOOM 48-node (7 rows)"
_H100_ROWS = "Megatron-Core r0.8.0 performance table (9 rows)"
_GRID = (
    "grid search through pipette_cp.cost.evaluator.evaluate (eta_max step 0.005, W_half in "
    "{0, 1e9, 3e9, 1e10, 3e10, 1e11}) minimising MAPE + 0.25 x worst error"
)

#: What was fitted per GPU family: ``(num_sms, gemm_efficiency_max,
#: gemm_half_saturation_flops, flash_attention_efficiency, rows fitted on)``.
_FITTED = {
    "A100": (108, 0.72, 3e10, _FLASH_EFF_A100, _A100_ROWS),
    "H100": (132, 0.675, 3e10, _FLASH_EFF_H100, _H100_ROWS),
}

#: FP8 GEMM ceiling ``eta_fp8`` (fraction of the dense FP8 peak) per GPU family with FP8
#: tensor cores, and the rows it was fitted on: the fit side of the NeMo 24.07 FP8 rows of
#: ``published_runs_moe_cp.csv`` (Transformer Engine, delayed scaling; 7 rows), grid step
#: 0.005 minimising MAPE + 0.25 x worst step-time error (MAPE 3.3 %, held-out 6.5 %).
_FP8_FITTED = {
    "H100": (0.660, "NeMo 24.07 FP8 performance summary (7 rows)"),
    # the Blackwell family (below): the 17 dense FP8 / MXFP8 pretraining rows of the fit
    # side of modern_runs.csv, grid 0.40-0.80 step 0.01 minimising the mean |log
    # step-time error| (0.116); BLACKWELL_FIT_COMMAND
    "B200": (0.66, "modern_runs.csv, fit side's dense Blackwell FP8 rows (17 rows)"),
}
#: NVFP4 GEMM ceiling ``eta_fp4`` (fraction of the dense FP4 peak) per GPU family with NVFP4
#: tensor cores, fitted on the 6 dense NVFP4 rows of the fit side of ``modern_runs.csv``
#: (Llama 3.1 8B on GB200, 405B on GB300; grid 0.20-0.80 step 0.01, minimising the mean
#: |log step-time error|: 0.040; ``BLACKWELL_FIT_COMMAND``): the FP4 peak is 2-3x the FP8
#: one, the GEMMs reach 1.06-1.6x the FP8 GEMMs' rate (GB200 and B200 least, GB300 most).
_FP4_FITTED = {"B200": 0.35}


def _provenance(family: str, rows: str) -> str:
    text = f"fitted on {rows}: {_GRID}; `{FIT_COMMAND}`"
    if family in _FP8_FITTED:
        text += f"; FP8 ceiling fitted on {_FP8_FITTED[family][1]}: `{FP8_FIT_COMMAND}`"
    return text


#: Compute calibration per GPU family (matched on the GpuSpec name).
GPU_CALIBRATION: dict[str, GpuCalibration] = {
    family: GpuCalibration(
        gpu_family=family,
        num_sms=num_sms,
        gemm_efficiency_max=eta_max,
        gemm_half_saturation_flops=half,
        hbm_efficiency=_HBM_EFFICIENCY,
        flash_attention_efficiency=flash,
        fitted=True,
        provenance=_provenance(family, rows),
        fp8_gemm_efficiency_max=_FP8_FITTED.get(family, (math.nan, ""))[0],
    )
    for family, (num_sms, eta_max, half, flash, rows) in _FITTED.items()
}

#: GPU families without calibration rows borrow a conservative default: the
#: lowest fitted ceiling and the largest half-saturation size (err slow).
DEFAULT_GPU_CALIBRATION = GpuCalibration(
    gpu_family="default",
    num_sms=80,
    gemm_efficiency_max=min(c.gemm_efficiency_max for c in GPU_CALIBRATION.values()),
    gemm_half_saturation_flops=max(c.gemm_half_saturation_flops for c in GPU_CALIBRATION.values()),
    hbm_efficiency=_HBM_EFFICIENCY,
    flash_attention_efficiency=min(_FLASH_EFF_A100, _FLASH_EFF_H100),
    fitted=False,
    provenance="not fitted: the most pessimistic fitted values (no calibration rows)",
    fp8_gemm_efficiency_max=min(eta for eta, _ in _FP8_FITTED.values()),
    fp4_gemm_efficiency_max=min(_FP4_FITTED.values()),
)

#: The Blackwell family's key: B200 and GB200 by name, B300 and GB300 by architecture.
BLACKWELL_FAMILY = "B200"
#: Command that re-fits the Blackwell family and prints its accuracy on both sides.
BLACKWELL_FIT_COMMAND = "python -m pipette_cp.experiments.models.modern_runs --fit"
#: Blackwell (B200, GB200, B300, GB300; 148 SMs, the B200's): the FP8 and NVFP4 ceilings
#: of :data:`_FP8_FITTED` and :data:`_FP4_FITTED` (the FP8 one came out at H100's);
#: H100's fixed per-GEMM time (``W_half`` scaled by B200's bf16 peak over H100's); the
#: bf16 ceiling and the fused attention's efficiency H100's (no dense bf16 Blackwell row
#: to fit them on).
GPU_CALIBRATION[BLACKWELL_FAMILY] = GpuCalibration(
    gpu_family=BLACKWELL_FAMILY,
    num_sms=148,
    gemm_efficiency_max=_FITTED["H100"][1],
    gemm_half_saturation_flops=6.8e10,
    hbm_efficiency=_HBM_EFFICIENCY,
    flash_attention_efficiency=_FLASH_EFF_H100,
    fitted=True,
    provenance=(
        f"FP8 ceiling {_FP8_FITTED[BLACKWELL_FAMILY][0]} fitted on "
        f"{_FP8_FITTED[BLACKWELL_FAMILY][1]}, NVFP4 ceiling {_FP4_FITTED[BLACKWELL_FAMILY]} on "
        f"its 6 dense NVFP4 rows: `{BLACKWELL_FIT_COMMAND}`; W_half H100's fixed per-GEMM "
        "time at B200's peak; bf16 ceiling and fused attention H100's"
    ),
    fp8_gemm_efficiency_max=_FP8_FITTED[BLACKWELL_FAMILY][0],
    fp4_gemm_efficiency_max=_FP4_FITTED[BLACKWELL_FAMILY],
)

#: H200 is the H100 chip with more and faster HBM (the GpuSpec carries both).
_FAMILY_ALIASES = {"H200": "H100", "H800": "H100", "A800": "A100"}
#: The family of a GPU whose name names none, by its architecture: every Hopper part
#: (H800, H20, GH200) takes the H100's fitted values until rows of its own are fitted
#: (the GpuSpec carries its own peaks and HBM; H20's 78 SMs differ from the family's
#: 132: an assumption on its wave quantisation); every Blackwell part the Blackwell
#: family's (B300 and GB300: Blackwell Ultra, the same FP8 and bf16 tensor cores).
_ARCHITECTURE_FAMILY = {"hopper": "H100", "blackwell": BLACKWELL_FAMILY}

#: Memory calibration, fitted on the 7 BLOOM rows (nvidia-smi, A100 80GB).
MEMORY_CALIBRATION = MemoryCalibration(
    runtime_bytes=5.56 * GiB,
    allocator_fraction=0.105,
    provenance=(
        "fitted on the 7 BLOOM 48-node rows (nvidia-smi, max of first/last stage, read as "
        "GiB): smallest runtime constant with no row underestimated, allocator fraction "
        f"minimising the worst error (fit 5.550 GiB, rounded up); `{FIT_COMMAND}`"
    ),
)

#: Latency of one intra-node NCCL collective step, s (nccl-tests small-message
#: all-reduce on NVLink: ~10-20 us; fixed).
COLLECTIVE_LATENCY_S = 10e-6

#: Peak used when a GPU spec leaves it implausibly low (guards divisions).
_MIN_PEAK = 1 * TFLOPS


def gpu_family(gpu: GpuSpec) -> str:
    """Family key of a GPU ('A100-SXM4-80GB' -> 'A100'), from its name, else from its
    architecture (:data:`_ARCHITECTURE_FAMILY`: 'H20-96GB' -> 'H100'); '' when unknown.

    >>> from pipette_cp.specs.gpu import resolve_gpu
    >>> [gpu_family(resolve_gpu(g)) for g in ("h800", "h20", "gh200", "b300", "gb300")]
    ['H100', 'H100', 'H100', 'B200', 'B200']
    """
    name = gpu.name.upper()
    for family in (*GPU_CALIBRATION, *_FAMILY_ALIASES):
        if family in name:
            return _FAMILY_ALIASES.get(family, family)
    return _ARCHITECTURE_FAMILY.get(gpu.architecture, "")


def calibration_for(gpu: GpuSpec) -> GpuCalibration:
    """The compute calibration of ``gpu``'s family, or the conservative default.

    >>> from pipette_cp.specs.gpu import resolve_gpu
    >>> calibration_for(resolve_gpu("h200")).gpu_family
    'H100'
    >>> calibration_for(resolve_gpu("v100")).fitted
    False
    """
    return GPU_CALIBRATION.get(gpu_family(gpu), DEFAULT_GPU_CALIBRATION)


def peak_flops(gpu: GpuSpec) -> float:
    """Dense tensor-core peak of ``gpu``, FLOP/s (never below 1 TFLOP/s)."""
    return max(gpu.peak_flops_per_s, _MIN_PEAK)


def peak_fp4_flops(gpu: GpuSpec) -> float:
    """Dense NVFP4 tensor-core peak of ``gpu``, FLOP/s (the FP8 peak where it has none)."""
    return max(gpu.peak_fp4_flops_per_s or peak_fp8_flops(gpu), _MIN_PEAK)


def peak_fp8_flops(gpu: GpuSpec) -> float:
    """Dense FP8 tensor-core peak of ``gpu``, FLOP/s (the bf16 peak where it has none)."""
    return max(gpu.peak_fp8_flops_per_s or gpu.peak_flops_per_s, _MIN_PEAK)


# ----------------------------------------------------------------------- fitting
def fit_gemm_efficiency(
    errors_of: Callable[[float, float], np.ndarray],
    ceilings: Sequence[float],
    half_saturations: Sequence[float],
) -> tuple[float, float, float]:
    """Grid search of ``(eta_max, W_half)`` minimising ``MAPE + 0.25 x worst error``.

    ``errors_of(eta_max, W_half)`` returns the relative throughput errors of the
    calibration rows under those values.  Returns ``(eta_max, W_half, objective)``;
    ties go to the first grid point (smallest values), so the fit is deterministic.
    """
    best = (math.inf, 0.0, 0.0)
    for ceiling in ceilings:
        for half in half_saturations:
            errors = np.abs(np.asarray(errors_of(ceiling, half), dtype=float))
            objective = float(errors.mean() + 0.25 * errors.max())
            if objective < best[0]:
                best = (objective, ceiling, half)
    return best[1], best[2], best[0]


def fit_memory_runtime(
    tensor_bytes: Sequence[float],
    dynamic_bytes: Sequence[float],
    measured_bytes: Sequence[float],
    fractions: Sequence[float] = tuple(np.arange(0.0, 0.4001, 0.005)),
) -> tuple[float, float, float]:
    """``(runtime_bytes, allocator_fraction, worst error)`` that never underestimate.

    Prediction ``tensors + runtime + fraction x dynamic`` (``dynamic`` is the part
    of ``tensors`` allocated and freed every micro-batch); for each fraction the
    smallest runtime constant with no row below its measurement, then the
    fraction with the smallest worst relative error (a tiny LP solved on a grid).

    >>> fit_memory_runtime([10.0, 20.0], [2.0, 6.0], [13.0, 25.0], fractions=[0.0, 0.5])
    (2.0, 0.5, 0.0)
    """
    tensors, dynamic, measured = (
        np.asarray(x, dtype=float) for x in (tensor_bytes, dynamic_bytes, measured_bytes)
    )
    best = (math.inf, 0.0, 0.0)
    for fraction in fractions:
        runtime = max(0.0, float((measured - tensors - fraction * dynamic).max()))
        worst = float(((tensors + runtime + fraction * dynamic) / measured - 1.0).max())
        if worst < best[0] - 1e-12:
            best = (worst, runtime, float(fraction))
    return best[1], best[2], best[0]
