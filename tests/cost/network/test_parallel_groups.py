"""Context-parallel rings and expert groups on the placement: positions, times, search.

Oracles: Megatron's rank formulas written out with divmod (positions), a per-pair
loop over the bandwidth matrix (all-to-all), the checker's own pair sets.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipette_cp.checker.checks import communication_pairs
from pipette_cp.clusters.expand import cluster_from_node_matrix
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.cost.network import collectives as comm
from pipette_cp.cost.network.parallel_groups import (
    alltoall_times_s,
    cp_ring_bandwidths,
    group_flows,
)
from pipette_cp.cost.workload.tokens import dispatch_bytes, moe_layers_by_chunk
from pipette_cp.errors import InfeasibleError, LayoutError
from pipette_cp.search.options import SearchOptions
from pipette_cp.search.space import enumerate_layouts
from pipette_cp.specs import Instance, ModelSpec, TrainingSpec, resolve_gpu
from pipette_cp.specs.layouts import make_plan
from tests.conftest import ROOT

GB = 1e9


def _moe_model(**extra: object) -> ModelSpec:
    fields = dict(
        name="tiny-moe", num_layers=4, hidden_size=256, num_attention_heads=8,
        ffn_hidden_size=1024, vocab_size=1000, max_seq_length=2048, num_experts=8,
        moe_top_k=2, moe_ffn_hidden_size=512,
    )  # fmt: skip
    return ModelSpec(**{**fields, **extra})


def _cluster(nodes: int = 2, gpus: int = 4, inter: float = 20 * GB, intra: float = 200 * GB):
    matrix = np.full((nodes, nodes), inter)
    return cluster_from_node_matrix(
        node_bandwidth=matrix, intra_node=intra, gpus_per_node=gpus, gpu=resolve_gpu("h100"),
        nics_per_node=1, nic_bandwidth_bytes_per_s=25 * GB,
    )  # fmt: skip


def _instance(model: ModelSpec, cluster=None, seq: int = 1024, gbs: int = 16) -> Instance:
    return Instance(
        name="t", model=model, cluster=cluster or _cluster(),
        training=TrainingSpec(global_batch_size=gbs, seq_length=seq),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("dp", "pp", "tp", "cp", "ep", "etp"),
    [(2, 1, 2, 2, 4, None), (4, 2, 1, 1, 2, None), (2, 1, 2, 1, 4, 1), (1, 2, 2, 2, 2, 2)],
)
def test_group_positions_follow_megatron_rank_formulas(dp, pp, tp, cp, ep, etp):
    plan = make_plan(num_layers=4, dp=dp, pp=pp, tp=tp, cp=cp, ep=ep, etp=etp,
                     micro_batch_size=1, sequence_parallel=tp > 1)  # fmt: skip
    etp_ = tp if etp is None else etp
    local = tp * cp * dp
    # CP ring: ranks t + tp (c + cp d) for c = 0..cp-1, in that order
    want_cp = sorted(
        tuple(t + tp * (c + cp * d) for c in range(cp)) for d in range(dp) for t in range(tp)
    )
    assert sorted(map(tuple, plan.cp_groups())) == want_cp
    # EP group: the stage-local ranks with the same (rank % etp, rank // (ep etp))
    groups: dict[tuple[int, int], list[int]] = {}
    for r in range(local):
        groups.setdefault((r % etp_, r // (ep * etp_)), []).append(r)
    assert sorted(map(tuple, plan.expert_groups())) == sorted(map(tuple, groups.values()))
    f = group_flows(plan)
    # every ordered pair of every group of every stage, once
    pairs = {(int(a), int(b)) for a, b in zip(f.ep_src.ravel(), f.ep_dst.ravel(), strict=True)}
    want = {
        (s * local + a, s * local + b)
        for s in range(pp) for g in groups.values() for a, b in itertools.permutations(g, 2)
    }  # fmt: skip
    assert pairs == want and f.ep_src.size == len(want)
    # expert data-parallel rings: the ranks with the same (etp rank, ep rank)
    rings = {tuple(sorted(int(x) for x in ring)) for ring in f.edp_rings}
    want_rings = {
        tuple(s * local + r for r in range(local) if (r % (ep * etp_)) == k)
        for s in range(pp) for k in range(ep * etp_)
    }  # fmt: skip
    assert rings == want_rings


@pytest.mark.parametrize("per_pair", [True, False])
def test_alltoall_time_matches_a_per_pair_loop(per_pair):
    """Random bandwidth per GPU pair (costed pairwise) or per node pair (costed per node
    pair, :mod:`pipette_cp.cost.network.alltoall_nodes`)."""
    cluster = _cluster(nodes=2, gpus=4)
    rng = np.random.default_rng(3)
    bw = cluster.bandwidth_bytes_per_s.copy()
    if per_pair:
        bw *= rng.uniform(0.5, 1.0, bw.shape)
    else:  # one factor per node pair, NVLink pairs included
        bw *= np.kron(rng.uniform(0.5, 1.0, (2, 2)), np.ones((4, 4)))
    bw = np.minimum(bw, bw.T)
    np.fill_diagonal(bw, 0)
    cluster = cluster.model_copy(update={"bandwidth_bytes_per_s": bw})
    fabric = comm.Fabric.from_cluster(cluster)
    plan = make_plan(num_layers=4, dp=8, pp=1, tp=1, ep=8, micro_batch_size=1)
    perm = rng.permutation(8)
    flat = perm.astype(np.int64)
    nbytes = 1e6
    got = alltoall_times_s(fabric, flat, group_flows(plan), nbytes)
    # oracle: a rank's NVLink sends one after another, its NIC sends at once, each
    # NIC flow at min(B, NIC / flows leaving or entering that node)
    node = np.arange(8) // 4
    out_flows = np.zeros(2)
    for i, j in itertools.permutations(range(8), 2):
        if node[perm[i]] != node[perm[j]]:
            out_flows[node[perm[i]]] += 1
    cap = cluster.nics_per_node * cluster.nic_bandwidth_bytes_per_s
    worst = 0.0
    for i in range(8):
        serial, parallel, lat = 0.0, 0.0, 0.0
        for j in range(8):
            if i == j:
                continue
            a, b = perm[i], perm[j]
            if node[a] == node[b]:
                serial += nbytes / bw[a, b]
                lat = max(lat, cluster.intra_node_latency_s)
            else:
                share = cap / max(out_flows[node[a]], out_flows[node[b]])
                parallel = max(parallel, nbytes / min(bw[a, b], share))
                lat = max(lat, cluster.inter_node_latency_s)
        worst = max(worst, max(serial, parallel) + lat)
    assert got.shape == (1,)
    assert got[0] == pytest.approx(worst, rel=1e-12)


def test_expert_groups_inside_a_node_beat_groups_across_nodes():
    inst = _instance(_moe_model(), gbs=16)
    ev = Evaluator(inst)
    inside = make_plan(num_layers=4, dp=8, pp=1, tp=1, ep=4, micro_batch_size=1)
    # the same layout with every expert group split over both nodes
    across_units = tuple((g,) for g in (0, 4, 1, 5, 2, 6, 3, 7))
    across = inside.model_copy(update={"placement": across_units})
    a, b = ev.evaluate(inside), ev.evaluate(across)
    assert a.breakdown_s.ep_comm < b.breakdown_s.ep_comm
    assert a.iteration_time_s < b.iteration_time_s
    assert sum(s for _, s in a.breakdown_s.items()) == pytest.approx(a.iteration_time_s)
    assert sum(s for _, s in b.breakdown_s.items()) == pytest.approx(b.iteration_time_s)


def test_alltoall_time_lands_on_the_stages_with_moe_layers_only():
    model = _moe_model(first_k_dense_layers=2)  # layers 2, 3 have experts
    plan = make_plan(num_layers=4, dp=8, pp=2, tp=1, ep=4, micro_batch_size=1)
    plan = plan.model_copy(update={"layer_split": (2, 2), "dp": 4,
                                   "placement": plan.placement[:8]})  # fmt: skip
    assert moe_layers_by_chunk(model, plan).tolist() == [0.0, 2.0]
    inst = _instance(model)
    ev = Evaluator(inst)
    x, _ = ev.pipeline_inputs(plan)
    dense_twin = Evaluator(_instance(model)).pipeline_inputs(plan.model_copy(update={"ep": 1}))[0]
    # stage 0 has no MoE layer: its times do not depend on ep's all-to-all
    groups = group_flows(plan)
    flat = np.array([g for unit in plan.placement for g in unit])
    a2a = alltoall_times_s(ev.fabric, flat, groups, dispatch_bytes(model, inst.training, plan))
    assert a2a[0] > 0 and a2a[1] > 0
    # stage 0 has no MoE layer: ep and its all-to-alls leave its times alone
    assert x.forward_s[0] == pytest.approx(dense_twin.forward_s[0], rel=1e-12)
    assert x.backward_s[0] == pytest.approx(dense_twin.backward_s[0], rel=1e-12)


def test_cp_ring_runs_at_its_slowest_link_and_failed_pairs_are_refused():
    cluster = _cluster(nodes=2, gpus=4)
    bw = cluster.bandwidth_bytes_per_s.copy()
    bw[0, 1] = bw[1, 0] = 5 * GB  # one slow pair inside node 0
    slow = cluster.model_copy(update={"bandwidth_bytes_per_s": bw})
    fabric = comm.Fabric.from_cluster(slow)
    plan = make_plan(num_layers=4, dp=2, pp=1, tp=1, cp=4, micro_batch_size=1)
    flat = np.arange(8, dtype=np.int64)
    got, _ = cp_ring_bandwidths(fabric, flat, group_flows(plan))
    assert got[0] == pytest.approx(5 * GB)
    bw[0, 1] = bw[1, 0] = 0.0
    failed = cluster.model_copy(update={"bandwidth_bytes_per_s": bw})
    with pytest.raises(InfeasibleError, match="context-parallel ring"):
        cp_ring_bandwidths(comm.Fabric.from_cluster(failed), flat, group_flows(plan))
    pairs = communication_pairs(plan, False)
    assert (0, 1) in pairs["cp"] and (3, 0) in pairs["cp"] and (0, 4) not in pairs["cp"]


def test_context_parallelism_lowers_activation_memory_and_keeps_the_work():
    model = ModelSpec(name="d", num_layers=4, hidden_size=512, num_attention_heads=8,
                      ffn_hidden_size=2048, vocab_size=1000, max_seq_length=16384)  # fmt: skip
    inst = _instance(model, seq=16384, gbs=8)
    ev = Evaluator(inst)
    base = ev.evaluate(make_plan(num_layers=4, dp=8, pp=1, tp=1, micro_batch_size=1))
    cp2 = ev.evaluate(make_plan(num_layers=4, dp=4, pp=1, tp=1, cp=2, micro_batch_size=1))
    assert cp2.memory_bytes_max < base.memory_bytes_max
    # same model FLOPs on the same GPUs: MFU and time move together
    assert cp2.mfu * cp2.iteration_time_s == pytest.approx(base.mfu * base.iteration_time_s)


def test_megatron_rules_for_context_and_experts():
    inst = _instance(_moe_model(), seq=1024)
    ev = Evaluator(inst)
    bad = [
        (dict(dp=4, pp=1, tp=2, ep=3), "plan.sequence_parallel|plan.ep"),
        (dict(dp=8, pp=1, tp=1, ep=3), "plan.ep=3"),
        (dict(dp=4, pp=1, tp=2, ep=8, sequence_parallel=True), "plan.ep=8"),
        (dict(dp=1, pp=1, tp=1, cp=8, ep=1), None),
    ]
    for kw, match in bad:
        plan = make_plan(num_layers=4, micro_batch_size=1, **kw)
        if match is None:
            ev.evaluate(plan)  # 2 x 8 = 16 divides 1024: fine
            continue
        with pytest.raises(LayoutError, match=match):
            ev.evaluate(plan)
    six = tuple((g,) for g in range(6))
    cp3 = make_plan(num_layers=4, dp=2, pp=1, tp=1, cp=3, micro_batch_size=1, placement=six)
    with pytest.raises(LayoutError, match="2 x cp = 6"):
        Evaluator(_instance(_moe_model(), seq=1000)).evaluate(cp3)
    dense = _instance(_moe_model(num_experts=1, moe_top_k=1, moe_ffn_hidden_size=None))
    with pytest.raises(LayoutError, match="needs a mixture-of-experts model"):
        Evaluator(dense).evaluate(make_plan(num_layers=4, dp=8, pp=1, tp=1, ep=2,
                                            micro_batch_size=1))  # fmt: skip


def test_the_search_space_holds_expert_and_context_layouts_megatron_accepts():
    inst = _instance(_moe_model(), seq=16384, gbs=16)
    layouts = list(enumerate_layouts(inst))
    seen = {(p.cp, p.ep, p.expert_tp) for p in layouts}
    assert {1, 2, 4} <= {cp for cp, _, _ in seen}  # 16384 tokens: cp up to 4 (4096 each)
    assert {1, 2, 4, 8} <= {ep for _, ep, _ in seen}
    ev = Evaluator(inst)
    for plan in layouts[:: max(1, len(layouts) // 60)]:
        assert plan.num_gpus <= 8
        assert plan.ep == 1 or inst.model.num_experts % plan.ep == 0
        assert plan.tp == 1 or plan.sequence_parallel
        ev.evaluate(plan)  # every enumerated layout passes Megatron's rules


@pytest.mark.slow
def test_the_bundled_moe_instance_gets_a_fitting_expert_parallel_plan():

    from pipette_cp.checker.checks import check_plan
    from pipette_cp.io.instance_file import load_instance
    from pipette_cp.search import search

    path = ROOT / "instances" / "qwen3-235b-a22b-g3h100-256.yaml"
    inst = load_instance(path)
    space = inst.search_space.model_copy(update={"tp": (4,), "ep": (8,), "etp": (1,),
                                                 "recompute": ("none",), "vpp": (1,)})  # fmt: skip
    result = search(inst, SearchOptions(space=space, top_k=1, time_limit_s=20, max_solves=1))
    plan = result.plans[0]
    assert plan.ep == 8 and plan.evaluation is not None and plan.evaluation.fits
    assert check_plan(inst, plan) == []
    assert plan.solve_info is not None and plan.solve_info.status != "optimal"


@pytest.mark.slow
def test_regrouping_the_replicas_finds_the_best_expert_groups_of_a_tiny_case():
    import time

    from pipette_cp.solvers.placement.regroup import regroup_replicas

    inst = _instance(_moe_model(num_experts=6, moe_top_k=2), _cluster(nodes=2, gpus=3), gbs=12)
    ev = Evaluator(inst)
    plan = make_plan(num_layers=4, dp=6, pp=1, tp=1, ep=3, micro_batch_size=1,
                     placement=tuple((g,) for g in (0, 3, 1, 4, 2, 5)))  # fmt: skip
    # oracle: every renumbering of the 6 replicas
    times = [
        ev.iteration_time(plan.model_copy(update={"placement": tuple((g,) for g in order)}))
        for order in itertools.permutations((0, 3, 1, 4, 2, 5))
    ]
    found, t = regroup_replicas(ev, plan, time.perf_counter() + 60)
    assert t == pytest.approx(min(times), rel=1e-12)
    assert t == pytest.approx(ev.iteration_time(found), rel=1e-12)
    assert t < ev.iteration_time(plan)  # both groups end inside one node each
    groups = [{found.placement[r][0] // 3 for r in g} for g in ([0, 1, 2], [3, 4, 5])]
    assert all(len(nodes) == 1 for nodes in groups)


@pytest.mark.parametrize(
    ("experts", "top_k", "nodes"), [(8, 2, 2), (16, 4, 4), (12, 3, 3), (8, 1, 4)]
)
def test_node_dedup_factor_matches_enumerating_every_routing(experts, top_k, nodes):
    from pipette_cp.cost.network.parallel_groups import node_dedup_factor

    node_of = [e * nodes // experts for e in range(experts)]  # experts spread evenly
    distinct = copies = 0
    picks = list(itertools.combinations(range(experts), top_k))
    for pick in picks:  # a token on node 0
        remote = [node_of[e] for e in pick if node_of[e] != 0]
        distinct += len(set(remote))
        copies += len(remote)
    want = distinct / copies
    assert float(node_dedup_factor(experts, top_k, np.array([nodes]))[0]) == pytest.approx(want)
    assert float(node_dedup_factor(experts, top_k, np.array([1]))[0]) == 1.0


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2]), st.sampled_from([1, 2, 4]),
    st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4, 8]), st.sampled_from([None, 1, 2]),
    st.permutations(range(8)),
)  # fmt: skip
def test_random_expert_and_context_layouts_are_refused_or_consistent(dp, pp, tp, cp, ep, etp, perm):
    from pipette_cp.checker.checks import check_plan
    from pipette_cp.errors import PipetteError

    if dp * pp * tp * cp != 8:
        return
    inst = _instance(_moe_model(), seq=1024, gbs=16)
    base = make_plan(num_layers=4, dp=dp, pp=pp, tp=tp, cp=cp, ep=ep, etp=etp,
                     micro_batch_size=1, sequence_parallel=tp > 1)  # fmt: skip
    # a random placement that keeps each unit's tp GPUs inside a node
    nodes = [perm[:4], perm[4:]] if tp > 1 else [perm]
    flat = [g for block in nodes for g in sorted(block, key=lambda g: (g // 4, g))]
    flat = sorted(flat, key=lambda g: g // 4) if tp > 1 else flat
    units = tuple(tuple(flat[i : i + tp]) for i in range(0, 8, tp))
    plan = base.model_copy(update={"placement": units})
    try:
        e = Evaluator(inst).evaluate(plan)
    except PipetteError as err:
        assert "\n" not in str(err)
        return
    assert sum(s for _, s in e.breakdown_s.items()) == pytest.approx(e.iteration_time_s, rel=1e-9)
    assert all(v >= -1e-12 for _, v in e.breakdown_s.items())
    assert e.memory_bytes_max > 0 and e.mfu > 0
    if e.fits:
        assert check_plan(inst, plan) == []


def slow_pairs_cluster():
    """2 x 3 GPUs whose Megatron-order pairs (0, 1) and (3, 4) are slow NVLink."""
    cluster = _cluster(nodes=2, gpus=3, inter=12 * GB)
    bw = cluster.bandwidth_bytes_per_s.copy()
    for a, b in [(0, 1), (3, 4)]:
        bw[a, b] = bw[b, a] = 2 * GB
    return cluster.model_copy(update={"bandwidth_bytes_per_s": bw})


@pytest.mark.slow
@pytest.mark.parametrize("method", ["cpsat", "milp"])
@pytest.mark.parametrize(("dp", "pp", "cp", "ep"), [(6, 1, 1, 2), (3, 1, 2, 1), (3, 1, 2, 2)])
def test_expert_and_context_placements_against_the_brute_force_oracle(method, dp, pp, cp, ep):
    from pipette_cp.solvers import get_method
    from pipette_cp.solvers.options import SolveOptions
    from pipette_cp.solvers.placement.oracle import brute_force_placement

    inst = _instance(_moe_model(), slow_pairs_cluster(), seq=2048, gbs=12)
    skeleton = make_plan(num_layers=4, dp=dp, pp=pp, tp=1, cp=cp, ep=ep, micro_batch_size=1)
    _, best = brute_force_placement(inst, skeleton)
    plan = get_method(method)(inst, skeleton, SolveOptions(time_limit_s=4))
    info = plan.solve_info
    # slow pairs inside a node: slot places, where the groups are not priced
    assert info is not None and info.status != "optimal"
    t = Evaluator(inst).iteration_time(plan)
    assert t >= best * (1 - 1e-9)  # the oracle enumerates every placement
    assert info.bound is None or info.bound <= best * (1 + 1e-9)  # a valid lower bound
    default = Evaluator(inst).iteration_time(skeleton)  # Megatron's order: groups on slow pairs
    assert t < default
