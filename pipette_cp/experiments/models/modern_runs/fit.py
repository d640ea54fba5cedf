"""The Blackwell compute calibration, fitted on the fit side of ``modern_runs.csv``.

``python -m pipette_cp.experiments.models.modern_runs --fit`` prints the values that
:data:`pipette_cp.cost.stack.calibration.GPU_CALIBRATION` holds for the Blackwell family
(B200, GB200, B300, GB300).

Two physical parameters, each by a grid search on the fit side's dense Blackwell
pretraining rows of its precision, minimising the mean absolute log error of the step
time (predicted / measured; the log keeps one wild row from deciding the fit): the FP8
GEMM ceiling ``eta_fp8`` (a fraction of the FP8 peak) on the FP8 and MXFP8 rows, then
the NVFP4 GEMM ceiling ``eta_fp4`` (a fraction of the dense FP4 peak) on the NVFP4 rows.

The fixed time every GEMM pays (launch, prologue, epilogue) is H100's fitted one, so the
half-saturation size ``W_half`` scales with the peak (H100's 3e10 FLOPs x 2,250 / 989
TFLOP/s, B200's bf16 peak over H100's): fitting it too would put 118 us on every GEMM
(2e11 FLOPs, mean |log error| 0.101 against 0.116), a fixed cost no kernel has, which
would stand in for the size effects of the rows' small models.  The bf16 ceiling and the
fused attention's efficiency stay H100's (no dense bf16 Blackwell row to fit them on).
The mixture-of-experts rows are not fitted on: their errors differ by model (Qwen3-30B-
A3B and GPT-OSS 120B 1.4-2.0x optimistic on the fit side's releases, Qwen3-235B-A22B
1.1-2.5x) in ways one GEMM factor does not describe.

Held-out rows are never read by the fit; the report prints both sides.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any
from unittest.mock import patch

import numpy as np

from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.cost.stack import calibration as calib
from pipette_cp.experiments.models.modern_runs.build import ModernSetup, row_setup
from pipette_cp.experiments.models.modern_runs.evaluate import ModernResult, run
from pipette_cp.experiments.models.modern_runs.features import read_modern_rows

#: The Blackwell family's key in ``GPU_CALIBRATION``.
FAMILY = calib.BLACKWELL_FAMILY
#: Grids searched for ``eta_fp8`` and ``eta_fp4``.
FP8_CEILINGS = tuple(float(x) for x in np.round(np.arange(0.40, 0.8001, 0.01), 2))
FP4_CEILINGS = tuple(float(x) for x in np.round(np.arange(0.20, 0.8001, 0.01), 2))
#: H100's fixed per-GEMM time at B200's bf16 peak, FLOPs (3e10 x 2,250 / 989, rounded).
HALF_SATURATION = 6.8e10


@dataclass(frozen=True)
class BlackwellFit:
    """The fitted values, the rows each read and its objective (mean |log error|)."""

    fp8_gemm_efficiency_max: float
    rows: tuple[str, ...]
    objective: float
    fp4_gemm_efficiency_max: float
    fp4_rows: tuple[str, ...]
    fp4_objective: float


def is_blackwell(result: ModernResult) -> bool:
    """A row on a Blackwell GPU (the report's B200/B300 and GB200/GB300 families)."""
    return result.info.gpu_family in ("B200/B300", "GB200/GB300")


def fit_rows(results: Sequence[ModernResult], fp4: bool = False) -> tuple[str, ...]:
    """The fit side's dense Blackwell pretraining rows (duplicates and LoRA rows left out:
    the GEMM ceilings are fitted on full training): FP8 and MXFP8, or with ``fp4`` NVFP4."""
    return tuple(
        r.info.row_id
        for r in results
        if r.info.side == "fit"
        and is_blackwell(r)
        and not r.info.moe
        and not r.info.duplicate
        and r.info.kind == "pretrain"
        and (r.info.precision == "nvfp4") is fp4
        and r.info.precision != "bf16"
    )


def setups_of(row_ids: Collection[str]) -> list[ModernSetup]:
    """The rows ``row_ids`` of ``modern_runs.csv`` built once (instance, plan, measured
    step), for every grid point of the fit to price."""
    return [row_setup(row) for row in read_modern_rows() if row["row_id"] in row_ids]


def log_errors(setups: Sequence[ModernSetup], cal: calib.GpuCalibration) -> np.ndarray:
    """``|log(predicted / measured step time)|`` of ``setups`` with ``cal`` as the
    Blackwell family's calibration."""
    with patch.dict(calib.GPU_CALIBRATION, {FAMILY: cal}):
        predicted = [Evaluator(st.instance).evaluate(st.plan).iteration_time_s for st in setups]
    return np.abs(np.log(np.array(predicted) / [st.measured_step_s for st in setups]))


def _search(
    setups: Sequence[ModernSetup], base: calib.GpuCalibration, field: str,
    grid: Sequence[float],
) -> tuple[float, float]:  # fmt: skip
    """The grid value of ``field`` with the least mean |log error| on ``setups`` (ties
    keep the first), and that error."""
    best, best_value = math.nan, math.inf
    for value in grid:
        changes: dict[str, Any] = {field: value}
        error = float(log_errors(setups, replace(base, **changes)).mean())
        if error < best_value - 1e-12:
            best, best_value = value, error
    return best, best_value


def fit_blackwell(results: Sequence[ModernResult] | None = None) -> BlackwellFit:
    """The grid searches of the module docstring, FP8 first."""
    results = results if results is not None else run()[0]
    rows, fp4_rows = fit_rows(results), fit_rows(results, fp4=True)
    base = replace(calib.GPU_CALIBRATION[FAMILY], gemm_half_saturation_flops=HALF_SATURATION)
    eta_fp8, fp8_value = _search(setups_of(rows), base, "fp8_gemm_efficiency_max", FP8_CEILINGS)
    base = replace(base, fp8_gemm_efficiency_max=eta_fp8)
    fp4 = setups_of(fp4_rows)
    eta_fp4, fp4_value = _search(fp4, base, "fp4_gemm_efficiency_max", FP4_CEILINGS)
    return BlackwellFit(eta_fp8, rows, fp8_value, eta_fp4, fp4_rows, fp4_value)


def format_fit(fit: BlackwellFit) -> str:
    """The fitted values as the calibration table states them."""
    return (
        "== Blackwell compute calibration (fit side only)\n"
        f"{len(fit.rows)} dense rows: eta_fp8 = {fit.fp8_gemm_efficiency_max:.2f} "
        f"(W_half {HALF_SATURATION:.1e} FLOPs; mean |log error| {fit.objective:.3f})\n"
        f"{len(fit.fp4_rows)} dense NVFP4 rows: eta_fp4 = {fit.fp4_gemm_efficiency_max:.2f} "
        f"(mean |log error| {fit.fp4_objective:.3f})"
    )
