"""Baselines megatron-default and random: registry, structure, seeds, failed links."""

from __future__ import annotations

import numpy as np
import pytest

from pipette_cp.checker.checks import CHECKS, check_no_failed_link
from pipette_cp.errors import LayoutError
from pipette_cp.solvers import METHODS, SolveOptions, get_method
from pipette_cp.solvers.baselines import random_placement
from pipette_cp.specs import Instance, Plan
from pipette_cp.specs.layouts import even_split, make_plan, megatron_placement
from tests.conftest import small_instance

STRUCTURAL = ("split_covers_layers", "split_contiguous", "placement_bijection", "tp_within_node")


def structural_violations(instance: Instance, plan: Plan, families=STRUCTURAL) -> list:
    return [v for family in families for v in CHECKS[family](instance, plan)]


def skeleton(dp: int = 2, pp: int = 2, tp: int = 2, layers: int = 8, **kw: object) -> Plan:
    return make_plan(num_layers=layers, dp=dp, pp=pp, tp=tp, micro_batch_size=1, **kw)  # type: ignore[arg-type]


def test_every_baseline_is_registered() -> None:
    for name in ("megatron-default", "pipette-sa", "amp", "random"):
        assert name in METHODS
        assert get_method(name) is METHODS[name]


def test_megatron_default_is_even_split_and_tp_dp_pp_rank_order() -> None:
    instance = small_instance(nodes=2, gpus_per_node=4, layers=10)
    sk = skeleton(dp=2, pp=2, tp=2, layers=10, layer_split=(7, 3), placement=((7, 6),) * 4)
    plan = METHODS["megatron-default"](instance, sk, SolveOptions())
    assert plan.layer_split == even_split(10, 2) == (5, 5)
    assert plan.placement == megatron_placement(2, 2, 2) == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert plan.solve_info is not None
    assert plan.solve_info.method == "megatron-default"
    assert plan.solve_info.status == "heuristic"
    assert plan.solve_info.objective is None
    assert structural_violations(instance, plan, (*STRUCTURAL, "no_failed_link")) == []


def test_megatron_default_keeps_the_skeleton_knobs() -> None:
    instance = small_instance(nodes=2, gpus_per_node=4, layers=8)
    sk = skeleton(dp=1, pp=2, tp=4, vpp=2, recompute="selective", sequence_parallel=True)
    plan = METHODS["megatron-default"](instance, sk, SolveOptions())
    assert (plan.vpp, plan.recompute, plan.sequence_parallel) == (2, "selective", True)
    assert plan.layer_split == (2, 2, 2, 2)
    assert structural_violations(instance, plan) == []


def test_megatron_default_refuses_tp_across_nodes_and_too_many_gpus() -> None:
    instance = small_instance(nodes=2, gpus_per_node=4)
    with pytest.raises(LayoutError, match="tp=8 does not divide gpus_per_node=4"):
        METHODS["megatron-default"](instance, skeleton(dp=1, pp=1, tp=8), SolveOptions())
    with pytest.raises(LayoutError, match="exceeds the 8 GPUs"):
        METHODS["megatron-default"](instance, skeleton(dp=4, pp=2, tp=2), SolveOptions())


def test_megatron_default_ignores_failed_links() -> None:
    nodes = np.array([[0, 0, 20e9], [0, 0, 20e9], [20e9, 20e9, 0]])
    instance = small_instance(nodes=3, gpus_per_node=4, node_bandwidth=nodes)
    plan = METHODS["megatron-default"](instance, skeleton(dp=1, pp=2, tp=4), SolveOptions())
    assert plan.placement == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert check_no_failed_link(instance, plan)  # node 0 -> node 1 has failed


@pytest.mark.parametrize("dims", [(2, 2, 2), (4, 2, 1), (1, 2, 4), (1, 1, 2), (2, 1, 3)])
def test_random_is_structurally_valid(dims: tuple[int, int, int]) -> None:
    dp, pp, tp = dims
    gpus_per_node = 6 if tp == 3 else 4
    instance = small_instance(nodes=2, gpus_per_node=gpus_per_node)
    for seed in range(5):
        plan = METHODS["random"](instance, skeleton(dp=dp, pp=pp, tp=tp), SolveOptions(seed=seed))
        assert structural_violations(instance, plan, (*STRUCTURAL, "no_failed_link")) == []
        assert plan.layer_split == even_split(8, pp)
        assert plan.solve_info is not None and plan.solve_info.method == "random"


def test_random_same_seed_same_plan_other_seed_other_plan() -> None:
    instance = small_instance(nodes=4, gpus_per_node=4)
    sk = skeleton(dp=4, pp=2, tp=2)
    one = METHODS["random"](instance, sk, SolveOptions(seed=3))
    two = METHODS["random"](instance, sk, SolveOptions(seed=3))
    other = METHODS["random"](instance, sk, SolveOptions(seed=4))
    assert one.placement == two.placement
    assert one.placement != other.placement


def test_random_avoids_failed_links_when_it_can() -> None:
    # Node 0 <-> node 1 failed both ways: half the pp=2 placements use it.
    nodes = np.full((3, 3), 20e9)
    nodes[0, 1] = nodes[1, 0] = 0.0
    instance = small_instance(nodes=3, gpus_per_node=4, node_bandwidth=nodes)
    for seed in range(10):
        plan = METHODS["random"](instance, skeleton(dp=1, pp=2, tp=4), SolveOptions(seed=seed))
        assert check_no_failed_link(instance, plan) == []


def test_random_placement_covers_every_placement() -> None:
    # 2 nodes x 2 GPUs, dp=2, pp=1, tp=1: 4! = 24 placements, each reachable.
    instance = small_instance(nodes=2, gpus_per_node=2)
    import random

    rng = random.Random(0)
    seen = {random_placement(instance.cluster, 4, 1, 1, rng) for _ in range(2000)}
    assert len(seen) == 24
