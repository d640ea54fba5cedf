"""Accuracy of the FP8 compute and memory models on published dense FP8 runs.

``python -m pipette_cp.experiments.models.fp8_accuracy`` rebuilds the dense rows without
context parallelism of ``published_runs_moe_cp.csv`` from two sources
(:func:`pipette_cp.experiments.models.published_runs_setup.fp8_family_setup`):

- NeMo 24.07 performance summary (10 rows, all FP8, H100 80GB): Megatron-Core with
  Transformer Engine FP8, delayed scaling (Megatron's and NeMo's default), hybrid format.
- torchtitan's H100 benchmarks (8 FP8 rows, torchao Float8 with tensorwise dynamic
  scaling, and 4 BF16 rows of the same 8B runs): FSDP2, TP, PP on a 500 W H100 96GB.

It predicts each row's step time with the :class:`~pipette_cp.cost.evaluator.evaluate.Evaluator` and
prints, per family and side of :func:`~pipette_cp.experiments.models.calibration_split.assign_split`,
the step-time MAPE and the median predicted/measured throughput; the FP8 over BF16 speedup
of torchtitan's matched runs (same layout, torch.compile on both), measured and predicted;
and predicted vs measured peak memory of the torchtitan rows.  ``--fit`` re-fits the FP8
GEMM ceiling ``eta_fp8`` of the H100 family
(:data:`pipette_cp.cost.stack.calibration.GPU_CALIBRATION`) on the fit side of the NeMo rows
(:data:`FIT_FAMILIES`; Transformer Engine, the stack the product costs and exports) by the
grid search of :func:`pipette_cp.cost.stack.calibration.fit_gemm_efficiency` on step-time
errors, and prints it.  Every other row is held out of that fit: NeMo's held-out side and
every torchtitan row (torchao, another stack).  ``--fit`` also re-fits torchtitan's H100
compute efficiency on the fit side's torchtitan BF16 rows
(:func:`pipette_cp.experiments.models.torchtitan_rows.fit_compute_efficiency`; the profile,
:data:`pipette_cp.cost.stack.frameworks.FRAMEWORKS`, holds the result), so that its FP8 rows
test the FP8 model on top of a fitted BF16 speed; the report then uses both values.

Assumptions where a row is silent:

- NeMo: the Megatron-Core settings of :mod:`pipette_cp.experiments.models.accuracy`
  (sequence parallelism with tp > 1, TP and DP overlap, distributed optimizer, cuDNN
  attention, no recompute); GPT-3: GeLU, LayerNorm, learned positions, biases, vocabulary
  51200; Llama 2: SwiGLU, RMSNorm, RoPE, no biases, vocabulary 32000; Nemotron: squared
  ReLU as two GEMMs of width ffn (as GeLU), LayerNorm, RoPE, no biases, vocabulary 256000.
- torchtitan: Llama 3.1 (SwiGLU, RMSNorm, RoPE base 500000, no biases, no dropout), SDPA
  FlashAttention 2, fused norms and activations only under torch.compile, ``selective`` =
  torchtitan's per-op checkpointing for memory (:mod:`pipette_cp.cost.memory.recompute`)
  and Megatron's selective recomputation for time, FSDP2 as ZeRO-3 (ZeRO-1 under pipeline
  parallelism), one micro-batch per pipeline stage (local batch / (pp x vpp)), two virtual
  stages per rank for interleaved 1F1B; the benchmark's H100 with 2.4 TB/s of HBM2e
  (:data:`~pipette_cp.experiments.models.published_runs_setup.TORCHTITAN_GPU`).  Memory:
  torchtitan prints the caching allocator's reserved peak (``reserved_bytes.all.peak``,
  GiB, the largest of all GPUs), compared with the predicted peak less the runtime
  constant (:func:`~pipette_cp.experiments.models.torchtitan_rows.reserved_peak_gib`); the other
  families' rows with the nvidia-smi-like peak (runtime constant included).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from unittest.mock import patch

import numpy as np

from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.cost.stack import calibration as calib
from pipette_cp.cost.stack.frameworks import resolve_framework
from pipette_cp.experiments.models import torchtitan_rows
from pipette_cp.experiments.models.accuracy import read_rows
from pipette_cp.experiments.models.calibration_split import FIT, HELD_OUT, assign_split, family
from pipette_cp.experiments.models.published_runs_setup import (
    fp8_family_setup,
    is_dense_fp8_family_row,
    note,
    row_precision,
)
from pipette_cp.io.paths import INSTANCES_DIR
from pipette_cp.specs.training import FrameworkProfile
from pipette_cp.units import GiB

#: The bundled copy of the runs with experts, context parallelism or FP8.
MOE_CP_CSV = INSTANCES_DIR / "calibration" / "published_runs_moe_cp.csv"
#: Families whose fit-side FP8 rows fit the FP8 GEMM ceiling.
FIT_FAMILIES = ("nemo",)
#: The GPU family whose FP8 ceiling is fitted.
FP8_GPU_FAMILY = "H100"
#: Grid of FP8 GEMM ceilings (fractions of the dense FP8 peak), step 0.005.
FP8_GRID = tuple(round(0.40 + 0.005 * i, 3) for i in range(101))
#: Memory targets of the product: within this share of the measurement ...
MEMORY_TARGET = 0.10
#: ... and never below it by more than this share.
MEMORY_UNDER = 0.03


@dataclass(frozen=True)
class Fp8Result:
    """One row: measured and predicted tokens/s per GPU and peak memory (GiB, ``nan``
    where the row prints none)."""

    family: str
    side: str
    precision: str
    name: str
    layout: str
    measured: float
    predicted: float
    measured_mem_gib: float
    predicted_mem_gib: float
    compiled: bool

    @property
    def time_error(self) -> float:
        """(predicted - measured) / measured step time (= measured / predicted throughput - 1)."""
        return self.measured / self.predicted - 1.0

    @property
    def memory_error(self) -> float:
        """(predicted - measured) / measured peak memory."""
        return self.predicted_mem_gib / self.measured_mem_gib - 1.0


def fp8_rows(path: Path = MOE_CP_CSV) -> list[tuple[dict[str, str], str]]:
    """The dense rows without context parallelism of the FP8 families, with their side."""
    rows = read_rows(path)
    sides = assign_split(rows)
    return [(r, s) for r, s in zip(rows, sides, strict=True) if is_dense_fp8_family_row(r)]


def evaluate_row(
    row: dict[str, str], side: str, torchtitan_efficiency: float | None = None
) -> Fp8Result:
    """Predict one row with today's calibration (``torchtitan_efficiency``: the compute
    efficiency of a torchtitan row; None: the profile's)."""
    titan = family(row) == "torchtitan"
    setup = fp8_family_setup(row, compute_efficiency=torchtitan_efficiency if titan else None)
    inst, plan = setup.instance, setup.plan
    evaluation = Evaluator(inst).evaluate(plan)
    tokens = inst.training.global_batch_size * inst.training.seq_length
    measured = float((note(row["notes"], "tokens_per_s_per_gpu") or "nan").split()[0])
    memory = row["measured_mem_gb_per_gpu"]
    peak = torchtitan_rows.reserved_peak_gib(inst, plan) if titan else evaluation.memory_bytes_max / GiB  # fmt: skip
    return Fp8Result(
        family(row), side, row_precision(row), row["model_name"], plan.layout(), measured,
        tokens / evaluation.iteration_time_s / plan.num_gpus,
        float(memory) if memory else math.nan, peak,
        (note(row["notes"], "torch.compile") or "") == "y",
    )  # fmt: skip


def run_fp8(
    path: Path = MOE_CP_CSV,
    eta_fp8: float | None = None,
    torchtitan_efficiency: float | None = None,
) -> list[Fp8Result]:
    """Every row of :func:`fp8_rows` evaluated (with ``eta_fp8`` as the H100 family's FP8
    GEMM ceiling and ``torchtitan_efficiency`` as torchtitan's compute efficiency if
    given)."""
    rows = fp8_rows(path)
    if eta_fp8 is None:
        return [evaluate_row(r, s, torchtitan_efficiency) for r, s in rows]
    cal = replace(calib.GPU_CALIBRATION[FP8_GPU_FAMILY], fp8_gemm_efficiency_max=eta_fp8)
    with patch.dict(calib.GPU_CALIBRATION, {FP8_GPU_FAMILY: cal}):
        return [evaluate_row(r, s, torchtitan_efficiency) for r, s in rows]


def _fit_side(results: list[Fp8Result]) -> list[Fp8Result]:
    return [r for r in results if r.family in FIT_FAMILIES and r.side == FIT and r.precision == "fp8"]  # fmt: skip


def fit_fp8(path: Path = MOE_CP_CSV) -> tuple[float, float]:
    """``(eta_fp8, objective)``: the grid value minimising MAPE + 0.25 x worst step-time
    error on the fit side of :data:`FIT_FAMILIES`
    (:func:`pipette_cp.cost.stack.calibration.fit_gemm_efficiency` with one parameter)."""

    def errors(eta: float, _half: float) -> np.ndarray:
        return np.array([r.time_error for r in _fit_side(run_fp8(path, eta))])

    eta, _, objective = calib.fit_gemm_efficiency(errors, FP8_GRID, (0.0,))
    return eta, objective


# ------------------------------------------------------------------------- report
def _cell(results: list[Fp8Result]) -> str:
    errors = np.array([r.time_error for r in results])
    ratios = np.array([r.predicted / r.measured for r in results])
    return (
        f"{len(results):5d} {100 * np.mean(np.abs(errors)):6.1f}% "
        f"{100 * np.max(np.abs(errors)):6.1f}% {np.median(ratios):8.3f}"
    )


def format_report(results: list[Fp8Result]) -> str:
    """Step-time accuracy per (family, precision, side), every row, the torchtitan FP8
    speedups and the memory comparison, as plain text."""
    cells: dict[tuple[str, str, str], list[Fp8Result]] = defaultdict(list)
    for r in results:
        cells[(r.family, r.precision, r.side)].append(r)
    lines = [f"{'family':10s} {'prec':5s} {'side':9s} {'rows':>5s} {'MAPE':>7s} {'worst':>7s} {'med p/m':>8s}"]  # fmt: skip
    for (fam, prec, side), group in sorted(cells.items()):
        lines.append(f"{fam:10s} {prec:5s} {side:9s} {_cell(group)}")
    held = [r for r in results if r.precision == "fp8" and r not in _fit_side(results)]
    lines.append(f"{'FP8 held out of the fit':26s} {_cell(held)}")
    lines += format_normalised(results)
    lines.append("\nrows: family side precision model layout tokens/s/GPU measured predicted "
                 "step-time error")  # fmt: skip
    for r in results:
        lines.append(
            f"  {r.family:10s} {r.side:9s} {r.precision:4s} {r.name[:22]:22s} {r.layout:32s} "
            f"{r.measured:8.0f} {r.predicted:8.0f} {100 * r.time_error:+6.1f}%"
        )
    lines += ["", *format_speedups(results), "", *format_memory(results)]
    return "\n".join(lines)


def format_normalised(results: list[Fp8Result]) -> list[str]:
    """FP8 step-time MAPE of each family with BF16 rows after dividing every prediction by
    the median predicted/measured throughput of the family's BF16 rows: the FP8 part of
    the error, apart from the BF16 model's."""
    lines = []
    for fam in sorted({r.family for r in results if r.precision == "bf16"}):
        base = float(np.median([r.predicted / r.measured for r in results
                                if r.family == fam and r.precision == "bf16"]))  # fmt: skip
        for side in (FIT, HELD_OUT):
            group = [r for r in results if (r.family, r.side, r.precision) == (fam, side, "fp8")]
            if group:
                errors = [abs(r.measured * base / r.predicted - 1.0) for r in group]
                lines.append(
                    f"{fam} fp8 {side}, over its bf16 median p/m {base:.3f}: "
                    f"MAPE {100 * np.mean(errors):.1f}%, worst {100 * np.max(errors):.1f}%"
                )
    return lines


def format_speedups(results: list[Fp8Result]) -> list[str]:
    """FP8 over BF16 throughput of runs that differ only in precision (torch.compile on)."""
    lines = ["FP8 / BF16 speedup of matched runs (same family, model, layout, torch.compile):"]
    bf16 = {
        (r.family, r.name, r.layout): r for r in results if r.precision == "bf16" and r.compiled
    }
    for r in results:
        base = bf16.get((r.family, r.name, r.layout))
        if r.precision == "fp8" and base is not None:
            lines.append(
                f"  {r.name} {r.layout}: measured {r.measured / base.measured:.3f}, "
                f"predicted {r.predicted / base.predicted:.3f}"
            )
    return lines


def format_memory(results: list[Fp8Result]) -> list[str]:
    """Predicted vs measured peak memory of the rows that print one."""
    rows = [r for r in results if math.isfinite(r.measured_mem_gib)]
    lines = [f"memory (target: within {100 * MEMORY_TARGET:.0f} %, never more than "
             f"{100 * MEMORY_UNDER:.0f} % below): precision layout measured predicted GiB"]  # fmt: skip
    for r in rows:
        lines.append(
            f"  {r.precision:4s} {r.name[:16]:16s} {r.layout:32s} {r.measured_mem_gib:6.1f} "
            f"{r.predicted_mem_gib:6.1f} {100 * r.memory_error:+6.1f}%"
        )
    if rows:
        errors = np.array([r.memory_error for r in rows])
        within = int(np.sum((errors <= MEMORY_TARGET) & (errors >= -MEMORY_UNDER)))
        lines.append(
            f"  {within} of {len(rows)} rows on target; mean |error| "
            f"{100 * np.mean(np.abs(errors)):.1f} %"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print the report (``--fit``: first re-fit ``eta_fp8`` and print it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true",
                        help="re-fit the FP8 GEMM ceiling and torchtitan's compute efficiency")  # fmt: skip
    args = parser.parse_args(argv)
    eta = titan = None
    if args.fit:
        eta, objective = fit_fp8()
        fitted = sum(1 for r in _fit_side(run_fp8(eta_fp8=eta)))
        print(f"fitted eta_fp8 ({FP8_GPU_FAMILY}) = {eta:.3f} on {fitted} rows "
              f"(objective MAPE + 0.25 x worst = {objective:.4f})")  # fmt: skip
        titan, count = torchtitan_rows.fit_compute_efficiency()
        held = resolve_framework(FrameworkProfile(name="torchtitan")).compute_scale("H100")
        print(f"fitted torchtitan compute efficiency (H100) = {titan:.3f} on {count} fit-side "
              f"BF16 rows (the profile holds {held:.3f})\n")  # fmt: skip
    print(format_report(run_fp8(eta_fp8=eta, torchtitan_efficiency=titan)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
