"""NCCL's ring from a group's rank order: nodes in the order of their first rank, each
node's GPUs together in rank order."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pipette_cp.cost.network.nccl_rings import is_node_contiguous, nccl_rings

NODE_OF = np.arange(64) // 8  # eight nodes of eight GPUs


def _by_hand(ranked: list[int]) -> list[int]:
    """The rule spelled out: walk the ranks, group by node in the order first met."""
    nodes: dict[int, list[int]] = {}
    for gpu in ranked:
        nodes.setdefault(gpu // 8, []).append(gpu)
    return [g for members in nodes.values() for g in members]


@given(st.lists(st.permutations(range(64)).map(lambda p: p[:10]), min_size=1, max_size=4))
def test_every_ring_is_the_rule_applied_by_hand(groups) -> None:
    array = np.array(groups)
    out = nccl_rings(array, NODE_OF)
    assert out.tolist() == [_by_hand(g) for g in groups]
    assert is_node_contiguous(NODE_OF[out]).all()
    assert (is_node_contiguous(NODE_OF[array]) == (out == array).all(axis=1)).all()


def test_rank_order_is_kept_where_each_node_is_one_block() -> None:
    groups = np.array([[8, 9, 0, 1, 16], [0, 8, 16, 24, 32]])
    assert nccl_rings(groups, NODE_OF) is groups


def test_an_interleaved_group_is_regrouped_by_first_appearance() -> None:
    assert nccl_rings(np.array([[8, 0, 9, 16, 1]]), NODE_OF).tolist() == [[8, 9, 0, 1, 16]]
