"""Time of LoRA's adapter GEMMs on one GPU (the adapters themselves:
:mod:`pipette_cp.cost.workload.lora`).

An adapter GEMM has the rank ``r`` as one of its three dimensions (A: ``T x a -> T x r``,
B: ``T x r -> T x b``, and their gradients), so it does about ``r`` FLOPs per byte it
moves (``2 m n k / (2 (m k + k n + m n))`` with ``n`` or ``k`` = r): 16 at rank 16, far
below the ridge point of every GPU of the catalogue (H100: 989 TFLOP/s over 3.35 TB/s,
about 295 FLOP/B).  It is timed by its HBM traffic (operands and result read or written
once, 2 B each) at the calibrated HBM rate, not by the GEMM model of
:func:`~pipette_cp.cost.compute.gemm.gemm_time_s`, whose 256 x 128 output tiles and
fixed per-call work are fitted on the layers' wide GEMMs and would count a rank-16
output as an eighth of a tile (assumption: cuBLAS picks narrow tiles or split-K for
such shapes).  Bf16 under every precision: Megatron-Bridge's adapters are Megatron-Core
linears, outside Transformer Engine's FP8.
"""

from __future__ import annotations

from pipette_cp.cost.compute.gemm import hbm_time_s
from pipette_cp.cost.stack.calibration import GpuCalibration
from pipette_cp.cost.workload.flops import Gemm
from pipette_cp.cost.workload.lora import adapter_gemms
from pipette_cp.specs.gpu import GpuSpec
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import TrainingSpec

#: Bytes per element of an adapter GEMM's operands and result (bf16).
ADAPTER_ELEMENT_BYTES = 2.0


def adapter_gemm_time_s(gemm: Gemm, gpu: GpuSpec, cal: GpuCalibration) -> float:
    """One adapter GEMM: its operands and result moved once through HBM."""
    elements = (gemm.m * gemm.k + gemm.k * gemm.n + gemm.m * gemm.n) * gemm.batch
    return hbm_time_s(ADAPTER_ELEMENT_BYTES * elements, gpu, cal)


def adapter_times_s(
    model: ModelSpec, training: TrainingSpec, gpu: GpuSpec, plan: Plan, cal: GpuCalibration
) -> tuple[float, float]:
    """(forward, backward) of one layer's adapters on one GPU per micro-batch: A and B of
    every adapted linear, then their data and weight gradients; (0, 0) without LoRA."""
    gemms = adapter_gemms(model, training, plan)
    forward = sum(adapter_gemm_time_s(g, gpu, cal) for g in gemms)
    backward = sum(adapter_gemm_time_s(x, gpu, cal) for g in gemms for x in g.backward())
    return forward, backward
