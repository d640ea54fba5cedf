"""Big placements, aggregated so that they stay legible at thousands of GPUs:
:func:`block_placement_figure` draws the bandwidth between blocks of nodes with the
plan's stages, links and idle GPUs over it.  :mod:`pipette_cp.report.plots` picks it for
clusters above its size limit and draws small ones node by node."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.colors import Colormap, to_rgba
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from mpl_toolkits.axes_grid1 import make_axes_locatable

from pipette_cp.cost.network.nccl_rings import nccl_rings
from pipette_cp.report.plot_shares import IDLE, MAX_TICKS
from pipette_cp.specs import ClusterSpec, Instance, Plan
from pipette_cp.units import GB

MAX_BLOCKS = 64  # placement: at most this many node blocks per axis
SLOW = 0.6  # a used link below this share of the median node-pair bandwidth is slow
FAILED_SHARE = 0.05  # x on a block with at least this share of failed node pairs
CROWDED = 150  # blocks with used links past which the fine ones are drawn small


@dataclass(frozen=True)
class Blocks:
    """The node x node bandwidth reduced to ``count`` x ``count`` blocks of ``size``
    consecutive nodes: mean bandwidth over each block's node pairs (bytes/s; a node pair
    is the mean of its healthy GPU pairs, pairs within one node left out, all-failed
    pairs too), how many node pairs it has and how many of them have a failed GPU pair,
    and the median node pair."""

    size: int
    count: int
    mean: np.ndarray
    pairs: np.ndarray
    failed: np.ndarray
    median: float


def node_blocks(cluster: ClusterSpec, size: int) -> Blocks:
    """:class:`Blocks` of ``size`` nodes, row chunk by row chunk (dense matrix or
    hierarchical fabric; memory O(chunk x nodes))."""
    n, g = cluster.num_nodes, cluster.gpus_per_node
    count = -(-n // size)
    sums, pairs, total, failed = (np.zeros((count, count)) for _ in range(4))
    hist_edges = np.linspace(0.0, cluster.fastest_links_bytes_per_s()[1] * 1.001 + 1.0, 2049)
    hist = np.zeros(len(hist_edges) - 1)
    chunk = size * max(1, 2**22 // (size * n * g * g))
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        mean, bad = _node_rows(cluster, lo, hi)
        rows = np.arange(lo, hi)
        other = rows[:, None] != np.arange(n)[None, :]
        valid = other & (mean > 0)
        hist += np.histogram(mean[valid], hist_edges)[0]
        rb = rows // size
        cb = np.arange(n) // size
        key = (rb[:, None] * count + cb[None, :]).ravel()
        sums += np.bincount(key, np.where(valid, mean, 0.0).ravel(), count * count).reshape(
            count, count
        )
        pairs += np.bincount(key, valid.ravel(), count * count).reshape(count, count)
        total += np.bincount(key, other.ravel(), count * count).reshape(count, count)
        failed += np.bincount(key, (other & (bad > 0)).ravel(), count * count).reshape(count, count)
    mean = np.divide(sums, pairs, out=np.full_like(sums, np.nan), where=pairs > 0)
    cumulative = np.cumsum(hist)
    median = (float(hist_edges[np.searchsorted(cumulative, cumulative[-1] / 2) + 1])
              if cumulative[-1] > 0 else 0.0)  # fmt: skip
    return Blocks(size, count, mean, total.astype(int), failed.astype(int), median)


def _node_rows(cluster: ClusterSpec, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes ``lo..hi-1`` to every node: mean bandwidth over the healthy GPU pairs (0:
    all failed) and the number of failed GPU pairs (the same node: meaningless)."""
    n, g = cluster.num_nodes, cluster.gpus_per_node
    f = cluster.fabric
    if f is None:
        matrix = cluster.matrix[lo * g : hi * g].reshape(hi - lo, g, n, g)
        healthy = matrix > 0
        counts = healthy.sum(axis=(1, 3))
        sums = np.where(healthy, matrix, 0.0).sum(axis=(1, 3))
        mean = np.divide(sums, counts, out=np.zeros(sums.shape), where=counts > 0)
        return mean, g * g - counts
    a, b = np.arange(lo, hi)[:, None], np.arange(n)[None, :]
    bw = np.full((hi - lo, n), f.levels[-1].bandwidth_bytes_per_s)
    for level in reversed(f.levels[:-1]):
        bw = np.where(a // level.nodes == b // level.nodes, level.bandwidth_bytes_per_s, bw)
    factor = np.ones(n)
    factor[f.slow_nics.node] = f.slow_nics.nic_factor
    bw = bw * np.minimum(factor[a], factor[b])
    np_ = f.node_pairs
    mine = (np_.src >= lo) & (np_.src < hi)
    bw[np_.src[mine] - lo, np_.dst[mine]] = np_.bandwidth_bytes_per_s[mine]
    bad = np.where(bw <= 0, g * g, 0)
    gp = f.gpu_pairs
    na, nb = gp.src // g, gp.dst // g
    mine = (na >= lo) & (na < hi) & (na != nb)
    if mine.any():
        r, c, value = na[mine] - lo, nb[mine], gp.bandwidth_bytes_per_s[mine]
        base = bw[r, c].copy()
        sums = bw * g * g
        np.add.at(sums, (r, c), np.where(value > 0, value, 0.0) - base)
        np.add.at(bad, (r, c), (value <= 0).astype(int) - (base <= 0).astype(int))
        healthy = g * g - bad
        bw = np.divide(sums, healthy, out=np.zeros(bw.shape), where=healthy > 0)
    return bw, bad


@dataclass(frozen=True)
class UsedLinks:
    """The inter-node GPU links a plan's traffic crosses: pipeline hops (every tp rank)
    and the DP rings NCCL builds; per link its ends and bandwidth (bytes/s)."""

    src: np.ndarray
    dst: np.ndarray
    bandwidth: np.ndarray
    ring: np.ndarray  # True: a DP ring link, False: a pipeline hop


def used_links(instance: Instance, plan: Plan) -> UsedLinks:
    cluster = instance.cluster
    g = cluster.gpus_per_node
    units = np.array(plan.placement, dtype=np.int64).reshape(plan.pp, plan.replicas, plan.tp)
    nxt = list(range(1, plan.pp)) + ([0] if plan.vpp > 1 and plan.pp > 1 else [])
    hops = [(units[s].ravel(), units[t].ravel()) for s, t in enumerate(nxt)]
    rings = []
    if plan.replicas > 1:
        node_of = np.arange(cluster.num_gpus) // g
        for s in range(plan.pp):
            ring = nccl_rings(units[s].T, node_of)  # tp x replicas, in NCCL's ring order
            rings.append((ring.ravel(), np.roll(ring, -1, axis=1).ravel()))
    parts = [(a, b, False) for a, b in hops] + [(a, b, True) for a, b in rings]
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return UsedLinks(empty, empty, np.zeros(0), np.zeros(0, dtype=bool))
    src = np.concatenate([a for a, _, _ in parts])
    dst = np.concatenate([b for _, b, _ in parts])
    ring_flag = np.concatenate([np.full(a.size, r) for a, _, r in parts])
    apart = src // g != dst // g
    src, dst, ring_flag = src[apart], dst[apart], ring_flag[apart]
    bandwidth = np.asarray(cluster.links[src, dst], dtype=float) if src.size else np.zeros(0)
    return UsedLinks(src, dst, bandwidth, ring_flag)


def stage_colormap(pp: int) -> Colormap:
    """tab20 for up to 20 stages, a continuous map beyond."""
    return colormaps["tab20" if pp <= 20 else "turbo"].resampled(max(pp, 2))


def block_size(num_nodes: int) -> int:
    """Nodes per block: the smallest power of two that leaves at most MAX_BLOCKS."""
    size = 1
    while -(-num_nodes // size) > MAX_BLOCKS:
        size *= 2
    return size


def block_placement_figure(instance: Instance, plan: Plan) -> Figure:
    """Left: the bandwidth between blocks of nodes (block mean), the blocks the plan's
    pipeline hops and DP rings cross (white; red: over a failed link, orange: over a slow
    one), blocks holding failed node pairs (red x), switch-group borders, and above it
    which stages (colour) and idle GPUs (grey) each block of nodes holds.
    Right: every GPU's stage, one row per block of nodes."""
    cluster = instance.cluster
    n, g = cluster.num_nodes, cluster.gpus_per_node
    size = block_size(n)
    blocks = node_blocks(cluster, size)
    k = blocks.count
    stage = np.full(k * size * g, -1, dtype=np.int64)
    units = np.array(plan.placement, dtype=np.int64).reshape(plan.pp, -1)
    stage[units.ravel()] = np.repeat(np.arange(plan.pp), units.shape[1])
    stage[n * g :] = -2  # no GPU: past the last node
    cmap = stage_colormap(plan.pp)
    fig = Figure(figsize=(14, 7.4))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.2, 1]})
    shown = blocks.mean / GB
    low, high = (float(np.nanmin(shown)), float(np.nanmax(shown))) if np.isfinite(
        shown).any() else (0.0, 1.0)  # fmt: skip
    low = 0.0 if high - low < 0.05 * high else low  # a flat matrix: no noise blown up
    image = left.imshow(np.ma.masked_invalid(shown), cmap="viridis", vmin=low, vmax=high)
    handles: list[Line2D | Patch] = []
    failed_share = blocks.failed / np.maximum(blocks.pairs, 1)
    bad_i, bad_j = np.nonzero(failed_share >= FAILED_SHARE)
    total_failed = int(blocks.failed.sum())
    if bad_i.size:
        left.scatter(bad_j, bad_i, marker="x", color="red", s=14, linewidths=0.9)
    if total_failed:
        handles.append(Line2D([], [], marker="x", color="red", linestyle="", label=(
            f"failed node pairs: {total_failed:,}, in {int((blocks.failed > 0).sum()):,} "
            f"blocks; x: >= {FAILED_SHARE:.0%} of a block")))  # fmt: skip
    links = used_links(instance, plan)
    slow = blocks.median * SLOW
    for ring, marker, name in ((False, "o", "pipeline hops"), (True, "s", "DP rings")):
        sel = links.ring == ring
        if not sel.any():
            continue
        bi, bj = links.src[sel] // g // size, links.dst[sel] // g // size
        bw = links.bandwidth[sel]
        worst = np.full((k, k), 3)  # 0 failed, 1 slow, 2 fine, 3 unused
        np.minimum.at(worst, (bi, bj), np.where(bw <= 0, 0, np.where(bw < slow, 1, 2)))
        counts = [int((bw <= 0).sum()), int(((bw > 0) & (bw < slow)).sum())]
        crowded = int((worst < 3).sum()) > CROWDED  # many blocks: the fine ones small
        for state, color in ((2, "white"), (1, "orange"), (0, "red")):
            i, j = np.nonzero(worst == state)
            small = crowded and state == 2
            if i.size:
                left.scatter(j, i, marker=marker, facecolors="none", edgecolors=color,
                             s=(8 if small else 30) * (1 if marker == "o" else 1.4),
                             linewidths=0.5 if small else 1.1, alpha=0.7 if small else 1.0)  # fmt: skip
        extra = ", ".join(
            f"{c:,} {w}" for c, w in zip(counts, ("failed", "slow"), strict=True) if c
        )
        handles.append(Line2D([], [], marker=marker, color="black", markerfacecolor="none",
                              linestyle="", label=f"{name}: {int(sel.sum()):,} links"
                              + (f" ({extra})" if extra else "")))  # fmt: skip
    if (links.bandwidth < slow).any():
        red = "; red: over a failed link" if (links.bandwidth <= 0).any() else ""
        handles.append(Line2D([], [], marker="s", color="orange", markerfacecolor="none",
                              linestyle="", label=f"orange: over a slow link (< {SLOW:.0%} of "
                              f"the median node pair, {blocks.median / GB:.1f} GB/s){red}"))  # fmt: skip
    _group_borders(left, cluster, size)
    fig.colorbar(image, ax=left, shrink=0.8, pad=0.02,
                 label=f"GB/s: mean over the node pairs of each {size}-node block")  # fmt: skip
    ticks, labels = _block_ticks(k, size, n)
    left.set_xticks(ticks, labels, rotation=90, fontsize=6)
    left.set_yticks(ticks, labels, fontsize=6)
    left.set_xlabel(f"to node (blocks of {size} nodes = {size * g} GPUs)")
    left.set_ylabel("from node")
    left.set_xlim(-0.5, k - 0.5)
    left.set_ylim(k - 0.5, -0.5)
    if handles:  # below the matrix, not over it
        fig.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.01, 0.0), ncol=2,
                   fontsize=7, frameon=False)  # fmt: skip
    top = make_axes_locatable(left).append_axes("top", size="9%", pad=0.06, sharex=left)
    top.imshow(_composition(stage, k, size * g, plan.pp, cmap), aspect="auto",
               extent=(-0.5, k - 0.5, 1, 0), interpolation="nearest")  # fmt: skip
    top.set_yticks([0.5], ["stages"], fontsize=6)
    top.tick_params(axis="x", labelbottom=False, bottom=False)
    top.set_title(f"Bandwidth between blocks of {size} nodes and the links the plan uses\n"
                  "(strip: share of each block's GPUs per stage, grey idle)", fontsize=9)  # fmt: skip
    grid = _rgba(stage.reshape(k, size * g), plan.pp, cmap)
    right.imshow(grid, aspect="auto", interpolation="nearest")
    right.set_yticks(ticks, labels, fontsize=6)
    per = max(1, size // 8)
    xt = np.arange(0, size, per)
    right.set_xticks(xt * g - 0.5, [f"+{x}" for x in xt], fontsize=6)
    right.set_xlabel(f"node within the block (+offset), {g} GPUs each")
    idle = int((stage == -1).sum())
    right.set_title(f"{plan.layout()} on {plan.num_gpus:,} of {cluster.num_gpus:,} GPUs:\n"
                    f"stage of every GPU (colour), {idle:,} idle GPUs (grey)", fontsize=9)  # fmt: skip
    legend = [Patch(color=cmap(s), label=f"stage {s}") for s in range(plan.pp)]
    if plan.pp > 20:
        legend = legend[:: -(-plan.pp // 16)]
    legend.append(Patch(color=IDLE, label="idle"))
    right.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=6,
                 frameon=False)  # fmt: skip
    fig.tight_layout(rect=(0, 0.095 if handles else 0, 1, 1))
    return fig


def _block_ticks(count: int, size: int, n: int) -> tuple[np.ndarray, list[str]]:
    """At most MAX_TICKS ticks, each at the middle of the blocks it names by node range."""
    step = -(-count // MAX_TICKS)
    starts = np.arange(0, count, step)
    ends = np.minimum(starts + step, count)
    labels = [f"{a * size}-{min(b * size, n) - 1}" for a, b in zip(starts, ends, strict=True)]
    return (starts + ends - 1) / 2, labels


def _group_borders(ax: Axes, cluster: ClusterSpec, size: int) -> None:
    """Dotted lines where the switch group (leaf) changes, if known and not too many."""
    groups = cluster.node_groups
    if groups is None:
        return
    changes = np.flatnonzero(np.diff(np.asarray(groups))) + 1
    if not 0 < changes.size <= MAX_BLOCKS // 3:
        return
    at = changes / size - 0.5
    ax.vlines(at, -0.5, -0.5 + -(-cluster.num_nodes // size), colors="white",
              linewidths=0.6, linestyles=":", alpha=0.8)  # fmt: skip
    ax.hlines(at, -0.5, -0.5 + -(-cluster.num_nodes // size), colors="white",
              linewidths=0.6, linestyles=":", alpha=0.8)  # fmt: skip


def _rgba(stage: np.ndarray, pp: int, cmap: Colormap) -> np.ndarray:
    """Colours of stage ids (-1 idle, -2 no GPU)."""
    table = np.array([to_rgba(IDLE), (1.0, 1.0, 1.0, 0.0)] + [cmap(s) for s in range(pp)])
    return table[np.where(stage >= 0, stage + 2, np.where(stage == -1, 0, 1))]


def _composition(stage: np.ndarray, count: int, width: int, pp: int, cmap: Colormap,
                 height: int = 32) -> np.ndarray:  # fmt: skip
    """height x count RGBA: per block, its GPUs' stages as a stacked column (sorted, idle
    last), so that a stage's blocks read as a band."""
    ordered = np.where(stage < 0, pp - 1 - stage, stage)  # idle pp, no GPU pp + 1: last
    per_block = np.sort(ordered.reshape(count, width), axis=1)
    pick = np.minimum((np.arange(height) + 0.5) * width / height, width - 1).astype(int)
    column = per_block[:, pick].T  # height x count
    return _rgba(np.where(column >= pp, pp - 1 - column, column), pp, cmap)
