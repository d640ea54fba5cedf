"""Time of one GEMM (bf16 or FP8) and of memory-bound kernels on one GPU.

The primitives of :mod:`pipette_cp.cost.compute.model_chunks`: tile and wave quantisation, a
saturating efficiency for small GEMMs, the HBM roofline; parameters per GPU type in
:mod:`pipette_cp.cost.stack.calibration`.
"""

from __future__ import annotations

from pipette_cp.cost.stack.calibration import (
    GpuCalibration,
    peak_flops,
    peak_fp4_flops,
    peak_fp8_flops,
)
from pipette_cp.cost.stack.kernels import NVFP4_BYTES, fp8_gemm_rate, uses_fp4
from pipette_cp.cost.workload.flops import Gemm
from pipette_cp.specs.gpu import GpuSpec
from pipette_cp.specs.training import TrainingSpec


def wave_efficiency(gemm: Gemm, num_sms: int) -> float:
    """Useful fraction of the tile waves a GEMM launches (tile and wave quantisation).

    The output is cut into ``256 x 128`` tiles (cuBLAS's large bf16 tile on A100 and
    H100, either orientation, the better one taken), one tile per SM per wave:
    ``m n / (waves x SMs x tile area)`` (NVIDIA Deep Learning Performance Guide,
    "Matrix Multiplication Background": tile and wave quantisation).

    >>> wave_efficiency(Gemm("x", 256 * 108, 128, 64), 108)
    1.0
    >>> round(wave_efficiency(Gemm("x", 256 * 109, 128, 64), 108), 3)
    0.505
    """
    best = 0.0
    for tile_m, tile_n in ((256, 128), (128, 256)):
        tiles = -(-gemm.m // tile_m) * -(-gemm.n // tile_n) * gemm.batch
        waves = -(-tiles // num_sms)
        best = max(best, gemm.m * gemm.n * gemm.batch / (waves * num_sms * tile_m * tile_n))
    return best


def gemm_time_s(gemm: Gemm, gpu: GpuSpec, cal: GpuCalibration) -> float:
    """Time of one GEMM: ``(W / q + W_half) / (eta_max x peak)``, at least its HBM traffic.

    ``q`` is the wave efficiency (:func:`wave_efficiency`); the saturating term
    ``eta_max W / (W + W_half)`` is the few-parameter form of the remaining
    small-size losses (launch, prologue/epilogue); capped by the roofline.
    """
    # One kernel call per GEMM (batched ones too): the half-saturation cost once.
    work = gemm.flops / wave_efficiency(gemm, cal.num_sms) + cal.gemm_half_saturation_flops
    compute = work / (cal.gemm_efficiency_max * peak_flops(gpu))
    # Roofline: both operands and the result read/written once, 2 B each.
    traffic = 2.0 * (gemm.m * gemm.k + gemm.k * gemm.n + gemm.m * gemm.n) * gemm.batch
    return max(compute, hbm_time_s(traffic, gpu, cal))


def fp8_gemm_time_s(gemm: Gemm, gpu: GpuSpec, cal: GpuCalibration, rate: float = 1.0) -> float:
    """Time of one FP8 GEMM: ``W / q / (eta_fp8 x rate x fp8 peak)`` plus the bf16 GEMMs'
    fixed time ``W_half / (eta_max x peak)`` (the same launch, prologue and epilogue), at
    least its HBM traffic (FP8 operands, 1 B; bf16 result, 2 B).  ``rate`` is the recipe's
    kernel speed (:data:`pipette_cp.cost.stack.kernels.FP8_RECIPE_RATE`); the casts to FP8 are
    timed apart (:func:`pipette_cp.cost.stack.kernels.quantization_cast_bytes`)."""
    ceiling = cal.fp8_gemm_efficiency_max * rate * peak_fp8_flops(gpu)
    fixed = cal.gemm_half_saturation_flops / (cal.gemm_efficiency_max * peak_flops(gpu))
    compute = gemm.flops / wave_efficiency(gemm, cal.num_sms) / ceiling + fixed
    traffic = (gemm.m * gemm.k + gemm.k * gemm.n + 2.0 * gemm.m * gemm.n) * gemm.batch
    return max(compute, hbm_time_s(traffic, gpu, cal))


def fp4_gemm_time_s(gemm: Gemm, gpu: GpuSpec, cal: GpuCalibration) -> float:
    """Time of one NVFP4 GEMM: ``W / q / (eta_fp4 x fp4 peak)`` plus the bf16 GEMMs' fixed
    time, at least its HBM traffic (NVFP4 operands, :data:`NVFP4_BYTES`; bf16 result).
    The casts are timed apart (:func:`pipette_cp.cost.stack.kernels.quantization_cast_bytes`)."""
    ceiling = cal.fp4_gemm_efficiency_max * peak_fp4_flops(gpu)
    fixed = cal.gemm_half_saturation_flops / (cal.gemm_efficiency_max * peak_flops(gpu))
    compute = gemm.flops / wave_efficiency(gemm, cal.num_sms) / ceiling + fixed
    operands = NVFP4_BYTES * (gemm.m * gemm.k + gemm.k * gemm.n)
    traffic = (operands + 2.0 * gemm.m * gemm.n) * gemm.batch
    return max(compute, hbm_time_s(traffic, gpu, cal))


def quantized_gemm_time_s(
    gemm: Gemm, gpu: GpuSpec, cal: GpuCalibration, training: TrainingSpec
) -> float:
    """A layer GEMM in the training's quantised format: NVFP4 (:func:`fp4_gemm_time_s`)
    or FP8 at its recipe's rate (:func:`fp8_gemm_time_s`)."""
    if uses_fp4(training):
        return fp4_gemm_time_s(gemm, gpu, cal)
    return fp8_gemm_time_s(gemm, gpu, cal, fp8_gemm_rate(training))


def hbm_time_s(num_bytes: float, gpu: GpuSpec, cal: GpuCalibration) -> float:
    """Memory-bound kernels: bytes moved / achievable HBM bandwidth."""
    return num_bytes / (gpu.hbm_bandwidth_bytes_per_s * cal.hbm_efficiency)
