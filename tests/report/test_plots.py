"""Plots stay legible at any size: small plans op by op and node by node, big ones
aggregated (a bounded number of artists and tick labels, a bounded PNG), and the
aggregation itself adds up."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

from pipette_cp.clusters.generators.fat_tree import fat_tree_cluster
from pipette_cp.cost.evaluator.evaluate import simulate
from pipette_cp.report.plot_blocks import node_blocks, used_links
from pipette_cp.report.plot_shares import _covered, _shares
from pipette_cp.report.plots import (
    placement_figure,
    placement_is_detailed,
    timeline_figure,
    timeline_is_detailed,
)
from pipette_cp.specs.hierarchy import PairExceptions
from pipette_cp.specs.layouts import make_plan
from tests.conftest import small_instance


def _artists(fig: Figure) -> int:
    return sum(len(ax.patches) + len(ax.collections) + len(ax.images) + len(ax.texts)
               + len(ax.lines) for ax in fig.axes)  # fmt: skip


def _paths(fig: Figure) -> int:
    return sum(len(c.get_paths()) for ax in fig.axes for c in ax.collections)


def _tick_labels(fig: Figure) -> int:
    return max(len(ax.get_xticklabels()) + len(ax.get_yticklabels()) for ax in fig.axes)


def _png_bytes(fig: Figure, tmp_path, name: str) -> int:
    path = tmp_path / name
    fig.savefig(path, dpi=130)  # as `pipette-cp plot` writes it
    return path.stat().st_size


@pytest.fixture(scope="module")
def large():
    """1,024 GPUs (128 nodes x 8), dp32-pp8-tp4, 64 micro-batches per replica."""
    instance = small_instance(nodes=128, gpus_per_node=8, layers=32, global_batch_size=2048)
    plan = make_plan(num_layers=32, dp=32, pp=8, tp=4, micro_batch_size=1)
    return instance, plan, simulate(instance, plan)


# ------------------------------------------------------------------------ small plans
def test_a_small_timeline_draws_one_box_per_op(tmp_path) -> None:
    instance = small_instance(nodes=2, gpus_per_node=4)
    plan = make_plan(num_layers=8, dp=2, pp=2, tp=2, micro_batch_size=1, vpp=2)
    timeline = simulate(instance, plan)
    assert timeline_is_detailed(timeline)
    fig = timeline_figure(timeline, "small")
    (ax,) = fig.axes
    boxes = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert sum(len(c.get_paths()) for c in boxes) == len(timeline.ops)
    labels = {t.get_text() for t in ax.texts}  # micro-batch numbers on the compute boxes
    assert {"0", "1"} <= labels
    assert "iteration" in ax.get_title() and ax.get_title().startswith("small")
    top = max(ax.get_yticklabels(), key=lambda t: t.get_position()[1])
    assert top.get_text().startswith("stage 0\nGPU")  # stage 0 on top, as before
    assert _png_bytes(fig, tmp_path, "t.png") > 10_000


def test_a_small_placement_keeps_the_node_matrix(tmp_path) -> None:
    instance = small_instance(nodes=4, gpus_per_node=4)
    plan = make_plan(num_layers=8, dp=4, pp=2, tp=2, micro_batch_size=1)
    assert placement_is_detailed(instance)
    fig = placement_figure(instance, plan)
    left, right = fig.axes[0], fig.axes[1]
    assert left.images[0].get_array().shape == (4, 4)  # node x node
    assert right.images[0].get_array().shape == (4, 4)  # node x local GPU
    assert len(right.texts) == plan.num_gpus  # the DP replica of every GPU
    assert _png_bytes(fig, tmp_path, "p.png") > 10_000


# ------------------------------------------------------------------------ large plans
def test_a_large_timeline_is_aggregated(large, tmp_path) -> None:
    _, plan, timeline = large
    assert len(timeline.ops) > 2000
    assert not timeline_is_detailed(timeline)
    fig = timeline_figure(timeline, "big")
    assert _artists(fig) < 100
    assert _paths(fig) < 300  # a few polygons per stage and kind, not one per op
    assert _tick_labels(fig) <= 40
    assert "iteration" in fig.get_suptitle()
    main, _ = fig.axes
    assert len(main.get_yticklabels()) == plan.pp
    legend = {t.get_text() for t in fig.legends[0].get_texts()}
    assert {"forward", "backward", "idle"} <= legend
    width, height = fig.get_size_inches()
    assert width <= 14 and height <= 12
    assert _png_bytes(fig, tmp_path, "t.png") < 1_000_000


def test_many_stages_share_rows() -> None:
    instance = small_instance(nodes=16, gpus_per_node=8, layers=128, global_batch_size=64)
    plan = make_plan(num_layers=128, dp=2, pp=64, tp=1, micro_batch_size=1)
    timeline = simulate(instance, plan)
    fig = timeline_figure(timeline)
    main = fig.axes[0]
    labels = main.get_yticklabels()
    assert 0 < len(labels) <= 24
    assert max(labels, key=lambda t: t.get_position()[1]).get_text() == "stages 0-1"
    assert _artists(fig) < 100 and _paths(fig) < 600


def test_a_large_placement_is_aggregated_by_node_block(large, tmp_path) -> None:
    instance, plan, _ = large
    assert not placement_is_detailed(instance)
    fig = placement_figure(instance, plan)
    left = fig.axes[0]
    assert left.images[0].get_array().shape == (64, 64)  # blocks of 2 nodes
    assert len(left.get_xticklabels()) <= 16 and left.get_xticklabels()[0].get_text() == "0-7"
    assert _artists(fig) < 60
    assert _paths(fig) < 64 * 64 * 2
    assert any("GB/s: mean" in ax.get_ylabel() for ax in fig.axes)  # the colorbar says which
    width, height = fig.get_size_inches()
    assert width <= 15 and height <= 9
    assert _png_bytes(fig, tmp_path, "p.png") < 2_000_000


def test_a_16k_gpu_fabric_placement_marks_failures_and_idle_gpus(tmp_path) -> None:
    cluster = fat_tree_cluster(16384, seed=0, failed_pair_rate=0.002)
    instance = small_instance().model_copy(update={"cluster": cluster})
    plan = make_plan(num_layers=16, dp=64, pp=16, tp=8, micro_batch_size=1)  # 8,192 GPUs
    fig = placement_figure(instance, plan)
    left, right = fig.axes[0], fig.axes[1]
    assert left.images[0].get_array().shape == (64, 64)  # blocks of 32 nodes (leaves)
    assert right.images[0].get_array().shape[:2] == (64, 32 * 8)  # every GPU
    assert "8,192 idle GPUs" in right.get_title()
    legend = " ".join(t.get_text() for t in fig.legends[0].get_texts())
    failed = int((cluster.fabric.node_pairs.bandwidth_bytes_per_s <= 0).sum())
    assert f"failed node pairs: {failed:,}" in legend
    assert "pipeline hops" in legend and "DP rings" in legend
    assert _artists(fig) < 60 and _tick_labels(fig) <= 40
    assert _png_bytes(fig, tmp_path, "p.png") < 2_000_000


# ---------------------------------------------------------------------- aggregation
def test_covered_time_per_bin_matches_brute_force() -> None:
    rng = np.random.default_rng(0)
    starts = rng.uniform(0, 10, 200)
    spans = np.column_stack([starts, starts + rng.uniform(0, 1, 200)])
    edges = np.linspace(0, 11, 23)
    brute = [sum(max(0.0, min(b, e) - max(a, s)) for s, e in spans)
             for a, b in itertools.pairwise(edges)]  # fmt: skip
    assert np.allclose(_covered(spans, edges), brute)


def test_shares_are_the_busy_time(large) -> None:
    _, plan, timeline = large
    kinds = ["forward", "backward", "send", "recv", "dp_sync"]
    total = timeline.iteration_time_s
    whole = _shares(timeline, kinds, np.array([0.0, total]), 1, plan.pp)[:, :, 0]
    busy = [timeline.busy_s(s) / total for s in range(plan.pp)]
    assert np.allclose(whole[:, :2].sum(axis=1), busy)
    binned = _shares(timeline, kinds, np.linspace(0, total, 50), 1, plan.pp)
    assert (binned.sum(axis=1) <= 1 + 1e-9).all()


def test_fabric_blocks_match_the_dense_matrix() -> None:
    cluster = fat_tree_cluster(512, seed=1, failed_pair_rate=0.05)  # 64 nodes x 8
    fabric = cluster.fabric
    assert fabric is not None
    g = cluster.gpus_per_node
    fields = {k: v for k, v in fabric.__dict__.items() if not k.startswith("_")}
    gpu_pairs = PairExceptions(src=np.array([0, 9, 100]), dst=np.array([8, 300, 101]),
                               bandwidth_bytes_per_s=np.array([0.0, 1e9, 5e9]))  # fmt: skip
    fabric = type(fabric)(**{**fields, "gpu_pairs": gpu_pairs})
    cluster = cluster.model_copy(update={"fabric": fabric})
    dense = cluster.model_copy(update={"fabric": None, "bandwidth_bytes_per_s": fabric.dense()})
    for size in (1, 4):
        a, b = node_blocks(cluster, size), node_blocks(dense, size)
        assert np.allclose(a.mean, b.mean, equal_nan=True)
        assert (a.failed == b.failed).all() and (a.pairs == b.pairs).all()
        assert a.median == pytest.approx(b.median)
    one = node_blocks(dense, 1)
    assert one.failed[0, 1] == 1 and one.mean[0, 1] == pytest.approx(
        (fabric.bandwidth(np.arange(g), np.arange(g, 2 * g)[:, None]).sum()) / (g * g - 1)
    )


def test_used_links_follow_the_rings_nccl_builds() -> None:
    instance = small_instance(nodes=4, gpus_per_node=2)
    units = tuple((g,) for g in (0, 2, 1, 4, 3, 6))  # replicas on nodes 0 1 0 2 1 3
    plan = make_plan(num_layers=8, dp=6, pp=1, tp=1, micro_batch_size=1, placement=units)
    links = used_links(instance, plan)
    pairs = {(int(a), int(b)) for a, b in zip(links.src, links.dst, strict=True)}
    assert pairs == {(1, 2), (3, 4), (4, 6), (6, 0)}  # ring 0 1 2 3 4 6; in-node links left out
    assert links.ring.all() and (links.bandwidth > 0).all()
