"""The framework efficiencies fitted on the fit side of the published runs.

``python -m pipette_cp.experiments.models.published_runs_report --fit`` prints them; the
catalogue :data:`pipette_cp.cost.stack.frameworks.FRAMEWORKS` holds them (a test pins the
two together).  Every run is evaluated at compute efficiency 1; the efficiency of a
framework on a GPU family is then ``1 / median(predicted / measured)`` over its
fit-side runs that ran: one parameter per framework (and GPU family where its runs
cover several), the median so that outliers do not move it.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from pipette_cp.experiments.models.calibration_split import HELD_OUT
from pipette_cp.experiments.models.published_runs import Baseline, run_baseline
from pipette_cp.experiments.models.published_runs_setup import FAMILY_FRAMEWORK

#: Frameworks whose attention efficiency is fitted too (their attention is their own:
#: llm-foundry runs MPT's ALiBi attention, whose speed falls short of the cited kernels
#: the longer the sequence).
ATTENTION_FITTED = ("llm-foundry",)
#: Grid of attention efficiencies tried for them.
ATTENTION_GRID = tuple(round(0.25 + 0.05 * i, 2) for i in range(16))


def gpu_family_of(gpu_type: str) -> str:
    """The calibration family of a row's ``gpu_type`` (A100 or H100)."""
    return "H100" if gpu_type.upper().startswith("H100") else "A100"


def fit_compute_efficiency(baseline: Baseline) -> dict[tuple[str, str], float]:
    """Per framework and GPU family, ``1 / median(predicted / measured)`` over the fit
    side's runs that ran (a baseline evaluated at compute efficiency 1)."""
    ratios: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in baseline.results:
        if r.side != HELD_OUT and not r.oom and r.measured > 0 and math.isfinite(r.measured):
            key = (FAMILY_FRAMEWORK[r.family], gpu_family_of(r.gpu_type))
            ratios[key].append(r.predicted / r.measured)
    return {key: float(1.0 / np.median(v)) for key, v in sorted(ratios.items())}


def fit_frameworks() -> dict[tuple[str, str], tuple[float, float]]:
    """``(compute, attention)`` efficiency per framework and GPU family, fitted on the fit
    side: the compute efficiency by :func:`fit_compute_efficiency`; for
    :data:`ATTENTION_FITTED` the attention efficiency of :data:`ATTENTION_GRID` whose
    fit-side MAPE (each GPU family at its own compute efficiency) is smallest."""
    fitted = {key: (c, 1.0) for key, c in fit_compute_efficiency(run_baseline(compute_efficiency=1.0)).items()}  # fmt: skip
    families = tuple(f for f, n in FAMILY_FRAMEWORK.items() if n in ATTENTION_FITTED)
    best: dict[str, float] = {}
    for a in ATTENTION_GRID:
        base = run_baseline(compute_efficiency=1.0, attention_efficiency=a, families=families)
        scale = fit_compute_efficiency(base)
        errors: dict[str, list[float]] = defaultdict(list)
        for r in base.results:
            if r.side != HELD_OUT and not r.oom and r.measured > 0:
                key = (FAMILY_FRAMEWORK[r.family], gpu_family_of(r.gpu_type))
                errors[key[0]].append(abs(r.predicted * scale[key] / r.measured - 1.0))
        for name, e in errors.items():
            if float(np.mean(e)) < best.get(name, math.inf):
                best[name] = float(np.mean(e))
                fitted.update({k: (c, a) for k, c in scale.items() if k[0] == name})
    return fitted


#: Largest share of a framework's fit-side runs that ran which the margin may call out of
#: memory (the accuracy target for runs predicted not to fit).
MAX_FALSE_OOM = 0.05
#: Margins tried (fractions of the per-micro-batch memory), smallest first.
MARGIN_GRID = tuple(round(0.01 * i, 2) for i in range(101))


def fit_memory_margins(baseline: Baseline) -> dict[str, float]:
    """Per framework, the memory margin of :data:`MARGIN_GRID` with the fewest fit-side
    runs that ran out of memory predicted to fit, among the margins that call at most
    :data:`MAX_FALSE_OOM` of its fit-side runs that ran out of memory; ties to the
    smallest margin, 0 for a framework without out-of-memory runs.

    A row is predicted to fit at margin ``u`` iff ``u <= memory_slack`` (the margin is
    ``u`` times the per-micro-batch memory, added to the predicted peak)."""
    rows: dict[str, list[tuple[float, bool]]] = defaultdict(list)
    for r in baseline.results:
        if r.side != HELD_OUT:
            rows[FAMILY_FRAMEWORK[r.family]].append((r.memory_slack, r.oom))
    margins = {}
    for name, found in sorted(rows.items()):
        ran = sum(not oom for _, oom in found)
        best = (math.inf, 0.0)
        for u in MARGIN_GRID:
            false_oom = sum(1 for slack, oom in found if not oom and slack < u)
            if false_oom > MAX_FALSE_OOM * ran:
                break  # larger margins call even more runs out of memory
            false_fit = sum(1 for slack, oom in found if oom and slack >= u)
            if false_fit < best[0]:
                best = (false_fit, u)
        margins[name] = best[1]
    return margins
