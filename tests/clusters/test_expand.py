"""A node matrix beyond the dense limit is held as a fabric with exactly its links: the
generators and the cluster-file reader never build a 16,384-GPU matrix."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipette_cp.clusters import expand
from pipette_cp.clusters.expand import expand_node_matrix, node_matrix_fabric
from pipette_cp.clusters.generators.registry import generate
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.io import cluster_file
from pipette_cp.io.cluster_file import cluster_from_mapping, cluster_to_mapping
from pipette_cp.io.model_file import load_model
from pipette_cp.specs import Instance, TrainingSpec
from pipette_cp.specs.layouts import make_plan

GB = 1e9


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.sampled_from([1, 2, 4, 8]), st.integers(0, 2**31), st.booleans())
def test_the_fabric_has_the_matrix_links(nodes: int, g: int, seed: int, matrix_intra: bool) -> None:
    rng = np.random.default_rng(seed)
    node = rng.choice([20 * GB, 30 * GB, 40 * GB, 0.0], (nodes, nodes))
    np.fill_diagonal(node, 0.0)
    intra = rng.choice([100 * GB, 200 * GB], (g, g)) if matrix_intra else 150 * GB
    fabric = node_matrix_fabric(node, intra, g)
    assert np.array_equal(fabric.dense(), expand_node_matrix(node, intra, g))


def test_one_value_per_node_inside_nodes() -> None:
    node = np.full((3, 3), 25 * GB)
    np.fill_diagonal(node, 0.0)
    fabric = node_matrix_fabric(node, [100 * GB, 300 * GB, 300 * GB], 2)
    dense = fabric.dense()
    assert (dense[0, 1], dense[2, 3], dense[4, 5], dense[0, 2]) == (100 * GB, 300 * GB, 300 * GB,
                                                                    25 * GB)  # fmt: skip


def _instance(cluster):
    return Instance(name="t", model=load_model("gpt3-1.3b"), cluster=cluster,
                    training=TrainingSpec(global_batch_size=32, seq_length=2048))  # fmt: skip


def test_a_generated_cluster_beyond_the_limit_prices_as_its_dense_twin(monkeypatch) -> None:
    dense = generate("degraded", nodes=6, seed=2, failed_fraction=0.2)
    monkeypatch.setattr(expand, "MAX_DENSE_VIEW_GPUS", 16)  # 6 x 8 GPUs: beyond
    tree = generate("degraded", nodes=6, seed=2, failed_fraction=0.2)
    assert tree.fabric is not None and dense.fabric is None
    assert np.array_equal(tree.fabric.dense(), dense.bandwidth_bytes_per_s)
    assert tree.has_failed_pairs and tree.failed_pairs() == dense.failed_pairs()
    healthy = [generate("degraded", nodes=6, seed=2, failed_fraction=0.0)]
    monkeypatch.setattr(expand, "MAX_DENSE_VIEW_GPUS", 4096)
    healthy.append(generate("degraded", nodes=6, seed=2, failed_fraction=0.0))
    plan = make_plan(num_layers=24, dp=4, pp=2, tp=2, micro_batch_size=1, sequence_parallel=True,
                     placement=tuple((2 * k, 2 * k + 1) for k in range(8)))  # fmt: skip
    times = [Evaluator(_instance(c)).evaluate(plan).iteration_time_s for c in healthy]
    assert healthy[0].fabric is not None and healthy[1].fabric is None
    assert times[0] == pytest.approx(times[1], rel=1e-12)


def test_a_node_matrix_file_beyond_the_limit_reads_as_a_fabric(monkeypatch) -> None:
    fields = cluster_to_mapping(generate("healthy-a100", nodes=5, seed=1))
    assert "node_bandwidth_gb_per_s" in fields
    dense = cluster_from_mapping(fields)
    monkeypatch.setattr(cluster_file, "MAX_DENSE_VIEW_GPUS", 16)
    tree = cluster_from_mapping(fields)
    assert tree.fabric is not None
    assert np.array_equal(tree.fabric.dense(), dense.bandwidth_bytes_per_s)
    assert tree.nic_bandwidth_bytes_per_s == dense.nic_bandwidth_bytes_per_s
    assert (tree.intra_node_latency_s, tree.inter_node_latency_s) == (
        dense.intra_node_latency_s, dense.inter_node_latency_s)  # fmt: skip


def test_nvlink_domains_of_several_nodes_stay_dense(monkeypatch) -> None:
    """A fabric's NVLink domain is one node: a rack-scale cluster keeps its matrix."""
    monkeypatch.setattr(expand, "MAX_DENSE_VIEW_GPUS", 16)
    rack = generate("gb200-nvl72", nodes=18, seed=0)
    assert rack.nodes_per_nvlink_domain == 18 and rack.fabric is None
    fields = cluster_to_mapping(rack)
    monkeypatch.setattr(cluster_file, "MAX_DENSE_VIEW_GPUS", 16)
    assert cluster_from_mapping(fields).fabric is None


def test_a_gpu_matrix_file_stays_a_matrix(monkeypatch) -> None:
    """Only a node matrix becomes a fabric: a GPU x GPU matrix is read as it is."""
    fields = cluster_to_mapping(generate("healthy-a100", nodes=3, seed=1))
    node = fields.pop("node_bandwidth_gb_per_s")
    dense = cluster_from_mapping({**fields, "node_bandwidth_gb_per_s": node})
    gpu_rows = [[None if x == 0 else x / GB for x in row] for row in dense.bandwidth_bytes_per_s]
    monkeypatch.setattr(cluster_file, "MAX_DENSE_VIEW_GPUS", 16)
    again = cluster_from_mapping({**fields, "gpu_bandwidth_gb_per_s": gpu_rows})
    assert again.fabric is None
    assert np.allclose(again.bandwidth_bytes_per_s, dense.bandwidth_bytes_per_s)
