"""torchtitan's rows of ``published_runs_moe_cp.csv``: the two fitted speeds of its profile
and the report of its long-context sweeps.

``pipette_cp.cost.stack.frameworks.FRAMEWORKS["torchtitan"]`` holds the fitted values; the two
experiments that show the torchtitan rows re-fit and print them with ``--fit``:

- :func:`fit_compute_efficiency` (``python -m pipette_cp.experiments.models.fp8_accuracy --fit``):
  the H100 compute efficiency (``gpu_efficiency``) on the fit side's torchtitan BF16 rows
  without context parallelism, by the frameworks' rule, ``1 / median(predicted / measured
  throughput)`` (:mod:`pipette_cp.cost.stack.frameworks`), iterated to its fixed point (a step is
  not exactly proportional to it: the optimizer and exposed communication do not scale).
  The FP8 rows stay out, so that they test the FP8 model (``eta_fp8``, fitted on NeMo's
  rows, and torchao's casts) on top of it.
- :func:`fit_cp_attention_efficiency` (``python -m pipette_cp.experiments.models.moe_cp_accuracy
  --fit``): ``cp_attention_efficiency``, the fused attention's speed under PyTorch's ring
  attention relative to one SDPA call, by grid search (:data:`CP_GRID`) minimising the
  step-time MAPE of the fit side's torchtitan rows with cp > 1, at the profile's compute
  efficiency.

Neither reads a held-out row.  :func:`format_references` and :func:`format_memory` are
the torchtitan part of :mod:`pipette_cp.experiments.models.moe_cp_accuracy`'s report.

Memory: torchtitan's rows print the caching allocator's reserved peak
(``reserved_bytes.all.peak``), which holds no CUDA context and no NCCL buffers, while the
memory model predicts what the GPU holds (the runtime constant included, for the fit
decision): :func:`reserved_peak_gib` compares like with like, the peak less the runtime
constant (:attr:`~pipette_cp.cost.memory.peak.MemoryBreakdown.reserved_bytes`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from unittest.mock import patch

import numpy as np

from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.cost.memory.peak import memory_by_stage
from pipette_cp.cost.stack import frameworks as fw
from pipette_cp.experiments.models.accuracy import read_rows
from pipette_cp.experiments.models.calibration_split import FIT, HELD_OUT, assign_split, family
from pipette_cp.experiments.models.moe_cp_rows import RowResult
from pipette_cp.experiments.models.moe_cp_setup import (
    MOE_CP_CSV,
    moe_cp_setup,
    row_cp,
    selected_rows,
)
from pipette_cp.experiments.models.published_runs_setup import (
    fp8_family_setup,
    is_dense_fp8_family_row,
    note,
    row_precision,
)
from pipette_cp.specs.instance import Instance
from pipette_cp.specs.plan import Plan
from pipette_cp.units import GiB

#: The GPU family of every torchtitan row, whose compute efficiency is fitted.
GPU_FAMILY = "H100"
#: Fixed-point iterations of the compute-efficiency rule (it settles in two or three).
ITERATIONS = 4
#: Grid of CP attention efficiencies, step 0.01.
CP_GRID = tuple(round(0.40 + 0.01 * i, 2) for i in range(61))
#: Memory targets: within this share of the measurement, never below it by more than
#: :data:`MEMORY_UNDER` (as :mod:`pipette_cp.experiments.models.fp8_accuracy`).
MEMORY_TARGET, MEMORY_UNDER = 0.10, 0.03


def reserved_peak_gib(instance: Instance, plan: Plan) -> float:
    """The predicted caching-allocator reserved peak of the most loaded GPU, GiB: what a
    torchtitan row's memory column measures (module docstring)."""
    stages = memory_by_stage(instance.model, instance.training, plan)
    return max(s.reserved_bytes for s in stages) / GiB


def compute_fit_rows(path: Path = MOE_CP_CSV) -> list[dict[str, str]]:
    """The fit side's torchtitan BF16 rows without context parallelism."""
    rows = read_rows(path)
    return [r for r, side in zip(rows, assign_split(rows), strict=True)
            if side == FIT and family(r) == "torchtitan" and is_dense_fp8_family_row(r)
            and row_precision(r) == "bf16"]  # fmt: skip


def throughput_ratio(row: dict[str, str], efficiency: float | None = None) -> float:
    """Predicted over measured tokens/s of a torchtitan row without context parallelism
    (``efficiency``: its compute efficiency on every GPU; None: the profile's)."""
    setup = fp8_family_setup(row, compute_efficiency=efficiency)
    inst, plan = setup.instance, setup.plan
    tokens = inst.training.global_batch_size * inst.training.seq_length
    tps = float((note(row["notes"], "tokens_per_s_per_gpu") or "nan").split()[0])
    return tokens / (tps * plan.num_gpus) / Evaluator(inst).iteration_time(plan)


def fit_compute_efficiency(path: Path = MOE_CP_CSV) -> tuple[float, int]:
    """``(efficiency, rows)``: torchtitan's H100 compute efficiency at which the median
    predicted / measured throughput of :func:`compute_fit_rows` is 1 (rounded to 0.001)."""
    rows = compute_fit_rows(path)
    x = fw.FRAMEWORKS["torchtitan"].compute_scale(GPU_FAMILY)
    for _ in range(ITERATIONS):
        x /= float(np.median([throughput_ratio(r, x) for r in rows]))
    return round(x, 3), len(rows)


@contextlib.contextmanager
def cp_attention_efficiency(value: float) -> Iterator[None]:
    """Inside: torchtitan's profile with ``cp_attention_efficiency = value``."""
    profile = replace(fw.FRAMEWORKS["torchtitan"], cp_attention_efficiency=value)
    fw.resolve_framework.cache_clear()
    try:
        with patch.dict(fw.FRAMEWORKS, {"torchtitan": profile}):
            yield
    finally:
        fw.resolve_framework.cache_clear()


def fit_cp_attention_efficiency(path: Path = MOE_CP_CSV) -> tuple[float, float, int]:
    """``(value, MAPE, rows)``: the :data:`CP_GRID` value minimising the step-time MAPE of
    the fit side's torchtitan rows with cp > 1."""
    setups = [moe_cp_setup(r) for _, r, side in selected_rows(path)
              if side == FIT and family(r) == "torchtitan" and row_cp(r) > 1]  # fmt: skip

    def step_mape(x: float) -> float:
        with cp_attention_efficiency(x):
            times = [Evaluator(s.instance).iteration_time(s.plan) for s in setups]
        return float(
            np.mean([abs(t / s.measured_step_s - 1) for t, s in zip(times, setups, strict=True)])
        )

    score, best = min((step_mape(x), x) for x in CP_GRID)
    return best, score, len(setups)


# ------------------------------------------------------------------------- report
def format_references(results: list[RowResult]) -> list[str]:
    """The cp = 1 rows of the torchtitan long-context sweeps (the FP8 experiment's setup),
    beside their cp > 1 rows: what context parallelism adds to the error."""
    lines = ["torchtitan long-context sweeps: step-time error at cp = 1 (the FP8 "
             "experiment's rows) and cp > 1"]  # fmt: skip
    rows = read_rows(MOE_CP_CSV)
    for i, row in enumerate(rows):
        kind = row["notes"].split(";")[0]
        if family(row) == "torchtitan" and "long-context" in kind and row_cp(row) == 1:
            error = 1.0 / throughput_ratio(row) - 1.0
            rest = [f"cp{r.cp} {100 * r.error:+.1f}% (attn {r.attention:.2f})" for r in results
                    if r.family == "torchtitan" and r.name == row["model_name"]]  # fmt: skip
            lines.append(f"  {row['model_name']}: cp1 (#{i}) {100 * error:+.1f}%; "
                         + ", ".join(rest))  # fmt: skip
    return lines


def format_memory(results: list[RowResult]) -> list[str]:
    """Predicted vs measured peak memory of the torchtitan rows with cp > 1, per side."""
    rows = [r for r in results if r.family == "torchtitan" and r.cp > 1
            and math.isfinite(r.measured_mem_gib)]  # fmt: skip
    lines = [f"torchtitan rows with cp > 1, peak memory (GiB; target within "
             f"{100 * MEMORY_TARGET:.0f} %, never more than {100 * MEMORY_UNDER:.0f} % below): "
             "side layout measured predicted error"]  # fmt: skip
    errors = {}
    for r in rows:
        errors[r.index] = error = r.predicted_mem_gib / r.measured_mem_gib - 1
        lines.append(f"  {r.index:2d} {r.side:8s} {r.name[:14]:14s} {r.layout:36s} "
                     f"{r.measured_mem_gib:6.1f} {r.predicted_mem_gib:6.1f} {100 * error:+6.1f}%")  # fmt: skip
    for side in (FIT, HELD_OUT, "both"):
        group = [errors[r.index] for r in rows if side in (r.side, "both")]
        if group:
            on = sum(-MEMORY_UNDER <= e <= MEMORY_TARGET for e in group)
            lines.append(f"  {side}: memory MAPE {100 * np.mean(np.abs(group)):.1f}% over "
                         f"{len(group)} rows, lowest error {100 * min(group):+.1f}%, "
                         f"{on} on target")  # fmt: skip
    return lines
