"""Data-parallel rings: each stage's slowest ring link, and whether the ring leaves a
node (its latency indicator, set by the NIC-sharing family's rows)."""

from __future__ import annotations

import numpy as np
import pytest

from pipette_cp.solvers.placement.families.dp_rings import DataParallelRings
from pipette_cp.solvers.placement.families.nic_sharing import NicSharing
from pipette_cp.specs.layouts import make_plan
from tests.conftest import small_instance
from tests.solvers.placement.families.harness import verify

MATRIX = np.array([[0, 5, 10, 20], [5, 0, 20, 10], [10, 20, 0, 5], [20, 10, 5, 0]]) * 1e9
PLAN = make_plan(num_layers=8, dp=3, pp=1, tp=1, micro_batch_size=1)


def test_a_ring_over_nodes_takes_its_slowest_link_and_crosses() -> None:
    instance = small_instance(nodes=4, gpus_per_node=1, node_bandwidth=MATRIX)
    verifier = verify(instance, PLAN, DataParallelRings(), NicSharing())
    data = verifier.data
    pinned = verifier.given([0, 2, 3])  # links 0-2 10, 2-3 5, 3-0 20 GB/s
    ring, cross = pinned.reads()
    assert ring == pytest.approx(data.ring_bytes[0] / 5e9, rel=1e-12)
    assert cross == 1.0
    pinned.costs()
    for other in verifier.assignments(6):
        other.costs()


def test_a_ring_inside_a_node_does_not_cross() -> None:
    instance = small_instance(nodes=2, gpus_per_node=4, node_bandwidth=MATRIX[:2, :2])
    verifier = verify(instance, PLAN, DataParallelRings(), NicSharing())
    inside = verifier.given([1, 1, 1])
    assert inside.reads()[1] == 0.0
    inside.costs()
    across = verifier.given([0, 0, 1])  # two flows share node 0's NICs
    assert across.reads()[1] == 1.0
    across.costs()
