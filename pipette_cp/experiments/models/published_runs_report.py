"""The accuracy report of :mod:`pipette_cp.experiments.models.published_runs` (measurement only).

Printed by ``python -m pipette_cp.experiments.models.published_runs_report`` after the per-family
table, each part separately for the fit and the held-out side:

- Per-knob breakdowns (:data:`KNOBS`): attention kernel (the Hagemann ``kernel=``
  note; ``flash_attention=y/n`` as modelled elsewhere), sharding, tp, recompute, sequence
  length, GPU type and family: rows, runs that ran, throughput MAPE, median
  predicted/measured and the OOM confusion.
- The pick metric (:func:`pick_score`) of every sweep: the layout the model
  predicts fastest among the sweep's rows it predicts to fit, scored
  measured(pick) / measured(best run that ran), 0 when the pick ran out of
  memory.  Throughputs are compared per GPU (``RunResult.per_gpu``) so that a
  weak-scaling sweep (DGX Cloud) ranks its runs by tokens per second per GPU.
- Memory (:func:`memory_stats`) on rows with an nvidia-smi reading: predicted peak
  (the largest stage) / measured, read as GiB as in :mod:`.accuracy`, and how
  often the prediction is more than :data:`UNDER_TOLERANCE` below the reading.

:func:`write_plot` draws predicted vs measured throughput (log-log, one colour per
family, one marker per side, the y = x line) with matplotlib's Agg canvas;
:func:`write_csv` writes one row per evaluated run.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipette_cp.experiments.models.accuracy import CALIBRATION_CSV
from pipette_cp.experiments.models.calibration_split import FIT, HELD_OUT
from pipette_cp.experiments.models.published_runs import (
    Baseline,
    RunResult,
    format_baseline,
    run_baseline,
    summarise,
)
from pipette_cp.experiments.models.published_runs_fit import fit_frameworks, fit_memory_margins

SIDES = (FIT, HELD_OUT)


#: Knobs of the breakdown tables: title and the label of a row.
def _sharding(r: RunResult) -> str:
    parts = r.layout.split("-")
    return next((s for s in ("zero3", "zero2", "do") if s in parts), "none")


KNOBS: dict[str, Callable[[RunResult], str]] = {
    "attention kernel": lambda r: r.kernel,
    "sharding": _sharding,
    "tensor parallel": lambda r: r.layout.split("-")[2],
    "recompute": lambda r: r.recompute,
    "sequence length": lambda r: str(r.seq_len),
    "GPU type": lambda r: r.gpu_type,
    "family": lambda r: r.family,
}

#: A memory prediction below nvidia-smi by more than this share counts as under.
UNDER_TOLERANCE = 0.03

#: Columns of :func:`write_csv`.
CSV_COLUMNS = (
    "family", "sweep", "side", "layout", "kernel", "recompute", "seq_len", "gpu_type",
    "predicted", "measured", "predicted_fits", "predicted_mem_gib", "limit_gib",
    "measured_mem_gib", "outcome",
)  # fmt: skip


def _ran(r: RunResult) -> bool:
    return not r.oom and math.isfinite(r.measured)


# ------------------------------------------------------------------ breakdowns
def format_breakdown(results: Sequence[RunResult], title: str, key: Callable) -> str:
    """One knob's table: a line per (value, side) with its metrics."""
    cells: dict[tuple[str, str], list[RunResult]] = defaultdict(list)
    for r in results:
        cells[(key(r), r.side)].append(r)
    width = max([len(title), *(len(value) for value, _ in cells)])
    lines = [
        f"{title:{width}s} {'side':9s} {'rows':>5s} {'ran':>5s} {'MAPE':>7s} {'med p/m':>8s} "
        f"{'OOM':>5s} {'OOM->fit':>8s} {'ran->OOM':>8s}"
    ]
    for value, side in sorted(cells, key=lambda k: (_natural(k[0]), SIDES.index(k[1]))):
        s = summarise(cells[(value, side)], 0)
        lines.append(
            f"{value:{width}s} {side:9s} {s.used:5d} {s.ran:5d} {100 * s.mape:6.1f}% "
            f"{s.median_ratio:8.3f} {s.oom:5d} {s.oom_predicted_fit:8d} {s.ran_predicted_oom:8d}"
        )
    return "\n".join(lines)


def _natural(value: str) -> tuple:
    """Numbers in numeric order, before text."""
    return (0, float(value), "") if value.replace(".", "", 1).isdigit() else (1, 0.0, value)


# ------------------------------------------------------------------------ pick
@dataclass(frozen=True)
class Pick:
    """The model's pick in one sweep and its score (``nan``: no pick or nothing ran)."""

    family: str
    sweep: str
    side: str
    candidates: int
    predicted_fit: int
    pick: RunResult | None
    best: RunResult | None
    score: float


def pick_score(candidates: Sequence[RunResult]) -> tuple[float, RunResult | None, RunResult | None]:
    """measured(pick) / measured(best that ran), the pick and the best.

    The pick is the candidate with the highest predicted per-GPU throughput among
    those predicted to fit; the score is 0 when the pick ran out of memory and
    ``nan`` when no candidate is predicted to fit or none ran.
    """
    ran = [r for r in candidates if _ran(r)]
    best = max(ran, key=lambda r: r.measured * r.per_gpu, default=None)
    fitting = [r for r in candidates if r.predicted_fits and math.isfinite(r.predicted)]
    pick = max(fitting, key=lambda r: r.predicted * r.per_gpu, default=None)
    if pick is None or best is None:
        return math.nan, pick, best
    if pick.oom:
        return 0.0, pick, best
    if not math.isfinite(pick.measured):
        return math.nan, pick, best
    return (pick.measured * pick.per_gpu) / (best.measured * best.per_gpu), pick, best


def picks(results: Iterable[RunResult]) -> list[Pick]:
    """One :class:`Pick` per (sweep, side), in order of family, side and sweep."""
    groups: dict[tuple[str, str, str], list[RunResult]] = defaultdict(list)
    for r in results:
        groups[(r.family, r.side, r.sweep)].append(r)
    out = []
    for fam, side, sweep in sorted(groups, key=lambda k: (k[0], SIDES.index(k[1]), k[2])):
        group = groups[(fam, side, sweep)]
        score, pick, best = pick_score(group)
        fit = sum(r.predicted_fits for r in group)
        out.append(Pick(fam, sweep, side, len(group), fit, pick, best, score))
    return out


def _short_sweep(sweep: str) -> str:
    """The sweep key without the family and the Hagemann sheets' common words."""
    short = sweep.split("|", 1)[-1]
    for word in (
        "_all_runs",
        ".xlsx",
        "bfloat16_",
        "llama_",
        "_sequence_parallelism",
        "_seq_length",
    ):
        short = short.replace(word, "_sp" if word == "_sequence_parallelism" else "")
    return short.replace("flash_attention", "fa")


def format_picks(all_picks: Sequence[Pick]) -> str:
    """Per-sweep picks, then the minimum and median score per family and side."""
    lines = [
        f"{'family':9s} {'sweep':50s} {'side':9s} {'rows':>4s} {'fit':>4s} {'pick':32s} "
        f"{'outcome':7s} {'best':32s} {'score':>6s}"
    ]
    for p in all_picks:
        pick = p.pick.layout if p.pick else "-"
        outcome = "-" if p.pick is None else "OOM" if p.pick.oom else "ran"
        best = p.best.layout if p.best else "-"
        lines.append(
            f"{p.family:9s} {_short_sweep(p.sweep)[:50]:50s} {p.side:9s} {p.candidates:4d} "
            f"{p.predicted_fit:4d} {pick:32s} {outcome:7s} {best:32s} {p.score:6.3f}"
        )
    lines.append(
        f"\n{'family':10s} {'side':9s} {'sweeps':>6s} {'scored':>6s} {'min':>6s} {'median':>6s}"
    )
    cells: dict[tuple[str, str], list[float]] = defaultdict(list)
    for p in all_picks:
        cells[(p.family, p.side)].append(p.score)
    for (fam, side), scores in cells.items():
        finite = [s for s in scores if math.isfinite(s)]
        low = min(finite) if finite else math.nan
        mid = float(np.median(finite)) if finite else math.nan
        lines.append(f"{fam:10s} {side:9s} {len(scores):6d} {len(finite):6d} {low:6.3f} {mid:6.3f}")
    return "\n".join(lines)


# ---------------------------------------------------------------------- memory
@dataclass(frozen=True)
class MemoryStats:
    """Predicted / nvidia-smi memory ratios of one cell."""

    rows: int
    low: float
    median: float
    high: float
    under: int


def memory_stats(results: Iterable[RunResult]) -> MemoryStats:
    """Ratio min / median / max and the count more than 3 % under nvidia-smi."""
    ratios = np.array(
        [r.predicted_mem_gib / r.measured_mem_gib for r in results if r.measured_mem_gib > 0]
    )
    if not len(ratios):
        return MemoryStats(0, math.nan, math.nan, math.nan, 0)
    under = int(np.sum(ratios < 1 - UNDER_TOLERANCE))
    return MemoryStats(
        len(ratios), float(ratios.min()), float(np.median(ratios)), float(ratios.max()), under
    )


def format_memory(results: Sequence[RunResult]) -> str:
    """Memory ratio statistics per family and side, then over every row."""
    lines = [
        f"{'family':10s} {'side':9s} {'rows':>5s} {'min':>6s} {'median':>6s} {'max':>6s} "
        f"{'under>3%':>8s}"
    ]
    cells: dict[tuple[str, str], list[RunResult]] = defaultdict(list)
    for r in results:
        if r.measured_mem_gib > 0:
            cells[(r.family, r.side)].append(r)
    for (fam, side), group in [*sorted(cells.items()), (("all", ""), list(results))]:
        m = memory_stats(group)
        lines.append(
            f"{fam:10s} {side:9s} {m.rows:5d} {m.low:6.3f} {m.median:6.3f} {m.high:6.3f} "
            f"{m.under:8d}"
        )
    return "\n".join(lines)


def format_report(baseline: Baseline) -> str:
    """Breakdowns, picks and memory as plain text (printed by :func:`main`)."""
    results = baseline.results
    parts = [
        f"== by {title}\n{format_breakdown(results, title, key)}" for title, key in KNOBS.items()
    ]
    parts.append(
        "== pick per sweep: measured(pick) / measured(best that ran), per GPU; "
        f"0 = the pick ran out of memory\n{format_picks(picks(results))}"
    )
    parts.append(
        "== memory: predicted peak / nvidia-smi (GiB), rows with a reading\n"
        f"{format_memory(results)}"
    )
    return "\n\n".join(parts)


# --------------------------------------------------------------- plot and csv
def write_plot(results: Iterable[RunResult], path: Path) -> None:
    """Predicted vs measured throughput of the runs that ran, log-log, to ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ran = [r for r in results if _ran(r) and r.predicted > 0]
    fig = Figure(figsize=(7, 6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    families = sorted({r.family for r in ran})
    markers = {FIT: "o", HELD_OUT: "^"}
    for i, fam in enumerate(families):
        for side in SIDES:
            group = [r for r in ran if r.family == fam and r.side == side]
            if group:
                ax.scatter(
                    [r.measured for r in group], [r.predicted for r in group],
                    color=f"C{i}", marker=markers[side], s=22, alpha=0.75,
                    label=f"{fam} ({side})",
                )  # fmt: skip
    values = [v for r in ran for v in (r.measured, r.predicted)]
    finish_parity_plot(
        fig, ax, values, path, "measured throughput (1/step s, or TFLOP/s per GPU for BLOOM)",
        "predicted throughput (same unit)", "published runs: predicted vs measured",
    )  # fmt: skip


def finish_parity_plot(
    fig: Any, ax: Any, values: list[float], path: Path, xlabel: str, ylabel: str, title: str
) -> None:
    """Log-log axes around ``values`` with the line y = x, the labels and the legend, and
    the figure written to ``path`` (the predicted-vs-measured plots of the benchmarks)."""
    if values:
        lo, hi = min(values) / 1.3, max(values) * 1.3
        ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8, label="y = x")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_csv(results: Iterable[RunResult], path: Path) -> None:
    """One row per evaluated run (:data:`CSV_COLUMNS`); outcome is ``ran`` or ``OOM``."""
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(CSV_COLUMNS)
        for r in results:
            writer.writerow(
                [
                    r.family, r.sweep, r.side, r.layout, r.kernel, r.recompute, r.seq_len,
                    r.gpu_type, f"{r.predicted:.6g}", f"{r.measured:.6g}",
                    "y" if r.predicted_fits else "n", f"{r.predicted_mem_gib:.3f}",
                    f"{r.limit_gib:.3f}", f"{r.measured_mem_gib:.3f}",
                    "OOM" if r.oom else "ran",
                ]
            )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """``python -m pipette_cp.experiments.models.published_runs_report [--plot FILE.png] [--csv FILE]``."""
    parser = argparse.ArgumentParser(
        prog="python -m pipette_cp.experiments.models.published_runs_report"
    )
    parser.add_argument("--plot", type=Path, help="predicted vs measured scatter (PNG)")
    parser.add_argument("--csv", type=Path, help="one row per evaluated run")
    parser.add_argument(
        "--fit",
        action="store_true",
        help="fit each framework's compute efficiency and memory margin",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.fit:
        for (name, gpu), (compute, attention) in fit_frameworks().items():
            print(f"{name:20s} {gpu}  compute {compute:.3f}  attention {attention:.2f}")
        for name, margin in fit_memory_margins(run_baseline()).items():
            print(f"{name:20s} memory margin {margin:.2f} of the per-micro-batch memory")
        return 0
    baseline = run_baseline()
    print(format_baseline(baseline))
    print("\nThe compute calibration's own 27 rows (published_runs_calibration.csv, all fitted):")
    print(format_baseline(run_baseline(CALIBRATION_CSV, calibration=True)))
    print()
    print(format_report(baseline))
    if args.plot:
        write_plot(baseline.results, args.plot)
        print(f"\nwrote {args.plot}")
    if args.csv:
        write_csv(baseline.results, args.csv)
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
