"""Pipeline hops: each boundary's slowest activation and gradient hop."""

from __future__ import annotations

import numpy as np
import pytest

from pipette_cp.solvers.placement.families.hops import PipelineHops
from pipette_cp.specs.layouts import make_plan
from tests.conftest import small_instance
from tests.solvers.placement.families.harness import verify

#: four one-GPU nodes at 5, 10 or 20 GB/s
MATRIX = np.array([[0, 5, 10, 20], [5, 0, 20, 10], [10, 20, 0, 5], [20, 10, 5, 0]]) * 1e9
INSTANCE = small_instance(nodes=4, gpus_per_node=1, node_bandwidth=MATRIX)


def test_one_hop_is_latency_plus_bytes_over_the_link_both_ways() -> None:
    plan = make_plan(num_layers=8, dp=1, pp=2, tp=1, micro_batch_size=1)
    verifier = verify(INSTANCE, plan, PipelineHops())
    data, cluster = verifier.data, INSTANCE.cluster
    one = cluster.inter_node_latency_s + data.act_bytes / 5e9  # nodes 0 -> 1: 5 GB/s
    assert verifier.given([0, 1]).costs(2 * one) == pytest.approx(2 * one)


def test_every_boundary_takes_its_slowest_replica() -> None:
    plan = make_plan(num_layers=8, dp=2, pp=2, tp=1, micro_batch_size=1)
    verifier = verify(INSTANCE, plan, PipelineHops())
    for pinned in verifier.assignments(6):
        pinned.costs()


def test_interleaving_adds_the_hop_from_the_last_stage_to_the_first() -> None:
    plan = make_plan(num_layers=8, dp=1, pp=2, tp=1, vpp=2, micro_batch_size=1)
    verifier = verify(INSTANCE, plan, PipelineHops())
    assert verifier.data.hops == 2
    for pinned in verifier.assignments(4):
        pinned.costs()
