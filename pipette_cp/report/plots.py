"""Pictures of a plan: the simulated pipeline timeline and the placement over the
bandwidth matrix.  Both return a matplotlib Figure built without pyplot (no global
state, no display); ``fig.savefig(path)`` writes it.

Small plans are drawn op by op and node by node; past :data:`MAX_DETAILED_STAGES`
stages or :data:`MAX_DETAILED_OPS` compute ops on a stage, and past
:data:`MAX_DETAILED_NODES` nodes (or on a hierarchical fabric), the aggregated views of
:mod:`pipette_cp.report.plot_shares` and :mod:`pipette_cp.report.plot_blocks` take over, so that a plan of 16,384 GPUs stays a
legible picture of bounded size, drawn in seconds."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from pipette_cp.cost.schedule.simulator import Timeline
from pipette_cp.report.plot_blocks import block_placement_figure, stage_colormap, used_links
from pipette_cp.report.plot_shares import COLORS as _COLORS
from pipette_cp.report.plot_shares import COMPUTE as _COMPUTE
from pipette_cp.report.plot_shares import share_timeline_figure
from pipette_cp.specs import Instance, Plan
from pipette_cp.units import GB

MAX_DETAILED_STAGES = 32
MAX_DETAILED_OPS = 96  # forward and backward ops of one stage
MAX_DETAILED_NODES = 64


def timeline_is_detailed(timeline: Timeline) -> bool:
    """Whether :func:`timeline_figure` draws ``timeline`` op by op."""
    per_stage = np.bincount([o.stage for o in timeline.ops if o.kind in _COMPUTE],
                            minlength=1)  # fmt: skip
    return timeline.num_stages <= MAX_DETAILED_STAGES and per_stage.max() <= MAX_DETAILED_OPS


def placement_is_detailed(instance: Instance) -> bool:
    """Whether :func:`placement_figure` draws ``instance``'s cluster node by node."""
    cluster = instance.cluster
    return cluster.num_nodes <= MAX_DETAILED_NODES and not cluster.is_hierarchical


def timeline_figure(timeline: Timeline, title: str = "") -> Figure:
    """Gantt chart: one row per pipeline stage (GPUs of DP replica 0), compute as full
    bars labelled with the micro-batch, transfers and syncs as thin bars below them.
    A big timeline (see :func:`timeline_is_detailed`): each stage's shares of forward,
    backward, exposed transfers and idle time over the iteration instead
    (:func:`~pipette_cp.report.plot_shares.share_timeline_figure`)."""
    iteration = f"{timeline.schedule} schedule, iteration {timeline.iteration_time_s:.3f} s"
    if not timeline_is_detailed(timeline):
        return share_timeline_figure(timeline, title or f"{timeline.num_stages} stages")
    p = timeline.num_stages
    height = 1.6 + 0.5 * p
    fig = Figure(figsize=(12, height))
    ax = fig.subplots()
    bars: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for op in timeline.ops:  # one collection per stage and kind, one box per op in it
        bars.setdefault((op.stage, op.kind), []).append((op.start_s, op.end_s - op.start_s))
        width = op.end_s - op.start_s
        if op.kind in _COMPUTE and op.micro_batch >= 0 and width > timeline.iteration_time_s / 120:
            ax.text(op.start_s + width / 2, p - 1 - op.stage + 0.6, str(op.micro_batch),
                    ha="center", va="center", fontsize=6, color="white")  # fmt: skip
    for (stage, kind), spans in sorted(bars.items(), key=lambda item: item[0][0]):
        row = p - 1 - stage
        compute = kind in _COMPUTE
        y, h = (row + 0.3, 0.6) if compute else (row + 0.05, 0.2)
        ax.broken_barh(spans, (y, h), color=_COLORS.get(kind, "grey"),
                       edgecolor="white" if compute else None, linewidth=0.3)  # fmt: skip
    labels = []
    for s in range(p):
        gpus = timeline.stage_gpus[s] if s < len(timeline.stage_gpus) else ()
        labels.append(
            f"stage {s}"
            + (
                f"\nGPU {gpus[0]}-{gpus[-1]}"
                if len(gpus) > 1
                else f"\nGPU {gpus[0]}"
                if gpus
                else ""
            )
        )
    ax.set_yticks(np.arange(p) + 0.5, labels[::-1], fontsize=7)
    ax.set_ylim(0, p)
    ax.set_xlim(0, timeline.iteration_time_s * 1.01)
    ax.set_xlabel("time (s)")
    kinds = sorted({op.kind for op in timeline.ops}, key=list(_COLORS).index)
    handles = [Patch(color=_COLORS[k], label=k.replace("_", " ")) for k in kinds]
    fig.legend(handles=handles, loc="lower center", ncol=len(kinds), fontsize=7, frameon=False)
    ax.set_title(f"{title}: {iteration}" if title else iteration)
    fig.tight_layout(rect=(0, 0.3 / height, 1, 1))
    return fig


def placement_figure(instance: Instance, plan: Plan) -> Figure:
    """Left: the node x node bandwidth matrix with the node pairs the plan's pipeline
    hops (circles) and DP rings (squares) use; slow and failed links stand out.
    Right: which stage (colour) and replica (number) each GPU slot holds.
    A big cluster (see :func:`placement_is_detailed`): the same over blocks of nodes
    (:func:`~pipette_cp.report.plot_blocks.block_placement_figure`)."""
    if not placement_is_detailed(instance):
        return block_placement_figure(instance, plan)
    cluster = instance.cluster
    nodes = cluster.node_matrix()
    n, g = cluster.num_nodes, cluster.gpus_per_node
    fig = Figure(figsize=(13, 5.8))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.15, 1]})
    shown = nodes / GB
    off = ~np.eye(n, dtype=bool)
    masked = np.ma.masked_where(~off, shown)
    image = left.imshow(
        masked, cmap="viridis", vmin=0, vmax=float(shown[off].max()) if n > 1 else None
    )
    failed = off & (nodes <= 0)
    for i, j in zip(*np.nonzero(failed), strict=True):
        left.text(j, i, "x", ha="center", va="center", color="red", fontsize=9, fontweight="bold")
    hops, rings = _used_node_pairs(instance, plan)
    for pairs, marker, label in ((hops, "o", "pipeline hop"), (rings, "s", "DP ring")):
        if pairs:
            i, j = zip(*sorted(pairs), strict=True)
            colors = ["red" if pairs[p] else "white" for p in sorted(pairs)]
            left.scatter(
                j,
                i,
                marker=marker,
                facecolors="none",
                edgecolors=colors,
                s=42,
                linewidths=1.2,
                label=label,
            )
    fig.colorbar(image, ax=left, label="GB/s (mean over GPU pairs)", shrink=0.85)
    ticks = np.arange(n) if n <= 24 else np.arange(0, n, max(1, n // 16))
    left.set_xticks(ticks, [cluster.node_names[k] for k in ticks], rotation=90, fontsize=6)
    left.set_yticks(ticks, [cluster.node_names[k] for k in ticks], fontsize=6)
    left.set_xlabel("to node")
    left.set_ylabel("from node")
    left.set_title("Bandwidth and the links the plan uses (x = failed)")
    if hops or rings:
        left.legend(
            loc="upper right", fontsize=7, facecolor="black", labelcolor="white", framealpha=0.6
        )
    grid = np.full((n, g), np.nan)
    text: dict[tuple[int, int], str] = {}
    for stage in range(plan.pp):
        for replica in range(plan.replicas):
            for gpu in plan.unit_gpus(stage, replica):
                grid[gpu // g, gpu % g] = stage
                text[(gpu // g, gpu % g)] = str(replica)
    cmap = stage_colormap(plan.pp)
    right.imshow(grid, cmap=cmap, vmin=-0.5, vmax=max(plan.pp, 2) - 0.5, aspect="auto")
    if n * g <= 512:
        for (r, c), label in text.items():
            right.text(c, r, label, ha="center", va="center", fontsize=6, color="black")
    right.set_yticks(ticks, [cluster.node_names[k] for k in ticks], fontsize=6)
    right.set_xticks(np.arange(g), [str(k) for k in range(g)], fontsize=7)
    right.set_xlabel("local GPU")
    right.set_title(f"{plan.layout()}: stage (colour), DP replica (number)")
    handles = [Patch(color=cmap(s), label=f"stage {s}") for s in range(min(plan.pp, 20))]
    right.legend(
        handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=6, frameon=False
    )
    fig.tight_layout()
    return fig


def _used_node_pairs(
    instance: Instance, plan: Plan
) -> tuple[dict[tuple[int, int], bool], dict[tuple[int, int], bool]]:
    """Inter-node pairs carrying pipeline hops and DP ring traffic (NCCL's rings, every
    tp rank), each with whether one of its used GPU links has failed."""
    links = used_links(instance, plan)
    g = instance.cluster.gpus_per_node
    out: tuple[dict[tuple[int, int], bool], dict[tuple[int, int], bool]] = ({}, {})
    for a, b, bw, ring in zip((links.src // g).tolist(), (links.dst // g).tolist(),
                              links.bandwidth.tolist(), links.ring.tolist(), strict=True):  # fmt: skip
        pairs = out[int(ring)]
        pairs[(a, b)] = pairs.get((a, b), False) or bw <= 0
    return out
