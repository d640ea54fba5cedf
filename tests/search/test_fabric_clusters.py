"""A cluster given as switch levels plus exceptions prices, checks and searches exactly
as its dense twin (the same links as a GPU x GPU matrix), without building the matrix."""

from __future__ import annotations

from itertools import permutations

import numpy as np
import pytest

from pipette_cp.checker import check_plan
from pipette_cp.clusters.generators.fat_tree import fat_tree, fat_tree_cluster
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.cost.evaluator.layout_rules import placement_array
from pipette_cp.errors import InfeasibleError, SpecError
from pipette_cp.io.model_file import load_model
from pipette_cp.search.loop import search
from pipette_cp.search.options import SearchOptions
from pipette_cp.solvers import methods
from pipette_cp.solvers.baselines import greedy as greedy_module
from pipette_cp.solvers.options import SolveOptions
from pipette_cp.solvers.placement.repair import placement_excess, repair_placement, repair_units
from pipette_cp.specs import (
    ClusterSpec,
    Instance,
    SearchSpace,
    TrainingSpec,
    resolve_gpu,
    validate_spec,
)
from pipette_cp.specs.hierarchy import HierarchicalFabric, LinkView
from pipette_cp.specs.layouts import make_plan

GB = 1e9


def fabric(**extra: object) -> HierarchicalFabric:
    """8 nodes x 4 GPUs in leaves of 2 nodes, one latency outside a node (as a dense
    cluster has), a slow NIC, degraded and failed node and GPU pairs."""
    fields: dict = {
        "num_nodes": 8, "gpus_per_node": 4, "nvlink_bandwidth_bytes_per_s": 300 * GB,
        "nvlink_latency_s": 5e-6,
        "levels": [
            {"name": "leaf", "nodes": 2, "bandwidth_bytes_per_s": 40 * GB, "latency_s": 1e-5},
            {"name": "spine", "nodes": 8, "bandwidth_bytes_per_s": 30 * GB, "latency_s": 1e-5},
        ],
        "slow_nics": {"node": [3], "nic_factor": [0.5]},
        "node_pairs": {"src": [0, 6, 2], "dst": [5, 7, 4], "bandwidth_bytes_per_s": [0.0, 60 * GB, 9 * GB]},
        "gpu_pairs": {"src": [1, 8, 20], "dst": [2, 30, 5], "bandwidth_bytes_per_s": [100 * GB, 5 * GB, 0.0]},
    }  # fmt: skip
    return validate_spec(HierarchicalFabric, {**fields, **extra}, "fabric")


def twins(f: HierarchicalFabric) -> tuple[ClusterSpec, ClusterSpec]:
    """The cluster on the fabric, and the same cluster with the fabric's dense matrix."""
    nodes, gpu = f.num_nodes, resolve_gpu("a100")
    common: dict = {
        "num_nodes": nodes, "gpus_per_node": f.gpus_per_node,
        "gpu_types": {gpu.name: gpu}, "node_gpu_types": [gpu.name] * nodes, "node_names": [f"n{k}" for k in range(nodes)],
        "nics_per_node": 2, "nic_bandwidth_bytes_per_s": 25 * GB,
        "intra_node_latency_s": 5e-6, "inter_node_latency_s": 1e-5,
    }  # fmt: skip
    tree = validate_spec(ClusterSpec, {**common, "fabric": f}, "cluster")
    dense = validate_spec(ClusterSpec, {**common, "bandwidth_bytes_per_s": f.dense()}, "cluster")
    return tree, dense


def instance(cluster: ClusterSpec, **space: object) -> Instance:
    return Instance(
        name="tree", model=load_model("gpt3-1.3b"), cluster=cluster,
        training=TrainingSpec(global_batch_size=64, seq_length=2048),
        search_space=SearchSpace(**space),
    )  # fmt: skip


def test_a_link_view_indexes_as_the_matrix() -> None:
    f = fabric()
    view, dense = LinkView(f), f.dense()
    ids = np.array([0, 3, 5, 9, 21, 30])
    assert view.shape == dense.shape and len(view) == 32
    for key in [(np.ix_(ids, ids)), (slice(0, 8), slice(4, 12)), (ids, ids[::-1]), (2, 3),
                (ids[:, None], ids), (3, slice(None)), (slice(None), 3), (ids, slice(None)),
                (slice(None), ids), (ids.reshape(2, 3), 5)]:  # fmt: skip
        assert np.array_equal(view[key], dense[key]), key
    assert np.array_equal(np.asarray(view), dense)


def test_node_sums_and_bounds_match_the_matrix() -> None:
    for f in (fabric(), fat_tree(1024, seed=2, leaf_nodes=4, pod_leaves=4, slow_nic_rate=0.1,
                                 degraded_pair_rate=0.05, failed_pair_rate=0.01)):  # fmt: skip
        dense, n, g = f.dense(), f.num_nodes, f.gpus_per_node
        blocks = dense.reshape(n, g, n, g).mean(axis=(1, 3))
        np.fill_diagonal(blocks, 0.0)
        sent, received = f.node_bandwidth_sums()
        assert np.allclose(sent, blocks.sum(axis=1)) and np.allclose(received, blocks.sum(axis=0))
        bounds = f.gpu_bounds()
        assert (bounds >= np.minimum(dense.max(axis=1), dense.max(axis=0))).all()


def test_the_cluster_answers_as_its_dense_twin() -> None:
    tree, dense = twins(fabric())
    assert tree.is_hierarchical and not dense.is_hierarchical
    assert tree.failed_pairs() == dense.failed_pairs() and tree.has_failed_pairs
    assert tree.fastest_link_bytes_per_s() == dense.fastest_link_bytes_per_s()
    src, dst = np.arange(32), np.roll(np.arange(32), 5)
    assert np.array_equal(tree.pair_failed(src, dst), dense.pair_failed(src, dst))
    assert tree == tree.model_copy() and tree != dense and hash(tree) == hash(tree.model_copy())


@pytest.mark.parametrize("seed", range(4))
def test_plans_cost_the_same_on_both(seed: int) -> None:
    tree, dense = twins(fabric())
    rng = np.random.default_rng(seed)
    for dp, pp, tp in ((4, 2, 4), (8, 2, 2), (2, 4, 4), (16, 2, 1)):
        plan = make_plan(num_layers=24, dp=dp, pp=pp, tp=tp, micro_batch_size=1)
        placed = plan  # Megatron's rank order
        perm = rng.permutation(32)
        moved = placed.model_copy(update={"placement": tuple(
            tuple(int(perm[g]) for g in unit) for unit in placed.placement)})  # fmt: skip
        for p in (placed, moved):
            times = []
            for cluster in (tree, dense):
                inst = instance(cluster)
                try:
                    times.append(Evaluator(inst).evaluate(p).iteration_time_s)
                except Exception as error:  # a failed pair: both must refuse alike
                    times.append(str(error))
                times.append(sorted(v.family for v in check_plan(inst, p)))
            assert times[0] == times[2] and times[1] == times[3], (dp, pp, tp)


#: greedy finishes its 696 layouts within the wall-clock budget; cpsat does not, so it runs
#: on a work budget (the same work, hence the same plans, on both twins whatever the load)
TWIN_OPTIONS = {
    "greedy": SearchOptions(method="greedy", time_limit_s=30, top_k=3),
    "cpsat": SearchOptions(method="cpsat", time_limit_s=4, top_k=3, deterministic=True),
}


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(TWIN_OPTIONS))
def test_the_search_returns_the_dense_twins_plans(method: str) -> None:
    tree, dense = twins(fabric(gpu_pairs={"src": [], "dst": [], "bandwidth_bytes_per_s": []}))
    found = []
    for cluster in (tree, dense):
        result = search(instance(cluster, tp=(2, 4), pp=(1, 2)), TWIN_OPTIONS[method])
        found.append([(p.layout(), p.placement, p.evaluation.iteration_time_s)
                      for p in result.plans])  # fmt: skip
    assert found[0] == found[1] and found[0]


@pytest.mark.slow
def test_generated_clusters_of_any_size() -> None:
    c = fat_tree_cluster(100_000, leaf_nodes=25, pod_leaves=20)
    assert c.num_gpus == 100_000 and c.bandwidth_bytes_per_s is None
    assert c.links[0, 8] == pytest.approx(46 * GB, rel=0.6)


@pytest.mark.parametrize(
    ("update", "message"),
    [
        ({"bandwidth_bytes_per_s": np.zeros((32, 32))}, "give exactly one of"),
        ({"fabric": None}, "give exactly one of"),
        ({"num_nodes": 4, "node_gpu_types": ["A100-SXM4-80GB"] * 4, "node_names": list("abcd")},
         "fabric.num_nodes=8 but the cluster's num_nodes is 4"),
    ],
)  # fmt: skip
def test_bad_hierarchical_clusters_are_one_line(update, message) -> None:
    tree, _ = twins(fabric())
    data = {**tree.model_dump(), **update}
    with pytest.raises(SpecError, match=message):
        validate_spec(ClusterSpec, data, "cluster")


def test_an_isolated_node_is_refused() -> None:
    others = [k for k in range(8) if k != 2]
    cut = fabric(node_pairs={"src": [2] * 7, "dst": others, "bandwidth_bytes_per_s": [0.0] * 7})
    with pytest.raises(SpecError, match=r"node 2 \(n2\) has every outgoing inter-node link failed"):
        twins(cut)


def degraded_tree(seed: int) -> HierarchicalFabric:
    """16 nodes x 2 GPUs, a 20 % sprinkle of degraded node pairs (a quarter failed)."""
    rng = np.random.default_rng(seed)
    pairs = [(a, b) for a in range(16) for b in range(16) if a != b and rng.random() < 0.2]
    bw = [0.0 if rng.random() < 0.25 else 10 * GB for _ in pairs]
    return fabric(
        num_nodes=16, gpus_per_node=2, slow_nics={"node": [], "nic_factor": []},
        levels=[{"name": "leaf", "nodes": 4, "bandwidth_bytes_per_s": 40 * GB, "latency_s": 1e-5},
                {"name": "spine", "nodes": 16, "bandwidth_bytes_per_s": 30 * GB,
                 "latency_s": 1e-5}],
        node_pairs={"src": [a for a, _ in pairs], "dst": [b for _, b in pairs],
                    "bandwidth_bytes_per_s": bw},
        gpu_pairs={"src": [], "dst": [], "bandwidth_bytes_per_s": []},
    )  # fmt: skip


@pytest.mark.parametrize("seed", range(6))
def test_the_repair_moves_groups_off_exceptions_and_never_slows(seed: int) -> None:
    tree, _ = twins(degraded_tree(seed))
    inst = instance(tree)
    plan = make_plan(num_layers=24, dp=4, pp=4, tp=2, micro_batch_size=1)
    units, before, after = repair_units(inst, plan, seed)
    start = placement_array(plan)
    assert after <= before
    # whole tensor groups moved between positions
    assert sorted(map(tuple, units.reshape(-1, 2))) == sorted(map(tuple, start.reshape(-1, 2)))
    repaired = repair_placement(inst, plan)
    ev = Evaluator(inst)
    try:
        base = ev.iteration_time(plan)
    except InfeasibleError:
        base = np.inf  # Megatron's order crosses a failed pair
    if repaired == plan and base == np.inf:  # nothing found that avoids every failed pair
        assert after > 0
        return
    assert ev.iteration_time(repaired) <= base
    assert not check_plan(inst, repaired.model_copy(update={"evaluation": ev.evaluate(repaired)}))


@pytest.mark.parametrize("seed", range(3))
def test_the_excess_as_given_is_what_the_repair_starts_from(seed: int) -> None:
    tree, _ = twins(degraded_tree(seed))
    inst = instance(tree)
    plan = make_plan(num_layers=24, dp=4, pp=2, tp=2, micro_batch_size=1)
    units = np.random.default_rng(seed).permutation(placement_array(plan).reshape(-1, 2))
    moved = plan.model_copy(update={"placement": tuple(tuple(int(g) for g in u) for u in units)})
    assert placement_excess(inst, moved) == repair_units(inst, moved, 0)[1]


@pytest.mark.parametrize("seed", range(4))
def test_the_repair_reaches_the_least_excess_of_every_ordering(seed: int) -> None:
    """Brute force over every ordering of each stage's groups (4! x 4! for 2 stages)."""
    tree, _ = twins(degraded_tree(seed))
    inst = instance(tree)
    plan = make_plan(num_layers=24, dp=4, pp=2, tp=2, micro_batch_size=1)
    start = placement_array(plan)
    best = np.inf
    for p0 in permutations(range(4)):
        for p1 in permutations(range(4)):
            units = np.stack([start[0][list(p0)], start[1][list(p1)]])
            moved = plan.model_copy(update={"placement": tuple(
                tuple(int(g) for g in u) for u in units.reshape(-1, 2))})  # fmt: skip
            best = min(best, placement_excess(inst, moved))  # its excess as given
    assert repair_units(inst, plan, seed)[2] <= best + 1e-15 or best == 0.0


@pytest.mark.slow
def test_beyond_the_masters_the_search_repairs(monkeypatch) -> None:
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[1].layout())
        return repair_placement(*args, **kwargs)

    for module in (methods, greedy_module):
        monkeypatch.setattr(module, "MAX_MASTER_PLACES", 4)
        monkeypatch.setattr(module, "repair_placement", counted)
    tree, _ = twins(degraded_tree(1))
    inst = instance(tree, tp=(2,), pp=(2, 4))
    result = search(
        inst, SearchOptions(method="cpsat", time_limit_s=4, top_k=3, deterministic=True)
    )
    assert result.plans and calls
    for plan in result.plans:  # no master ran: no bound is claimed
        assert not check_plan(inst, plan) and plan.solve_info.bound is None


def test_context_and_expert_groups_are_placed_on_a_fabric() -> None:
    """cp, ep and etp on a fabric cluster: the group families' worst case comes from the
    fabric's own bound (it compared the link view with 0 and crashed), which is no above
    any working pair's bandwidth; the plan checks and costs as on the dense twin."""
    tree, dense = twins(fabric())
    assert tree.fabric is not None
    working = dense.bandwidth_bytes_per_s[dense.bandwidth_bytes_per_s > 0]
    assert tree.fabric.slowest_working_bytes_per_s() <= working.min()
    moe = load_model("tiny-gpt").model_copy(update={"name": "tiny-moe", "num_experts": 8,
                                                    "moe_top_k": 2})  # fmt: skip
    skeleton = make_plan(num_layers=moe.num_layers, dp=4, pp=2, tp=2, cp=2, ep=2, etp=1,
                         micro_batch_size=1, sequence_parallel=True)  # fmt: skip
    times = []
    for cluster in (tree, dense):
        inst = instance(cluster).model_copy(update={"model": moe})
        plan = methods.cpsat(inst, skeleton, SolveOptions(time_limit_s=30, deterministic=True))
        assert check_plan(inst, plan) == []
        times.append(Evaluator(inst).evaluate(plan).iteration_time_s)
        if cluster is tree:
            on_dense = Evaluator(instance(dense).model_copy(update={"model": moe}))
            assert on_dense.evaluate(plan).iteration_time_s == pytest.approx(times[0], rel=1e-9)
