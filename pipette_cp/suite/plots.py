"""Comparison plots of a benchmark store, built without pyplot (no global state, no
display): speed-ups per instance, solve time against cluster size, and the exact
solvers' gap against the time limit (when several limits are stored)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import ScalarFormatter

from pipette_cp.suite.jobs import BenchRow
from pipette_cp.suite.report import BASELINES, SOLVERS, BenchReport, latest_rows

#: Why a plot is not written.
_NO_DATA = {
    "speedup.png": "no instance to report",
    "solve_time_vs_gpus.png": "no rows",
    "gap_vs_time_limit.png": "needs cpsat/milp rows with a gap at several time limits",
}
_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3")


def speedup_figure(report: BenchReport) -> Figure:
    """Grouped bars: speed-up of the best solver plan over each baseline, per instance
    (baselines without any value are left out; a missing bar is marked n/a)."""
    lines = report.lines
    bases = [b for b in BASELINES if any(line.speedups.get(b) for line in lines)]
    fig = Figure(figsize=(max(6.0, 0.55 * len(lines) + 2), 4.6), layout="constrained")
    ax = fig.subplots()
    x = np.arange(len(lines))
    width = 0.8 / max(1, len(bases))
    for i, base in enumerate(bases):
        values = [line.speedups.get(base) for line in lines]
        heights = [v if v is not None else 0.0 for v in values]
        bars = ax.bar(x + (i - (len(bases) - 1) / 2) * width, heights, width,
                      label=f"vs {base}", color=_COLORS[i])  # fmt: skip
        for bar, value in zip(bars, values, strict=True):
            centre = bar.get_x() + bar.get_width() / 2
            if value is None:
                ax.text(centre, 0.02, "n/a", ha="center", va="bottom", fontsize=7,
                        transform=ax.get_xaxis_transform())  # fmt: skip
            else:
                ax.annotate(f"{value:.3f}", (centre, value), xytext=(0, 2),
                            textcoords="offset points", ha="center", fontsize=6)  # fmt: skip
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(x, [line.instance for line in lines], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("speed-up of the best cpsat/milp plan (x)")
    ax.set_title("Speed-up per instance (predicted iteration time)")
    shown = [v for line in lines for v in line.speedups.values() if v is not None]
    if shown:
        low, high = min([*shown, 1.0]), max([*shown, 1.0])
        pad = max(0.02, 0.1 * (high - low))
        ax.set_ylim(max(0.0, low - pad), high + pad)
    if bases:
        ax.legend(fontsize=8)
    return fig


def solve_time_figure(rows: list[BenchRow]) -> Figure:
    """Search wall time against the number of GPUs (log x), one series per method."""
    fig = Figure(figsize=(6.4, 4.4), layout="constrained")
    ax = fig.subplots()
    by_method: dict[str, list[BenchRow]] = defaultdict(list)
    for row in rows:
        by_method[row.method].append(row)
    for i, (method, mine) in enumerate(sorted(by_method.items())):
        color = _COLORS[i % len(_COLORS)]
        ax.scatter([r.num_gpus for r in mine], [r.wall_time_s for r in mine], s=18,
                   color=color, alpha=0.7, label=method)  # fmt: skip
        per_size: dict[int, list[float]] = defaultdict(list)
        for r in mine:
            per_size[r.num_gpus].append(r.wall_time_s)
        sizes = sorted(per_size)
        if len(sizes) > 1:
            ax.plot(sizes, [float(np.median(per_size[s])) for s in sizes], color=color, lw=1)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.set_yscale("log")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("search wall time, s (log)")
    ax.set_title("Solve time vs cluster size (points: jobs, lines: median)")
    ax.legend(fontsize=8)
    return fig


def gap_figure(rows: list[BenchRow]) -> Figure | None:
    """The exact solvers' reported gap against the time limit (log x), one line per
    (instance, solver); None unless some series has several time limits."""
    series: dict[tuple[str, str], dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if row.method in SOLVERS and row.gap is not None:
            series[(row.instance, row.method)][row.time_limit_s].append(row.gap)
    series = {k: v for k, v in series.items() if len(v) > 1}
    if not series:
        return None
    fig = Figure(figsize=(6.4, 4.4), layout="constrained")
    ax = fig.subplots()
    for i, ((instance, method), points) in enumerate(sorted(series.items())):
        limits = sorted(points)
        gaps = [100 * float(np.mean(points[t])) for t in limits]
        ax.plot(limits, gaps, marker="o", color=_COLORS[i % len(_COLORS)],
                linestyle="-" if method == SOLVERS[0] else "--", label=f"{instance} ({method})")  # fmt: skip
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.set_xlabel("time limit, s")
    ax.set_ylabel("gap, %")
    ax.set_title("Gap of the best plan vs time limit")
    ax.legend(fontsize=7)
    return fig


def write_plots(
    report: BenchReport, rows: list[BenchRow], directory: str | Path
) -> tuple[list[Path], list[str]]:
    """Write the plots as PNG files into ``directory``; returns the paths written and
    one line per plot there was no data for."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    latest = latest_rows(rows)
    figures: dict[str, Figure | None] = {
        "speedup.png": speedup_figure(report) if report.lines else None,
        "solve_time_vs_gpus.png": solve_time_figure(latest) if latest else None,
        "gap_vs_time_limit.png": gap_figure(latest),
    }
    written, skipped = [], []
    for name, fig in figures.items():
        if fig is None:
            skipped.append(f"{name} not written: {_NO_DATA[name]}")
            continue
        fig.savefig(out / name, dpi=120)
        written.append(out / name)
    return written, skipped
