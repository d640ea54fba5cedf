"""Big pipeline timelines, aggregated so that they stay legible (and small, and quick):
:func:`share_timeline_figure` draws each pipeline stage as one row of forward / backward /
exposed-transfer / idle shares over time.  :mod:`pipette_cp.report.plots` picks it for
plans above its size limits and draws small plans op by op."""

from __future__ import annotations

import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from pipette_cp.cost.schedule.simulator import Timeline

COLORS = {
    "forward": "#4C72B0",
    "backward": "#DD8452",
    "send": "#55A868",
    "recv": "#8CCB9B",
    "dp_sync": "#C44E52",
    "embedding_sync": "#8172B3",
    "optimizer": "#937860",
    "param_gather": "#DA8BC3",
}
COMPUTE = ("forward", "backward")
IDLE = "#E4E4E4"
MAX_ROWS = 48  # timeline rows (stages, or groups of stages beyond)
MAX_TICKS = 16


# ------------------------------------------------------------------------- timeline
def share_timeline_figure(timeline: Timeline, title: str) -> Figure:
    """Left: per stage (or group of stages), the share of each time bin spent in forward
    and backward compute, in transfers and syncs while not computing (exposed), and idle.
    Right: the same shares over the whole iteration.  A few artists per kind, whatever
    the number of ops."""
    p, total = timeline.num_stages, max(timeline.iteration_time_s, 1e-12)
    per_row = -(-p // MAX_ROWS)
    rows = -(-p // per_row)
    compute = [o.end_s - o.start_s for o in timeline.ops if o.kind in COMPUTE]
    typical = float(np.median(compute)) if compute else total / 100
    bins = int(np.clip(round(total / (3 * typical)), 40, 240))
    edges = np.linspace(0.0, total, bins + 1)
    kinds = [k for k in COLORS if any(o.kind == k for o in timeline.ops)]
    shares = _shares(timeline, kinds, edges, per_row, rows)  # rows x kinds x bins
    overall = _shares(timeline, kinds, np.array([0.0, total]), per_row, rows)[:, :, 0]
    height = float(np.clip(1.9 + 0.34 * rows, 3.2, 12.0))
    fig = Figure(figsize=(13, height))
    main, side = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [5.2, 1]})
    band = 0.82
    base, left = np.zeros((rows, bins)), np.zeros(rows)
    for k, kind in enumerate([*kinds, "idle"]):
        color = COLORS.get(kind, IDLE)
        top = base + shares[:, k] if k < len(kinds) else np.ones_like(base)
        _add_steps(main, edges, base, top, band, color)  # stacked up within each row
        right = left + overall[:, k] if k < len(kinds) else np.ones_like(left)
        _add_bars(side, 100 * left, 100 * right, band, color)  # stacked left to right
        base, left = top, right
    labels = [_stage_label(r, per_row, p) for r in range(rows)]
    step = max(1, -(-rows // 24))
    ticks = np.arange(0, rows, step)
    main.set_yticks(rows - 1 - ticks + 0.5, [labels[r] for r in ticks], fontsize=7)
    main.set_ylim(0, rows)
    main.set_xlim(0, total * 1.01)
    main.set_xlabel("time (s)")
    width_ms = 1e3 * total / bins
    main.set_title(f"share of each {width_ms:.3g} ms bin (one row per "
                   f"{'stage' if per_row == 1 else f'{per_row} stages'})", fontsize=9)  # fmt: skip
    busy = overall[:, : sum(k in COMPUTE for k in kinds)].sum(axis=1)
    side.set_xlim(0, 100)
    side.set_xlabel("% of iteration")
    side.set_title("whole iteration (% computing)", fontsize=9)
    side.tick_params(axis="y", left=False)
    if rows <= 24:
        for r in range(rows):
            side.text(101, rows - 1 - r + 0.5, f"{100 * busy[r]:.0f}%", va="center", fontsize=6)
    handles = [Patch(color=COLORS[k], label=k.replace("_", " ")) for k in kinds]
    handles.append(Patch(facecolor=IDLE, edgecolor="grey", linewidth=0.5, label="idle"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=7, frameon=False)
    ops = sum(o.kind in COMPUTE for o in timeline.ops)
    fig.suptitle(f"{title}\n{_iteration_text(timeline)}; {ops:,} compute ops of "
                 f"{p} stages in {bins} bins (transfers shown where not overlapped)",
                 fontsize=10)  # fmt: skip
    fig.tight_layout(rect=(0, 0.35 / height, 0.985, 1))
    return fig


def _iteration_text(timeline: Timeline) -> str:
    return (f"{timeline.schedule} schedule, iteration {timeline.iteration_time_s:.3f} s "
            f"(pipeline {timeline.pipeline_time_s:.3f} s)")  # fmt: skip


def _stage_label(row: int, per_row: int, p: int) -> str:
    first, last = row * per_row, min(p, (row + 1) * per_row) - 1
    return f"stage {first}" if first == last else f"stages {first}-{last}"


def _shares(
    timeline: Timeline, kinds: list[str], edges: np.ndarray, per_row: int, rows: int
) -> np.ndarray:
    """rows x kinds x bins: the share of each bin that a row's stages spend in each kind;
    compute as covered, the other kinds only in the time left by compute (exposed)."""
    widths = np.diff(edges)
    cover = np.zeros((timeline.num_stages, len(kinds), len(widths)))
    index = {k: i for i, k in enumerate(kinds)}
    grouped: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for op in timeline.ops:
        if op.kind in index:
            grouped.setdefault((op.stage, index[op.kind]), []).append((op.start_s, op.end_s))
    for (stage, k), spans in grouped.items():
        cover[stage, k] = _covered(np.asarray(spans), edges)
    share = np.clip(cover / widths, 0.0, 1.0)
    n_compute = sum(k in COMPUTE for k in kinds)
    busy = share[:, :n_compute].sum(axis=1, keepdims=True)
    scale = np.clip(share[:, :n_compute], 0, 1)
    share[:, :n_compute] = scale / np.maximum(busy, 1.0)
    room = np.clip(1.0 - busy, 0.0, 1.0)
    others = share[:, n_compute:]
    need = others.sum(axis=1, keepdims=True)
    share[:, n_compute:] = others * np.minimum(1.0, room / np.maximum(need, 1e-12))
    pad = rows * per_row - timeline.num_stages
    if pad:
        share = np.concatenate([share, np.full((pad, *share.shape[1:]), np.nan)])
    return np.nanmean(share.reshape(rows, per_row, *share.shape[1:]), axis=1)


def _covered(spans: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Time each bin of ``edges`` lies under the intervals ``spans`` (n x 2), overlaps
    counted once per interval: O((n + bins) log n), no n x bins table."""

    def ramp_sum(points: np.ndarray) -> np.ndarray:  # sum_i max(0, edge - point_i)
        points = np.sort(points)
        before = np.searchsorted(points, edges, side="right")
        prefix = np.concatenate([[0.0], np.cumsum(points)])
        return before * edges - prefix[before]

    return np.diff(ramp_sum(spans[:, 0]) - ramp_sum(spans[:, 1]))


def _add_steps(ax: Axes, x: np.ndarray, low: np.ndarray, high: np.ndarray, band: float,
               color: str) -> None:  # fmt: skip
    """One PolyCollection: per row r, the step band between ``low[r]`` and ``high[r]``
    (shares of the row's height ``band``), row 0 on top."""
    rows = low.shape[0]
    xs = np.repeat(x, 2)[1:-1]
    polygons = []
    for r in range(rows):
        if not np.any(high[r] - low[r] > 1e-9):
            continue
        y0 = rows - 1 - r + (1 - band) / 2
        top = y0 + band * np.repeat(high[r], 2)
        bottom = y0 + band * np.repeat(low[r], 2)
        polygons.append(np.column_stack([np.concatenate([xs, xs[::-1]]),
                                         np.concatenate([top, bottom[::-1]])]))  # fmt: skip
    if polygons:
        ax.add_collection(PolyCollection(polygons, facecolors=color, edgecolors="none"))


def _add_bars(ax: Axes, left: np.ndarray, right: np.ndarray, band: float, color: str) -> None:
    """One PolyCollection: per row r, the bar from ``left[r]`` to ``right[r]``, row 0 on
    top."""
    rows = len(left)
    y0 = rows - 1 - np.arange(rows) + (1 - band) / 2
    keep = right - left > 1e-9
    polygons = [np.array([(a, y), (b, y), (b, y + band), (a, y + band)])
                for a, b, y in zip(left[keep], right[keep], y0[keep], strict=True)]  # fmt: skip
    if polygons:
        ax.add_collection(PolyCollection(polygons, facecolors=color, edgecolors="none"))


# ------------------------------------------------------------------------ placement
