"""The printed report, ``--csv`` and ``--plot`` of
``python -m pipette_cp.experiments.models.modern_runs`` (measurement only)."""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from pipette_cp.experiments.models.calibration_split import FIT, HELD_OUT
from pipette_cp.experiments.models.modern_runs import metrics as m
from pipette_cp.experiments.models.modern_runs.evaluate import ModernResult, ModernSkipped, run
from pipette_cp.experiments.models.modern_runs.fit import fit_blackwell, format_fit
from pipette_cp.experiments.models.published_runs_report import finish_parity_plot

SIDES = (FIT, HELD_OUT)
_HEAD = f"{'side':9s} {'rows':>4s} {'pred':>4s} {'MAPE':>7s} {'worst':>7s} {'med p/m':>7s}"


def _pct(x: float) -> str:
    return f"{100 * x:6.1f}%" if math.isfinite(x) else f"{'-':>7s}"


def _num(x: float, width: int = 7) -> str:
    return f"{x:{width}.3f}" if math.isfinite(x) else f"{'-':>{width}s}"


def format_groupings(results: Sequence[ModernResult], skipped: Sequence[ModernSkipped]) -> str:
    """Throughput MAPE and median predicted / measured tokens/s/GPU per grouping and side
    (rows: all rows of the cell, pred: those predicted)."""
    parts = []
    for title, label in {"all": lambda i: "all", **m.GROUPINGS}.items():
        lines = [f"{title:16s} {_HEAD}"]
        for (value, side), c in m.cells(results, skipped, label).items():
            lines.append(f"{value:16s} {side:9s} {c.rows:4d} {c.predicted:4d} {_pct(c.mape)} "
                         f"{_pct(c.worst)} {_num(c.median_ratio)}")  # fmt: skip
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def format_coverage(results: Sequence[ModernResult], skipped: Sequence[ModernSkipped]) -> str:
    """Rows representable per side, skip reasons counted, and what one change would add."""
    lines = []
    for side in SIDES:
        n_res = sum(r.info.side == side for r in results)
        n_all = n_res + sum(s.info.side == side for s in skipped)
        lines.append(f"{side:9s} {n_res:3d} of {n_all:3d} rows representable "
                     f"({100 * n_res / max(n_all, 1):.0f} %)")  # fmt: skip
    total = len(results) + len(skipped)
    lines.append(f"{'both':9s} {len(results):3d} of {total:3d} rows representable "
                 f"({100 * len(results) / max(total, 1):.0f} %); "
                 f"{sum(r.info.duplicate for r in results)} of them duplicate another row's "
                 "runs and are left out of the metrics")  # fmt: skip
    lines.append("skipped rows by first reason:")
    lines += [f"  {n:3d}  {reason}" for reason, n in m.reasons(skipped).most_common()]
    lines.append("skipped rows with a single reason (representable once it is lifted):")
    lines += [f"  {n:3d}  {reason}" for reason, n in m.sole_blockers(skipped).most_common()]
    approx: dict[str, int] = {}
    for r in m.counted(results):
        for a in r.approximations:
            approx[a] = approx.get(a, 0) + 1
    lines.append("predicted rows with stated settings the models do not cost:")
    lines += [f"  {n:3d}  {a}" for a, n in sorted(approx.items(), key=lambda kv: -kv[1])]
    return "\n".join(lines)


def format_memory(results: Sequence[ModernResult]) -> str:
    """Runs that ran predicted not to fit, per side and GPU family, and logged memory."""
    lines = [f"{'GPU family':12s} {'side':9s} {'rows':>4s} {'no fit':>6s} {'share':>6s} "
             f"{'med bound/usable':>16s} {'max':>6s}"]  # fmt: skip
    counted = m.counted(results)
    for fam in [*sorted({r.info.gpu_family for r in counted}), "all"]:
        for side in SIDES:
            group = [r for r in counted if r.info.side == side and fam in ("all", r.info.gpu_family)]  # fmt: skip
            f = m.memory_fit(group)
            if f.rows:
                lines.append(f"{fam:12s} {side:9s} {f.rows:4d} {f.not_fit:6d} "
                             f"{100 * f.not_fit / f.rows:5.0f}% {f.median_bound:16.3f} "
                             f"{f.max_bound:6.3f}")  # fmt: skip
    lines.append("logged max_memory_usage (unit unstated, read as GiB) vs predicted peak GiB:")
    for r in m.logged_memory(results):
        lines.append(f"  {r.info.row_id} {r.info.side:9s} {r.info.model:14s} {r.layout:34s} "
                     f"logged {r.measured_mem_gib:7.2f}  predicted {r.predicted_mem_gib:7.2f}  "
                     f"ratio {r.predicted_mem_gib / r.measured_mem_gib:.3f}")  # fmt: skip
    return "\n".join(lines)


def format_pairs(results: Sequence[ModernResult], skipped: Sequence[ModernSkipped]) -> str:
    """Matched precision pairs: predicted over measured speed-up, per pair and transition."""
    scored, unscored = m.pairs(results, skipped)
    lines = []
    for p in scored:
        lines.append(f"  {p.transition:30s} {p.base.info.row_id}/{p.to.info.row_id} "
                     f"{p.base.info.side:9s} {p.base.info.gpu_type:6s} {p.base.info.model:14s} "
                     f"measured {p.measured:.3f}  predicted {p.predicted:.3f}  "
                     f"ratio {p.ratio:.3f}")  # fmt: skip
    for transition in sorted({p.transition for p in scored}):
        for side in SIDES:
            ratios = [p.ratio for p in scored if p.transition == transition and p.base.info.side == side]  # fmt: skip
            if ratios:
                lines.append(f"  {transition:30s} {side:9s} {len(ratios):2d} pairs, median "
                             f"predicted / measured speed-up {np.median(ratios):.3f}")  # fmt: skip
    if not any(p.transition.startswith("bf16") for p in scored):
        lines.append("  bf16 -> fp8: no matched pair (no release runs one layout in both)")
    lines += [f"  {t:30s} {n:2d} pairs not scored (a row skipped)" for t, n in unscored.items()]
    return "\n".join(lines)


def format_groups(results: Sequence[ModernResult]) -> str:
    """Per (source, model, GPU, count) with several configurations: is the measured best
    the predicted best?"""
    groups = m.best_layout_groups(results)
    lines = []
    for g in groups:
        src, model, gpu, n = g.key
        mark = "yes" if g.agrees else "no "
        lines.append(f"  {mark} {g.side:9s} {src:6s} {model:14s} {gpu:6s} {n:5d} GPUs "
                     f"{g.configs} configs; measured best {g.measured_best}; predicted best "
                     f"{g.predicted_best}")  # fmt: skip
    for side in SIDES:
        part = [g for g in groups if g.side == side]
        lines.append(f"  {side}: the measured best is the predicted best in "
                     f"{sum(g.agrees for g in part)} of {len(part)} groups")  # fmt: skip
    return "\n".join(lines)


def format_rows(results: Sequence[ModernResult]) -> str:
    """Every predicted row."""
    lines = [f"{'row':5s} {'side':9s} {'GPU':5s} {'model':14s} {'precision':14s} "
             f"{'layout':40s} {'meas s':>8s} {'pred s':>8s} {'p/m':>6s} fits {'bound':>5s}"]  # fmt: skip
    for r in results:
        i = r.info
        lines.append(f"{i.row_id:5s} {i.side:9s} {i.gpu_type:5s} {i.model[:14]:14s} "
                     f"{i.precision:14s} {r.layout[:40]:40s} {r.measured_step_s:8.3f} "
                     f"{r.predicted_step_s:8.3f} {r.ratio:6.3f} {'yes' if r.fits else 'no ':4s} "
                     f"{r.bound_over_usable:5.2f}{' dup' if i.duplicate else ''}")  # fmt: skip
    return "\n".join(lines)


def format_report(results: Sequence[ModernResult], skipped: Sequence[ModernSkipped]) -> str:
    """The whole report as plain text."""
    return "\n\n".join([
        "== coverage\n" + format_coverage(results, skipped),
        "== throughput (tokens/s/GPU): MAPE, worst |p/m - 1|, median predicted / measured\n"
        + format_groupings(results, skipped),
        "== memory: runs that ran, predicted not to fit (bound = peak + calibrated margin)\n"
        + format_memory(results),
        "== matched precision pairs (same release, model, GPU count, layout)\n"
        + format_pairs(results, skipped),
        "== best configuration per (source, model, GPU type, GPU count)\n" + format_groups(results),
        "== every predicted row\n" + format_rows(results),
    ])  # fmt: skip


# ------------------------------------------------------------------ csv, plot
CSV_COLUMNS = (
    "row_id", "side", "source", "round", "model", "gpu_type", "gpu_family", "precision",
    "experts", "kind", "num_gpus", "duplicate", "layout", "measured_step_s",
    "predicted_step_s", "measured_tokens_per_gpu", "predicted_tokens_per_gpu", "fits",
    "bound_over_usable", "predicted_mem_gib", "measured_mem", "outcome",
)  # fmt: skip


def write_csv(
    results: Iterable[ModernResult], skipped: Iterable[ModernSkipped], path: Path
) -> None:
    """One line per row of the file: predicted values, or the skip reason as outcome."""
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(CSV_COLUMNS)
        for r in results:
            i = r.info
            writer.writerow([
                i.row_id, i.side, i.source, i.round, i.model, i.gpu_type, i.gpu_family,
                i.precision, i.expert, i.kind, i.num_gpus, "y" if i.duplicate else "n",
                r.layout, f"{r.measured_step_s:.6g}", f"{r.predicted_step_s:.6g}",
                f"{r.measured_tokens_per_gpu:.6g}", f"{r.predicted_tokens_per_gpu:.6g}",
                "y" if r.fits else "n", f"{r.bound_over_usable:.4f}",
                f"{r.predicted_mem_gib:.3f}", f"{r.measured_mem_gib:.3f}",
                "predicted" + ("; " + "; ".join(r.approximations) if r.approximations else ""),
            ])  # fmt: skip
        for s in skipped:
            i = s.info
            writer.writerow([
                i.row_id, i.side, i.source, i.round, i.model, i.gpu_type, i.gpu_family,
                i.precision, i.expert, i.kind, i.num_gpus, "y" if i.duplicate else "n",
                *[""] * 9, f"skipped: {s.reason}",
            ])  # fmt: skip


def write_plot(results: Iterable[ModernResult], path: Path) -> None:
    """Predicted vs measured tokens/s/GPU, log-log, one colour per GPU family, one marker
    per side, the y = x line (matplotlib's Agg canvas)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    shown = m.counted(results)
    fig = Figure(figsize=(7, 6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    markers = {FIT: "o", HELD_OUT: "^"}
    for k, fam in enumerate(sorted({r.info.gpu_family for r in shown})):
        for side in SIDES:
            group = [r for r in shown if r.info.gpu_family == fam and r.info.side == side]
            if group:
                ax.scatter([r.measured_tokens_per_gpu for r in group],
                           [r.predicted_tokens_per_gpu for r in group], color=f"C{k}",
                           marker=markers[side], s=24, alpha=0.75, label=f"{fam} ({side})")  # fmt: skip
    values = [v for r in shown for v in (r.measured_tokens_per_gpu, r.predicted_tokens_per_gpu)]
    finish_parity_plot(
        fig, ax, values, path, "measured tokens/s per GPU", "predicted tokens/s per GPU",
        "2024-2026 runs (modern_runs.csv): predicted vs measured",
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """``python -m pipette_cp.experiments.models.modern_runs [--csv FILE] [--plot FILE.png]``."""
    parser = argparse.ArgumentParser(prog="python -m pipette_cp.experiments.models.modern_runs")
    parser.add_argument("--csv", type=Path, help="one line per row (predicted or skipped)")
    parser.add_argument("--plot", type=Path, help="predicted vs measured scatter (PNG)")
    parser.add_argument("--fit", action="store_true",
                        help="re-fit the Blackwell compute calibration on the fit side first")  # fmt: skip
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    results, skipped = run()
    if args.fit:
        fitted = fit_blackwell(results)
        print(format_fit(fitted))
        print("(the report below uses the calibration table as committed)\n")
    print(format_report(results, skipped))
    if args.csv:
        write_csv(results, skipped, args.csv)
        print(f"\nwrote {args.csv}")
    if args.plot:
        write_plot(results, args.plot)
        print(f"wrote {args.plot}")
    return 0
