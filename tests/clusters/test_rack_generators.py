"""Rack-scale generators: GB300 NVL72 (G8) beside GB200 NVL72 (G7), and a job's Slurm
segment of trays inside a rack as its NVLink domain (``segment_trays``)."""

from __future__ import annotations

import numpy as np
import pytest

from pipette_cp.clusters.generators.registry import (
    ALL_GENERATORS,
    RACK_GENERATORS,
    check_targets,
    generate,
)
from pipette_cp.clusters.stats import cluster_stats
from pipette_cp.cost.evaluator.evaluate import evaluate
from pipette_cp.errors import SpecError
from pipette_cp.io.model_file import load_model
from pipette_cp.search.space import tensor_sizes
from pipette_cp.specs import ClusterSpec, Instance, SearchSpace, TrainingSpec
from pipette_cp.specs.layouts import make_plan
from pipette_cp.units import GB

#: What a stream between NVLink domains gets, GB/s: ConnectX-7 (G7), ConnectX-8 (G8).
NIC = {"gb200-nvl72": 40.0, "gb300-nvl72": 80.0}


def inside_and_across(cluster: ClusterSpec) -> tuple[np.ndarray, np.ndarray]:
    """The GPU pairs of one NVLink domain (off the diagonal) and those of two."""
    bw = cluster.bandwidth_bytes_per_s
    domain = np.arange(cluster.num_gpus) // cluster.gpus_per_domain
    same = domain[:, None] == domain[None, :]
    return bw[same & ~np.eye(cluster.num_gpus, dtype=bool)], bw[~same]


def test_both_racks_are_registered() -> None:
    assert tuple(RACK_GENERATORS) == ("gb200-nvl72", "gb300-nvl72")
    assert ALL_GENERATORS["gb300-nvl72"].alias == "g8"
    doc = RACK_GENERATORS["gb300-nvl72"].builder.__doc__ or ""
    for name in RACK_GENERATORS["gb300-nvl72"].defaults:
        assert name in doc, name
    assert "{common}" not in doc and "{noise}" not in doc
    for info in RACK_GENERATORS.values():
        assert info.defaults["segment_trays"] is None and info.defaults["trays_per_rack"] == 18


@pytest.mark.parametrize(("nodes", "seed"), [(36, 0), (54, 1), (72, 2)])
def test_gb300_statistics(nodes: int, seed: int) -> None:
    cluster = generate("gb300-nvl72", nodes=nodes, seed=seed)
    assert cluster.name == f"g8-gb300-nvl72-n{nodes}-s{seed}"
    assert (cluster.gpus_per_node, cluster.nodes_per_nvlink_domain) == (4, 18)
    assert cluster.gpus_per_domain == 72 and cluster.num_domains == nodes // 18
    assert list(cluster.gpu_types) == ["GB300-NVL72-288GB"]
    assert cluster.nics_per_node == 4 and cluster.nic_bandwidth_bytes_per_s == 80 * GB
    inside, across = inside_and_across(cluster)
    assert inside.max() == 900 * GB and inside.min() > 750 * GB  # NVLink 5, capped
    assert np.median(across) == pytest.approx(80 * GB, rel=0.05)  # ConnectX-8 across racks
    stats = cluster_stats(cluster)
    assert stats.failed_fraction == 0.0 and 0.03 <= stats.asymmetry_mean <= 0.05
    assert check_targets("gb300-nvl72", cluster) == []
    for text in ("GB300 NVL72 specifications", "ConnectX-8", "topology/block"):
        assert text in cluster.source
    same = generate("g8", nodes=nodes, seed=seed)
    assert np.array_equal(same.bandwidth_bytes_per_s, cluster.bandwidth_bytes_per_s)


def test_gb300_is_gb200_with_faster_nics_and_gpus() -> None:
    """One code path: with GB200's NIC and GPU, GB300's generator draws GB200's cluster."""
    gb200 = generate("gb200-nvl72", nodes=36, seed=4)
    gb300 = generate("gb300-nvl72", nodes=36, seed=4, nic_gbytes_per_s=40.0, gpu="gb200")
    assert np.array_equal(gb200.bandwidth_bytes_per_s, gb300.bandwidth_bytes_per_s)
    assert generate("gb200-nvl72", nodes=36, seed=4, nic_gbytes_per_s=80.0).nic_bandwidth_bytes_per_s == 80 * GB  # fmt: skip


@pytest.mark.parametrize("kind", list(RACK_GENERATORS))
def test_a_segment_of_16_trays_is_the_jobs_nvlink_domain(kind: str) -> None:
    cluster = generate(kind, nodes=64, seed=0, segment_trays=16)
    assert cluster.nodes_per_nvlink_domain == 16 and cluster.gpus_per_domain == 64
    assert cluster.num_domains == 4 and cluster.node_groups == tuple(np.arange(64) // 16)
    inside, across = inside_and_across(cluster)
    assert inside.min() > 750 * GB and inside.max() == 900 * GB
    assert np.median(across) == pytest.approx(NIC[kind] * GB, rel=0.05)
    assert check_targets(kind, cluster, segment_trays=16) == []
    instance = Instance(
        name="segment", model=load_model("llama-2-13b"), cluster=cluster,
        training=TrainingSpec(global_batch_size=64, seq_length=4096), search_space=SearchSpace(),
    )  # fmt: skip
    assert max(tensor_sizes(instance)) == 64  # a tensor group may fill the segment
    plan = make_plan(num_layers=40, dp=32, pp=1, tp=8, micro_batch_size=1, sequence_parallel=True)
    assert evaluate(instance, plan).iteration_time_s > 0  # tp 8 spans 2 trays of a segment
    whole = generate(kind, nodes=64, seed=0, segment_trays=16, trays_per_rack=16)
    assert np.array_equal(whole.bandwidth_bytes_per_s, cluster.bandwidth_bytes_per_s)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: generate("gb300-nvl72", nodes=20, seed=0),
         "nodes=20: must be a multiple of trays_per_rack=18 (whole racks)"),
        (lambda: generate("gb300-nvl72", nodes=18, seed=0, gpus_per_node=8),
         "gpus_per_node=8: must be 4 for gb300-nvl72 (a GB300 compute tray holds 4 GPUs)"),
        (lambda: generate("gb300-nvl72", nodes=38, seed=0, segment_trays=19),
         "gb300-nvl72.segment_trays=19: must be <= trays_per_rack=18 (a segment lies in one rack)"),
        (lambda: generate("gb300-nvl72", nodes=40, seed=0, segment_trays=16),
         "nodes=40: must be a multiple of segment_trays=16 (one segment per rack)"),
        (lambda: generate("gb200-nvl72", nodes=16, seed=0, segment_trays=0),
         "gb200-nvl72.segment_trays=0: must be >= 1"),
        (lambda: generate("gb300-nvl72", nodes=18, seed=0, nic_gbytes_per_s=1000),
         "gb300-nvl72.nic_gbytes_per_s=1000: must not exceed nvlink_gbytes_per_s=900"),
    ],
)  # fmt: skip
def test_rack_parameters_are_checked(call, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SpecError) as info:
        call()
    assert str(info.value) == message
