"""The hierarchical fabric: lookups against a dense matrix built pair by pair, its checks,
and generated trees of 100,000 GPUs in O(nodes + exceptions) memory."""

from __future__ import annotations

import numpy as np
import pytest

from pipette_cp.clusters.generators.fat_tree import fat_tree
from pipette_cp.errors import SpecError
from pipette_cp.specs import validate_spec
from pipette_cp.specs.hierarchy import FabricLevel, HierarchicalFabric

GB = 1e9


def small(**extra: object) -> HierarchicalFabric:
    fields: dict = {
        "num_nodes": 8, "gpus_per_node": 2, "nvlink_bandwidth_bytes_per_s": 400 * GB,
        "nvlink_latency_s": 1e-6,
        "levels": [
            {"name": "leaf", "nodes": 2, "bandwidth_bytes_per_s": 40 * GB, "latency_s": 5e-6},
            {"name": "spine", "nodes": 8, "bandwidth_bytes_per_s": 20 * GB, "latency_s": 8e-6},
        ],
        "slow_nics": {"node": [3], "nic_factor": [0.5]},
        "node_pairs": {"src": [0, 6], "dst": [5, 7], "bandwidth_bytes_per_s": [0.0, 100 * GB]},
        "gpu_pairs": {"src": [2], "dst": [3], "bandwidth_bytes_per_s": [100 * GB]},
    }  # fmt: skip
    return validate_spec(HierarchicalFabric, {**fields, **extra}, "fabric")


def by_hand(f: HierarchicalFabric) -> np.ndarray:
    """The matrix the docstring describes, one pair at a time."""
    n, g = f.num_gpus, f.gpus_per_node
    out = np.zeros((n, n))
    slow = dict(zip(f.slow_nics.node.tolist(), f.slow_nics.nic_factor.tolist(), strict=True))
    node_pairs = {
        (int(a), int(b)): float(w)
        for a, b, w in zip(
            f.node_pairs.src, f.node_pairs.dst, f.node_pairs.bandwidth_bytes_per_s, strict=True
        )
    }
    gpu_pairs = {(int(a), int(b)): float(w) for a, b, w in zip(
        f.gpu_pairs.src, f.gpu_pairs.dst, f.gpu_pairs.bandwidth_bytes_per_s, strict=True)}  # fmt: skip
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            a, b = i // g, j // g
            if a == b:
                w = f.nvlink_bandwidth_bytes_per_s
            else:
                level = next(lv for lv in f.levels if a // lv.nodes == b // lv.nodes)
                w = level.bandwidth_bytes_per_s * min(slow.get(a, 1.0), slow.get(b, 1.0))
                w = node_pairs.get((a, b), w)
            out[i, j] = gpu_pairs.get((i, j), w)
    return out


def test_lookups_match_the_pairs_one_by_one() -> None:
    f = small()
    assert np.array_equal(f.dense(), by_hand(f))
    dense = f.dense()
    assert dense[0, 10] == 0 and dense[10, 0] == 20 * GB  # a failed pair is one way
    assert dense[12, 14] == 100 * GB  # node pair 6 -> 7 measured faster than its level


def test_generated_trees_match_their_dense_matrix() -> None:
    f = fat_tree(2048, seed=3, degraded_pair_rate=0.05, failed_pair_rate=0.01)
    assert [lv.name for lv in f.levels] == ["leaf", "spine"]
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, f.num_gpus, 3000), rng.integers(0, f.num_gpus, 3000)
    dense = f.dense()
    assert np.array_equal(f.bandwidth(src, dst), dense[src, dst])
    nodes = f.num_nodes
    off = ~np.eye(nodes, dtype=bool)
    node_matrix = dense[::8, ::8]
    assert (node_matrix[off] == 0).mean() == pytest.approx(0.01, abs=2e-3)


@pytest.mark.slow
def test_a_hundred_thousand_gpus_fit_in_tens_of_megabytes() -> None:
    f = fat_tree(100_000, seed=0, leaf_nodes=25, pod_leaves=20)
    assert f.num_gpus == 100_000 and [lv.nodes for lv in f.levels] == [25, 500, 12_500]
    assert f.node_pairs.src.size == round(0.02 * 12_500 * 12_499)  # 2 % of the node pairs
    assert f.memory_bytes() < 100e6  # the GPU x GPU matrix would be 80 GB
    nominal = [lv.bandwidth_bytes_per_s for lv in f.levels]
    assert nominal == sorted(nominal, reverse=True)
    rng = np.random.default_rng(1)
    src, dst = rng.integers(0, f.num_gpus, 200_000), rng.integers(0, f.num_gpus, 200_000)
    bw = f.bandwidth(src, dst)
    # pairs off every exception run at their level's bandwidth; 2 % are degraded, 1 % of
    # the nodes have slow NICs: about 4 % of the pairs differ
    level = f.level_of(src, dst)
    plain = np.where(level < 0, f.nvlink_bandwidth_bytes_per_s, np.array(nominal)[level])
    assert 0.02 < (bw != plain)[src != dst].mean() < 0.06


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"levels": [{"name": "leaf", "nodes": 3, "bandwidth_bytes_per_s": 1e10, "latency_s": 0},
                     {"name": "spine", "nodes": 8, "bandwidth_bytes_per_s": 1e10, "latency_s": 0}]},
         "levels[1].nodes=8: must be a multiple of the level below's 3 nodes (each group whole "
         "groups of the level below)"),
        ({"levels": [{"name": "leaf", "nodes": 4, "bandwidth_bytes_per_s": 1e10, "latency_s": 0}]},
         "levels[0].nodes=4: the last level must hold every one of the 8 nodes"),
        ({"gpu_pairs": {"src": [16], "dst": [0], "bandwidth_bytes_per_s": [1e9]}},
         "gpu_pairs.src[0]=16: no such GPU: the fabric has 16 (0..15)"),
        ({"node_pairs": {"src": [1], "dst": [9], "bandwidth_bytes_per_s": [1e9]}},
         "node_pairs.dst[0]=9: no such node: the fabric has 8 (0..7)"),
        ({"slow_nics": {"node": [2], "nic_factor": [1.5]}},
         "slow_nics.nic_factor[0]=1.5: must be in (0, 1]"),
        ({"node_pairs": {"src": [1, 2], "dst": [1, 3], "bandwidth_bytes_per_s": [1e9, 1e9]}},
         "node_pairs.dst[0]=1: a pair needs two different ends"),
        ({"node_pairs": {"src": [1], "dst": [2], "bandwidth_bytes_per_s": [1e9, 2e9]}},
         "node_pairs=[1, 1, 2]: its arrays must have one length"),
    ],
)  # fmt: skip
def test_bad_hierarchies_are_one_line(extra, message) -> None:
    with pytest.raises(SpecError) as info:
        small(**extra)
    assert str(info.value) == f"fabric='{{...}}': {message}"


def test_fat_tree_refuses_counts_that_do_not_fill_leaves() -> None:
    with pytest.raises(SpecError, match=r"gpus=100000: 12500 nodes do not fill whole leaves of 32"):
        fat_tree(100_000)
    with pytest.raises(SpecError, match=r"gpus=12: must be a positive multiple of 8"):
        fat_tree(12)
    assert FabricLevel(name="x", nodes=1, bandwidth_bytes_per_s=1.0, latency_s=0.0).nodes == 1
