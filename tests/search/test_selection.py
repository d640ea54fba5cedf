"""Choosing the GPUs: world sizes below the cluster, excluded nodes, idle nodes named,
the throughput-per-GPU objective and launch files on the used hosts only."""

from __future__ import annotations

import numpy as np
import pytest

from pipette_cp.checker import check_plan
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.errors import LayoutError, SpecError
from pipette_cp.report.launch import write_launch_files
from pipette_cp.search.loop import search
from pipette_cp.search.options import SearchOptions
from pipette_cp.search.selection import idle_nodes, lift, restrict
from pipette_cp.solvers.methods import exact_placement
from pipette_cp.solvers.options import SolveOptions
from pipette_cp.solvers.placement.oracle import brute_force_placement
from pipette_cp.specs import Instance, SearchSpace
from pipette_cp.specs.layouts import make_plan
from pipette_cp.specs.selection import default_idle_nodes, excluded_nodes, gpu_totals
from tests.conftest import small_instance


def _space(instance: Instance, **fields: object) -> Instance:
    return instance.model_copy(update={"search_space": SearchSpace(**fields)})


def _slow_nic_instance(nodes: int = 3, slow: int = 1, factor: float = 0.01) -> Instance:
    """``nodes`` x 4 A100; every link of node ``slow`` at ``factor`` x the others."""
    m = np.full((nodes, nodes), 20e9)
    m[slow, :] *= factor
    m[:, slow] *= factor
    np.fill_diagonal(m, 0.0)
    return small_instance(nodes=nodes, gpus_per_node=4, node_bandwidth=m, global_batch_size=32)


@pytest.mark.parametrize(
    ("nodes", "fields", "expected"),
    [
        (17, {}, [136, 128, 120]),
        (17, {"use_all_gpus": True}, [136]),
        (17, {"min_gpus": 100}, [136, 128, 120, 112, 104]),
        (2, {}, [16, 8]),
        (1, {}, [8]),
        (64, {}, [512, 504, 496, 488, 480]),
        (3, {"use_all_gpus": False}, [24, 23, 22, 21, 20, 19, 18, 17, 16]),
    ],
)
def test_gpu_totals(nodes, fields, expected) -> None:
    instance = small_instance(nodes=max(nodes, 2), gpus_per_node=8)
    if nodes == 1:  # the conftest builder needs two nodes: take one away
        instance = _space(instance, exclude_nodes=(instance.cluster.node_names[1],))
        instance, _ = restrict(instance)
    elif nodes != 2:
        m = np.full((nodes, nodes), 20e9)
        np.fill_diagonal(m, 0.0)
        instance = small_instance(nodes=nodes, gpus_per_node=8, node_bandwidth=m)
    assert gpu_totals(instance.cluster, SearchSpace(**fields)) == expected


def test_default_idle_nodes_is_a_few_and_never_all() -> None:
    assert [default_idle_nodes(n) for n in (1, 2, 8, 17, 32, 512)] == [0, 1, 1, 2, 4, 4]


def test_excluded_nodes_by_name_and_bad_names() -> None:
    instance = small_instance(nodes=3)
    names = instance.cluster.node_names
    assert excluded_nodes(instance.cluster, SearchSpace(exclude_nodes=(names[2], names[0]))) == (
        0,
        2,
    )
    with pytest.raises(SpecError, match="exclude_nodes='nope': no node of that name"):
        excluded_nodes(instance.cluster, SearchSpace(exclude_nodes=("nope",)))
    with pytest.raises(SpecError, match="excludes all 3 nodes"):
        excluded_nodes(instance.cluster, SearchSpace(exclude_nodes=names))
    with pytest.raises(SpecError, match="min_gpus=9: above the 8 GPUs of the 2 nodes"):
        gpu_totals(instance.cluster, SearchSpace(exclude_nodes=(names[0],), min_gpus=9))


@pytest.mark.slow
def test_search_leaves_the_slow_node_idle_and_says_why() -> None:
    instance = _slow_nic_instance()
    result = search(instance, SearchOptions(time_limit_s=8, seed=0))
    best = result.plans[0]
    used_nodes = {g // 4 for unit in best.placement for g in unit}
    assert 1 not in used_nodes and best.num_gpus == 8
    assert not check_plan(instance, best)
    idle = idle_nodes(instance, best, result.stats.best_by_gpus, result.stats.bound_by_gpus)
    assert idle.names == (instance.cluster.node_names[1],)
    # the claim under the table: the plan on all 12 GPUs is really slower (by its number)
    text = idle.describe(best.evaluation.iteration_time_s)
    assert instance.cluster.node_names[1] in text and "% slower" in text
    all_gpus = search(
        _space(instance, use_all_gpus=True), SearchOptions(time_limit_s=8, seed=0)
    ).plans[0]
    assert all_gpus.num_gpus == 12
    assert all_gpus.evaluation.iteration_time_s > best.evaluation.iteration_time_s


@pytest.mark.slow
def test_excluded_node_holds_no_rank_and_the_checker_agrees() -> None:
    instance = _slow_nic_instance(slow=0, factor=1.0)  # uniform: only the exclusion decides
    name = instance.cluster.node_names[2]
    excluded = _space(instance, exclude_nodes=(name,))
    result = search(excluded, SearchOptions(time_limit_s=6, seed=0))
    for plan in result.plans:
        assert all(g // 4 != 2 for unit in plan.placement for g in unit)
        assert not check_plan(excluded, plan)
        assert plan.num_gpus <= 8
    # a plan on the excluded node is refused by the evaluator's checks, naming the node
    on_it = make_plan(
        num_layers=8, dp=1, pp=1, tp=4, micro_batch_size=1, placement=((8, 9, 10, 11),)
    )
    with pytest.raises(LayoutError, match=f"is on node {name}, which search_space.exclude_nodes"):
        Evaluator(excluded).evaluate(on_it)


def test_restrict_and_lift_keep_every_time() -> None:
    instance = _slow_nic_instance(nodes=3, slow=1, factor=0.3)
    sub, gpus = restrict(_space(instance, exclude_nodes=(instance.cluster.node_names[0],)))
    assert sub.cluster.num_nodes == 2 and list(gpus) == list(range(4, 12))
    plan = make_plan(num_layers=8, dp=2, pp=2, tp=2, micro_batch_size=1)
    lifted = lift(plan, gpus)
    assert Evaluator(sub).iteration_time(plan) == pytest.approx(
        Evaluator(instance).iteration_time(lifted), rel=1e-12
    )


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["cpsat", "milp"])
@pytest.mark.parametrize(("dp", "pp", "tp"), [(1, 2, 2), (2, 2, 1), (1, 4, 1), (2, 1, 2)])
def test_subset_placement_optimal_claims_match_the_oracle(backend, dp, pp, tp) -> None:
    """Fewer units than blocks: the placement chooses which nodes hold them (k of n)."""
    instance = _slow_nic_instance(nodes=3, slow=2, factor=0.2)
    instance = _space(instance, use_all_gpus=False)
    plan = make_plan(num_layers=8, dp=dp, pp=pp, tp=tp, micro_batch_size=1)
    solved = exact_placement(instance, plan, SolveOptions(time_limit_s=20), backend=backend)
    _, best = brute_force_placement(instance, plan)
    info = solved.solve_info
    assert info.objective >= best * (1 - 1e-9)
    if info.bound is not None:
        assert info.bound <= best * (1 + 1e-9)
    if info.status == "optimal":
        assert info.objective == pytest.approx(best, rel=1e-6)


@pytest.mark.slow
def test_throughput_per_gpu_objective_weighs_gpus() -> None:
    instance = _slow_nic_instance(slow=0, factor=1.0)
    by_time = search(instance, SearchOptions(time_limit_s=6, seed=0)).plans[0]
    per_gpu = search(
        _space(instance, objective="throughput-per-gpu"), SearchOptions(time_limit_s=6, seed=0)
    )
    best = per_gpu.plans[0]
    cost = [p.evaluation.iteration_time_s * p.num_gpus for p in per_gpu.plans]
    assert cost == sorted(cost)
    assert cost[0] <= by_time.evaluation.iteration_time_s * by_time.num_gpus * (1 + 1e-9)
    assert best.evaluation.iteration_time_s >= by_time.evaluation.iteration_time_s * (1 - 1e-9)


@pytest.mark.slow
def test_launch_files_list_only_the_used_hosts(tmp_path) -> None:
    instance = _slow_nic_instance()
    plan = search(instance, SearchOptions(time_limit_s=6, seed=0)).plans[0]
    write_launch_files(instance, plan, tmp_path)
    hosts = set((tmp_path / "slurm_hostfile").read_text().split())
    used = {instance.cluster.node_names[g // 4] for unit in plan.placement for g in unit}
    assert hosts == used and instance.cluster.node_names[1] not in hosts
