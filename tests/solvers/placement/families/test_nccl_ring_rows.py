"""Rings as NCCL builds them in the masters: nodes in the order of their first replica.

The master pinned to an assignment reads the Evaluator's ring (exact on node places),
a failed node pair is refused exactly where NCCL's ring takes it (not where rank order
would), and the checker agrees."""

from __future__ import annotations

import numpy as np
import pytest

from pipette_cp.checker import CHECKS, check_plan
from pipette_cp.errors import InfeasibleError
from pipette_cp.solvers.placement.families.dp_rings import DataParallelRings
from pipette_cp.solvers.placement.families.hard.no_failed_link import NoFailedLink
from pipette_cp.solvers.placement.families.hops import PipelineHops
from pipette_cp.solvers.placement.families.nccl_ring_rows import ring_rows_exact
from pipette_cp.solvers.placement.families.nic_sharing import NicSharing
from pipette_cp.specs.layouts import make_plan
from tests.conftest import small_instance
from tests.solvers.placement.families.harness import verify

#: four two-GPU nodes whose pairs differ (GB/s)
MATRIX = np.array([[0, 5, 10, 20], [5, 0, 20, 10], [10, 20, 0, 5], [20, 10, 5, 0]]) * 1e9
FAMILIES = (NoFailedLink(), PipelineHops(), DataParallelRings(), NicSharing())


@pytest.mark.parametrize(("dp", "pp"), [(5, 1), (3, 2), (4, 2)])
def test_the_pinned_master_reads_nccls_ring(dp, pp) -> None:
    instance = small_instance(nodes=4, gpus_per_node=2 * pp, node_bandwidth=MATRIX)
    plan = make_plan(num_layers=8, dp=dp, pp=pp, tp=1, micro_batch_size=1)
    verifier = verify(instance, plan, *FAMILIES)
    assert ring_rows_exact(verifier.data)
    for pinned in verifier.assignments(10, seed=dp):
        pinned.costs()


def test_replicas_on_nodes_0_2_0_1_3_run_the_ring_0_2_1_3() -> None:
    """Rank order would join 0-2, 2-0, 0-1, 1-3, 3-0 (slowest 5 GB/s); NCCL joins 0-2,
    2-1, 1-3, 3-0 (slowest 10 GB/s)."""
    instance = small_instance(nodes=4, gpus_per_node=2, node_bandwidth=MATRIX)
    plan = make_plan(num_layers=8, dp=5, pp=1, tp=1, micro_batch_size=1)
    verifier = verify(instance, plan, *FAMILIES)
    pinned = verifier.given([0, 2, 0, 1, 3])
    ring, cross = pinned.reads()[:2]
    assert ring == pytest.approx(verifier.data.ring_bytes[0] / 10e9, rel=1e-12)
    assert cross == 1.0
    pinned.costs()


#: the same nodes with the pair 1-3 failed
FAILED = MATRIX.copy()
FAILED[1, 3] = FAILED[3, 1] = 0.0


def _plan_of(verifier, assign):
    return verifier.data.plan.model_copy(
        update={"placement": verifier.data.placement(np.asarray(assign))}
    )


def test_a_failed_pair_is_refused_where_nccls_ring_takes_it() -> None:
    """Nodes 0, 1, 0, 3, 2: rank order never joins 1 and 3, but NCCL's ring 0 1 3 2 does."""
    instance = small_instance(nodes=4, gpus_per_node=2, node_bandwidth=FAILED)
    plan = make_plan(num_layers=8, dp=5, pp=1, tp=1, micro_batch_size=1)
    verifier = verify(instance, plan, *FAMILIES)
    pinned = verifier.given([0, 1, 0, 3, 2])
    pinned.is_infeasible()
    with pytest.raises(InfeasibleError):
        pinned.reads()
    assert CHECKS[NoFailedLink.check](instance, _plan_of(verifier, [0, 1, 0, 3, 2]))


def test_a_failed_pair_that_only_rank_order_would_take_is_fine() -> None:
    """Nodes 1, 0, 3, 1, 2: rank order joins 3 -> 1, NCCL's ring 1 0 3 2 does not."""
    instance = small_instance(nodes=4, gpus_per_node=2, node_bandwidth=FAILED)
    plan = make_plan(num_layers=8, dp=5, pp=1, tp=1, micro_batch_size=1)
    verifier = verify(instance, plan, *FAMILIES)
    verifier.given([1, 0, 3, 1, 2]).costs()
    placed = _plan_of(verifier, [1, 0, 3, 1, 2])
    assert not CHECKS[NoFailedLink.check](instance, placed)
    assert not check_plan(instance, placed)


def test_a_tensor_group_as_wide_as_its_node_is_priced_exactly_on_slots() -> None:
    """A slow GPU pair between nodes 0 and 1 makes the places tensor-group slots, one per
    node (tp = 2 GPUs per node): the ring rows still read the Evaluator's ring."""
    instance = small_instance(nodes=4, gpus_per_node=2, node_bandwidth=MATRIX)
    matrix = instance.cluster.bandwidth_bytes_per_s.copy()
    matrix[0, 2] = matrix[2, 0] = 2e9
    cluster = instance.cluster.model_copy(update={"bandwidth_bytes_per_s": matrix})
    instance = instance.model_copy(update={"cluster": cluster})
    plan = make_plan(num_layers=8, dp=4, pp=1, tp=2, micro_batch_size=1, sequence_parallel=True)
    verifier = verify(instance, plan, *FAMILIES)
    assert not verifier.data.node_level and ring_rows_exact(verifier.data)
    for pinned in verifier.assignments(6, seed=3):
        pinned.costs()
