"""Pictures of a plan: the simulated pipeline timeline and the placement over the
bandwidth matrix.  Both return a matplotlib Figure built without pyplot (no global
state, no display); ``fig.savefig(path)`` writes it."""

from __future__ import annotations

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from pipette_cp.cost.schedule.simulator import Timeline
from pipette_cp.specs import Instance, Plan
from pipette_cp.units import GB

_COLORS = {
    "forward": "#4C72B0",
    "backward": "#DD8452",
    "send": "#55A868",
    "recv": "#8CCB9B",
    "dp_sync": "#C44E52",
    "embedding_sync": "#8172B3",
    "optimizer": "#937860",
    "param_gather": "#DA8BC3",
}
_COMPUTE = ("forward", "backward")


def timeline_figure(timeline: Timeline, title: str = "") -> Figure:
    """Gantt chart: one row per pipeline stage (GPUs of DP replica 0), compute as full
    bars labelled with the micro-batch, transfers and syncs as thin bars below them."""
    p = timeline.num_stages
    height = 1.6 + 0.5 * p
    fig = Figure(figsize=(12, height))
    ax = fig.subplots()
    for op in timeline.ops:
        row = p - 1 - op.stage
        compute = op.kind in _COMPUTE
        y, h = (row + 0.3, 0.6) if compute else (row + 0.05, 0.2)
        ax.broken_barh([(op.start_s, op.end_s - op.start_s)], (y, h), color=_COLORS.get(op.kind, "grey"),
                       edgecolor="white" if compute else None, linewidth=0.3)  # fmt: skip
        width = op.end_s - op.start_s
        if compute and op.micro_batch >= 0 and width > timeline.iteration_time_s / 120:
            ax.text(op.start_s + width / 2, row + 0.6, str(op.micro_batch), ha="center", va="center",
                    fontsize=6, color="white")  # fmt: skip
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
    ax.set_title(
        title or f"{timeline.schedule} schedule, iteration {timeline.iteration_time_s:.3f} s"
    )
    fig.tight_layout(rect=(0, 0.3 / height, 1, 1))
    return fig


def placement_figure(instance: Instance, plan: Plan) -> Figure:
    """Left: the node x node bandwidth matrix with the node pairs the plan's pipeline
    hops (circles) and DP rings (squares) use; slow and failed links stand out.
    Right: which stage (colour) and replica (number) each GPU slot holds."""
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
            left.scatter(
                j,
                i,
                marker=marker,
                facecolors="none",
                edgecolors="white",
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
    cmap = colormaps["tab20"].resampled(max(plan.pp, 2))
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


def _used_node_pairs(instance: Instance, plan: Plan) -> tuple[set, set]:
    """Inter-node pairs carrying pipeline hops and DP ring traffic (tp rank 0)."""
    node = instance.cluster.node_of
    hops, rings = set(), set()
    boundaries = [(s, s + 1) for s in range(plan.pp - 1)]
    if plan.vpp > 1 and plan.pp > 1:  # interleaving: the last stage feeds stage 0
        boundaries.append((plan.pp - 1, 0))
    for d in range(plan.replicas):
        for s, nxt in boundaries:
            a, b = node(plan.unit_gpus(s, d)[0]), node(plan.unit_gpus(nxt, d)[0])
            if a != b:
                hops.add((a, b))
    for s in range(plan.pp):
        ring = [node(plan.unit_gpus(s, d)[0]) for d in range(plan.replicas)]
        for k, a in enumerate(ring):
            b = ring[(k + 1) % len(ring)]
            if a != b and plan.replicas > 1:
                rings.add((a, b))
    return hops, rings
