"""Replica symmetry: replica 0 of stage 0 on the lowest place of its rotation class (and,
on symmetric links without groups, replica 1 below the last); every placement has a
canonical twin of the same time."""

from __future__ import annotations

import numpy as np
import pytest

from pipette_cp.solvers.extensions import ConstraintFamily
from pipette_cp.solvers.placement.families.context_rings import ContextParallelRings
from pipette_cp.solvers.placement.families.dp_rings import DataParallelRings
from pipette_cp.solvers.placement.families.hard.user import UserFamily
from pipette_cp.solvers.placement.families.nic_sharing import NicSharing
from pipette_cp.solvers.placement.families.symmetry import (
    ReplicaSymmetry,
    rotation_period,
    rotations_keep_rings,
)
from pipette_cp.specs.layouts import make_plan
from tests.conftest import small_instance
from tests.solvers.placement.families.harness import verify

MATRIX = np.array([[0, 5, 10, 20], [5, 0, 20, 10], [10, 20, 0, 5], [20, 10, 5, 0]]) * 1e9
INSTANCE = small_instance(nodes=4, gpus_per_node=1, node_bandwidth=MATRIX)
#: two nodes: every order of the replicas makes NCCL visit the same two nodes
TWO_NODES = small_instance(nodes=2, gpus_per_node=2, node_bandwidth=MATRIX[:2, :2])
PLAN = make_plan(num_layers=8, dp=3, pp=1, tp=1, micro_batch_size=1)
RING = (DataParallelRings(), NicSharing())


@pytest.mark.parametrize("assign", [[1, 0, 0], [1, 1, 0], [0, 1, 0]])
def test_non_canonical_placements_are_cut_off_and_their_twins_kept(assign) -> None:
    verifier = verify(TWO_NODES, PLAN, *RING, ReplicaSymmetry())
    data = verifier.data
    assert rotation_period(data) == 1 and rotations_keep_rings(data)
    verifier.given(assign).is_infeasible()
    twin = ReplicaSymmetry().canonical(data, np.array(assign))
    verifier.given(twin).costs()
    assert data.value(twin) == pytest.approx(data.value(np.array(assign)), rel=1e-12)


def test_rotations_that_change_nccls_ring_keep_every_placement() -> None:
    """Five replicas on nodes 0, 2, 0, 1, 3: NCCL's ring visits 0 2 1 3 (slowest link 10
    GB/s); rotated by one (2, 0, 1, 3, 0) it visits 2 0 1 3 (5 GB/s).  No rotation is
    cut off there, and the oracle enumerates them all."""
    instance = small_instance(nodes=4, gpus_per_node=2, node_bandwidth=MATRIX)
    plan = make_plan(num_layers=8, dp=5, pp=1, tp=1, micro_batch_size=1)
    verifier = verify(instance, plan, *RING, ReplicaSymmetry())
    data = verifier.data
    assert not rotations_keep_rings(data)
    assign = np.array([0, 2, 0, 1, 3])
    rotated = np.roll(assign, -1)
    assert data.value(rotated) > data.value(assign)
    ring, _ = verifier.given(assign).reads()
    assert ring == pytest.approx(data.ring_bytes[0] / 10e9, rel=1e-12)
    assert verifier.given(rotated).reads()[0] == pytest.approx(data.ring_bytes[0] / 5e9, rel=1e-12)
    for a in (assign, rotated, ReplicaSymmetry().canonical(data, rotated)):
        verifier.given(a).is_feasible()
    verifier.given(rotated).costs()


def test_a_family_that_is_not_symmetric_drops_the_rows() -> None:
    class Nothing(ConstraintFamily):
        name = "nothing"

        def violations(self, instance, plan) -> list[str]:
            return []

    verify(TWO_NODES, PLAN, *RING, UserFamily(Nothing()), ReplicaSymmetry()).given(
        [1, 0, 0]
    ).is_feasible()


def test_groups_of_replicas_keep_only_rotations_by_their_size() -> None:
    """Context-parallel rings of 2 consecutive replicas: rotations by 2 keep them (the
    period comes from the families present: the DP rings alone allow any rotation)."""
    plan = make_plan(num_layers=8, dp=2, pp=1, tp=1, cp=2, micro_batch_size=1)
    instance = small_instance(nodes=2, gpus_per_node=2, node_bandwidth=MATRIX[:2, :2])
    assert rotation_period(verify(instance, plan, *RING).data) == 1
    verifier = verify(instance, plan, *RING, ContextParallelRings(), ReplicaSymmetry())
    assert rotation_period(verifier.data) == 2
    verifier.given([0, 1, 0, 1]).is_feasible()  # replica 0 not above replica 2
    verifier.given([1, 0, 0, 1]).is_infeasible()
