"""The solver-agnostic checker: one feasible and one infeasible micro-case per family."""

from __future__ import annotations

import numpy as np
import pytest

from pipette_cp.checker import (
    assert_valid,
    check_memory_limit,
    check_no_failed_link,
    check_placement_bijection,
    check_plan,
    check_split_covers_layers,
    check_tp_within_node,
    communication_pairs,
)
from pipette_cp.errors import InfeasibleError
from pipette_cp.specs import Instance
from pipette_cp.specs.layouts import make_plan
from tests.conftest import small_instance


def _plan(instance: Instance, **kw: object):
    args = {
        "num_layers": instance.model.num_layers,
        "dp": 2,
        "pp": 2,
        "tp": 2,
        "micro_batch_size": 1,
    }
    args.update(kw)
    return make_plan(**args)  # type: ignore[arg-type]


def test_default_plan_is_valid(instance: Instance) -> None:
    plan = _plan(instance)
    assert check_plan(instance, plan) == []
    assert_valid(instance, plan)


def test_split_must_cover_every_layer_once(instance: Instance) -> None:
    assert check_split_covers_layers(instance, _plan(instance, layer_split=(4, 3)))[0].family == (
        "split_covers_layers"
    )
    assert check_split_covers_layers(instance, _plan(instance, layer_split=(8, 0)))
    assert not check_split_covers_layers(instance, _plan(instance, layer_split=(5, 3)))


def test_placement_must_be_a_bijection(instance: Instance) -> None:
    twice = ((0, 1), (0, 1), (4, 5), (6, 7))
    assert "more than one rank" in str(
        check_placement_bijection(instance, _plan(instance, placement=twice))[0]
    )
    outside = ((0, 1), (2, 3), (4, 5), (6, 99))
    assert "do not exist" in str(
        check_placement_bijection(instance, _plan(instance, placement=outside))[0]
    )


def test_tp_group_must_stay_inside_a_node(instance: Instance) -> None:
    spanning = ((3, 4), (0, 1), (2, 5), (6, 7))
    found = check_tp_within_node(instance, _plan(instance, placement=spanning))
    assert len(found) == 2 and "spans nodes [0, 1]" in found[0].message


def test_failed_link_on_pipeline_hop_is_caught() -> None:
    nodes = np.array([[0, 20e9, 20e9], [0, 0, 20e9], [20e9, 20e9, 0]], dtype=float)
    instance = small_instance(nodes=3, node_bandwidth=nodes)
    # stage 0 on node 1, stage 1 on node 0: the backward hop 1 -> 0 has failed.
    plan = make_plan(
        num_layers=8, dp=1, pp=2, tp=4, micro_batch_size=1, placement=((4, 5, 6, 7), (0, 1, 2, 3))
    )
    found = check_no_failed_link(instance, plan)
    assert found and "pp traffic" in found[0].message
    ok = make_plan(
        num_layers=8, dp=1, pp=2, tp=4, micro_batch_size=1, placement=((0, 1, 2, 3), (8, 9, 10, 11))
    )
    assert not check_no_failed_link(instance, ok)


def test_memory_limit_catches_a_plan_that_cannot_fit() -> None:
    instance = small_instance(gpu="v100-16gb", global_batch_size=64)
    big = instance.model.model_copy(
        update={"hidden_size": 8192, "num_attention_heads": 64, "ffn_hidden_size": 32768}
    )
    instance = instance.model_copy(update={"model": big})
    plan = make_plan(num_layers=8, dp=8, pp=1, tp=1, micro_batch_size=8)
    found = check_memory_limit(instance, plan)
    assert found and found[0].family == "memory_limit"
    with pytest.raises(InfeasibleError, match="memory_limit"):
        assert_valid(instance, plan)


def test_communication_pairs_follow_megatron_groups(instance: Instance) -> None:
    plan = _plan(instance, vpp=2)
    pairs = communication_pairs(plan, tied_embeddings=True)
    # tp-dp-pp: stage 0 = GPUs 0-3 (replica 0: 0,1; replica 1: 2,3), stage 1 = GPUs 4-7.
    assert (0, 4) in pairs["pp"] and (4, 0) in pairs["pp"] and (1, 5) in pairs["pp"]
    assert (0, 2) in pairs["dp"] and (5, 7) in pairs["dp"]
    assert (0, 1) in pairs["tp"] and (0, 2) not in pairs["tp"]
    assert (2, 6) in pairs["embedding"]


def _with_failed(a: int, b: int):
    instance = small_instance(nodes=2, gpus_per_node=2)
    matrix = instance.cluster.bandwidth_bytes_per_s.copy()
    matrix[a, b] = 0.0
    cluster = instance.cluster.model_copy(update={"bandwidth_bytes_per_s": matrix})
    return instance.model_copy(update={"cluster": cluster})


#: replicas on nodes 0, 1, 0, 1: NCCL's ring is 0 -> 1 -> 2 -> 3 -> 0 (each node's GPUs
#: together), not rank order's 0 -> 2 -> 1 -> 3 -> 0
INTERLEAVED = make_plan(num_layers=8, dp=4, pp=1, tp=1, micro_batch_size=1,
                        placement=((0,), (2,), (1,), (3,)))  # fmt: skip


def test_a_failed_pair_only_rank_order_would_take_is_not_used() -> None:
    """2 -> 1 is a rank-order link, not one of NCCL's ring: the flat ring runs."""
    from pipette_cp.cost.evaluator.evaluate import Evaluator

    instance = _with_failed(2, 1)
    assert Evaluator(instance, dp_algorithm="ring").iteration_time(INTERLEAVED) > 0
    assert not check_plan(instance, INTERLEAVED)
    pairs = communication_pairs(INTERLEAVED, False, None, 2)["dp"]
    assert (1, 2) in pairs and (0, 2) not in pairs


def test_checker_and_evaluator_agree_on_a_dp_ring_that_two_level_avoids() -> None:
    """NCCL's ring takes the failed 1 -> 2; the two-level all-reduce (intra-node 0-1 and
    2-3, inter-node 0-2 and 1-3) does not: runnable, but not as a flat ring."""
    from pipette_cp.cost.evaluator.evaluate import Evaluator

    instance = _with_failed(1, 2)
    assert Evaluator(instance).iteration_time(INTERLEAVED) > 0
    assert not check_plan(instance, INTERLEAVED)
    with pytest.raises(InfeasibleError):
        Evaluator(instance, dp_algorithm="ring").iteration_time(INTERLEAVED)
