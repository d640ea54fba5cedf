"""Communication model: point-to-point, NIC sharing, ring and hierarchical collectives,
failed links (never used silently)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipette_cp.clusters.expand import cluster_from_node_matrix
from pipette_cp.cost.network.collectives import (
    Fabric,
    collective_times_s,
    flow_bandwidths,
    hierarchical_times_s,
    local_group_size,
    p2p_time_s,
    p2p_times_s,
    ring_time_s,
    ring_times_s,
)
from pipette_cp.errors import InfeasibleError
from pipette_cp.specs import resolve_gpu
from pipette_cp.units import GB, US

INTRA, INTER, NIC = 200 * GB, 20 * GB, 25 * GB


def fabric(
    nodes: int = 2, gpus: int = 4, nics: int = 2, node_bw: np.ndarray | None = None
) -> Fabric:
    """``nodes`` x ``gpus``: 200 GB/s inside a node, 20 GB/s across, ``nics`` x 25 GB/s."""
    matrix = np.full((nodes, nodes), INTER) if node_bw is None else node_bw
    cluster = cluster_from_node_matrix(
        node_bandwidth=matrix,
        intra_node=INTRA,
        gpus_per_node=gpus,
        gpu=resolve_gpu("a100"),
        nics_per_node=nics,
        nic_bandwidth_bytes_per_s=NIC,
        intra_node_latency_s=5 * US,
        inter_node_latency_s=10 * US,
    )
    return Fabric.from_cluster(cluster)


def with_failed(fab: Fabric, pairs: list[tuple[int, int]]) -> Fabric:
    matrix = fab.bandwidth.copy()
    for i, j in pairs:
        matrix[i, j] = 0.0
    return Fabric(matrix, fab.latency, fab.node_of, fab.nic_capacity_bytes_per_s, fab.num_nodes,
                  fab.intra_node_latency_s, fab.inter_node_latency_s)  # fmt: skip


# ------------------------------------------------------------------ point to point
def test_p2p_is_latency_plus_bytes_over_bandwidth() -> None:
    fab = fabric()
    assert p2p_time_s(fab, 0, 1, 1e9) == pytest.approx(5 * US + 1e9 / INTRA)
    assert p2p_time_s(fab, 0, 4, 1e9) == pytest.approx(10 * US + 1e9 / INTER)


def test_p2p_uses_the_directional_entry_of_an_asymmetric_matrix() -> None:
    fab = fabric(node_bw=np.array([[0.0, 20 * GB], [10 * GB, 0.0]]))
    assert p2p_time_s(fab, 0, 4, 1e9) < p2p_time_s(fab, 4, 0, 1e9)


def test_failed_pair_raises_and_names_the_gpus() -> None:
    fab = with_failed(fabric(), [(1, 6)])
    with pytest.raises(InfeasibleError, match=r"1->6"):
        p2p_time_s(fab, 1, 6, 1e6)
    assert p2p_time_s(fab, 6, 1, 1e6) > 0  # the other direction still works


# ------------------------------------------------------------------ NIC sharing
def test_nic_sharing_slows_concurrent_flows() -> None:
    fab = fabric(nics=2)  # 50 GB/s per node, one flow alone gets min(20, 50) = 20 GB/s
    alone = flow_bandwidths(fab, np.array([0]), np.array([4]))
    assert alone[0] == pytest.approx(INTER)
    four = flow_bandwidths(fab, np.arange(4), np.arange(4, 8))  # all 4 GPUs of node 0 at once
    assert four == pytest.approx(np.full(4, 2 * NIC / 4))  # min(B, nics * nic_bw / k)
    assert p2p_times_s(fab, np.arange(4), np.arange(4, 8), 1e9).min() > p2p_time_s(fab, 0, 4, 1e9)


def test_receiving_side_shares_its_nics_too() -> None:
    fab = fabric(nodes=3, nics=1)
    # GPUs of nodes 1 and 2 all send into node 0: node 0 receives 8 flows on one NIC
    bw = flow_bandwidths(fab, np.arange(4, 12), np.tile(np.arange(4), 2))
    assert bw == pytest.approx(np.full(8, NIC / 8))


def test_flows_of_different_groups_do_not_share() -> None:
    fab = fabric(nics=1)
    src, dst = np.arange(4), np.arange(4, 8)
    together = flow_bandwidths(fab, src, dst)
    apart = flow_bandwidths(fab, src, dst, group=np.arange(4))
    assert together == pytest.approx(np.full(4, NIC / 4))
    assert apart == pytest.approx(np.full(4, min(INTER, NIC)))


def test_intra_node_flows_never_touch_the_nics() -> None:
    fab = fabric(nics=1)
    assert flow_bandwidths(fab, np.array([0, 1, 2]), np.array([1, 2, 3])) == pytest.approx(
        np.full(3, INTRA)
    )


# ------------------------------------------------------------------ ring collectives
@pytest.mark.parametrize(
    ("op", "factor"), [("all_reduce", 2), ("reduce_scatter", 1), ("all_gather", 1)]
)
def test_ring_collective_formula(op: str, factor: int) -> None:
    fab = fabric()
    ring, n, size = np.array([0, 1, 2, 3]), 4, 4e8
    expected = factor * (n - 1) / n * size / INTRA + factor * (n - 1) * 5 * US
    assert ring_time_s(fab, ring, size, op) == pytest.approx(expected)  # type: ignore[arg-type]


def test_ring_is_paced_by_its_slowest_link_and_nccl_groups_each_node() -> None:
    fab = fabric()
    # 0 1 4 5: crosses nodes twice (1->4, 5->0)
    two, interleaved = np.array([0, 1, 4, 5]), np.array([0, 4, 1, 5])
    expected_two = 2 * 3 / 4 * 1e9 / INTER + 2 * 3 * 10 * US
    assert ring_time_s(fab, two, 1e9) == pytest.approx(expected_two)
    # rank order 0 4 1 5 would cross four times (2 flows per node direction on 1 NIC);
    # NCCL keeps each node's GPUs together: the ring 0 1 4 5, two crossings
    one_nic = fabric(nics=1)
    assert ring_time_s(one_nic, interleaved, 1e9) == ring_time_s(one_nic, two, 1e9)


def test_concurrent_rings_share_nics() -> None:
    fab = fabric(nics=1)
    rings = np.array([[0, 4], [1, 5], [2, 6], [3, 7]])
    alone = ring_time_s(fab, rings[0], 1e9)
    together = ring_times_s(fab, rings, 1e9)
    assert (together > alone).all()


def test_single_gpu_group_costs_nothing() -> None:
    assert ring_times_s(fabric(), np.array([[3]]), 1e9) == pytest.approx([0.0])


def test_ring_with_failed_link_raises() -> None:
    fab = with_failed(fabric(), [(5, 0)])
    with pytest.raises(InfeasibleError, match=r"5->0"):
        ring_time_s(fab, np.array([0, 1, 4, 5]), 1e9)


# ------------------------------------------------------------------ hierarchical
def test_hierarchical_matches_its_formula() -> None:
    fab = fabric(nics=4)  # 100 GB/s per node: 4 inter-node rings get 20 GB/s each
    group = np.arange(8)  # 2 nodes x 4 local GPUs
    size, local = 8e8, 4
    intra = 2 * (local - 1) / local * size / INTRA + 2 * (local - 1) * 5 * US
    inter = 2 * (2 - 1) / 2 * (size / local) / INTER + 2 * 1 * 10 * US
    assert hierarchical_times_s(fab, group[None, :], size)[0] == pytest.approx(intra + inter)


def test_hierarchical_beats_a_flat_ring_across_nodes() -> None:
    fab = fabric(nodes=4, gpus=8, nics=8)
    group = np.arange(32)[None, :]
    flat = ring_times_s(fab, group, 1e9)[0]
    hier = hierarchical_times_s(fab, group, 1e9)[0]
    assert hier < flat
    assert collective_times_s(fab, group, 1e9, algorithm="best")[0] == pytest.approx(hier)


def test_hierarchical_needs_equal_local_groups() -> None:
    fab = fabric()
    assert np.isinf(hierarchical_times_s(fab, np.array([[0, 1, 2, 4]]), 1e9)).all()
    assert collective_times_s(fab, np.array([[0, 1, 2, 4]]), 1e9, algorithm="best")[0] < np.inf


def test_local_group_size() -> None:
    fab = fabric()
    assert local_group_size(fab, np.array([[0, 1, 4, 5]])) == 2
    assert local_group_size(fab, np.array([[0, 4]])) == 1


def test_best_avoids_a_failed_link_that_another_algorithm_does_not_need() -> None:
    fab = with_failed(fabric(), [(1, 4)])  # the flat ring 0 1 4 5 needs 1->4
    group = np.array([[0, 1, 4, 5]])
    with pytest.raises(InfeasibleError, match=r"1->4"):
        collective_times_s(fab, group, 1e9, algorithm="ring")
    # the two-level algorithm uses 0<->1, 4<->5, then 0<->4 and 1<->5 rings: 1->4 is unused
    assert collective_times_s(fab, group, 1e9, algorithm="best")[0] > 0


def test_no_algorithm_left_raises_naming_the_pair() -> None:
    fab = with_failed(fabric(), [(0, 1), (1, 0)])
    with pytest.raises(InfeasibleError, match=r"0->1"):
        collective_times_s(fab, np.array([[0, 1]]), 1e9, algorithm="best")


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(0, 15), min_size=2, max_size=8, unique=True),
    st.floats(1e3, 1e10),
)
def test_ring_time_is_positive_and_grows_with_bytes(members: list[int], size: float) -> None:
    fab = fabric(nodes=4)
    ring = np.array(members)
    small, large = ring_time_s(fab, ring, size), ring_time_s(fab, ring, 2 * size)
    assert 0 < small < large
