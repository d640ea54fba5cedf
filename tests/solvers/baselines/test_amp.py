"""AMP: its cost formula on hand-computed micro-cases, its partition DP against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pipette_cp.checker.checks import CHECKS
from pipette_cp.cost.compute.model_chunks import chunk_times, layer_times
from pipette_cp.errors import LayoutError
from pipette_cp.solvers import METHODS, SolveOptions
from pipette_cp.solvers.baselines import amp
from pipette_cp.specs import Plan
from pipette_cp.specs.layouts import make_plan, megatron_placement
from tests.conftest import small_instance

STRUCTURAL = ("split_covers_layers", "split_contiguous", "placement_bijection", "tp_within_node")
H, S, V = 1024, 1024, 32000  # small_instance's model and sequence


def _plan(dp: int, pp: int, tp: int, layers: int = 8, **kw: object) -> Plan:
    return make_plan(num_layers=layers, dp=dp, pp=pp, tp=tp, micro_batch_size=1, **kw)  # type: ignore[arg-type]


def test_amp_cost_reproduces_the_formula_on_a_micro_case() -> None:
    instance = small_instance(nodes=2, gpus_per_node=2, global_batch_size=16)
    plan = _plan(dp=2, pp=2, tp=1)  # stage 0 on GPUs 0, 1 (node 0), stage 1 on 2, 3 (node 1)
    gpu = instance.cluster.gpu_of_node(0)
    probe = _plan(dp=1, pp=2, tp=1, layers=2)
    f = layer_times(instance.model, instance.training, gpu, probe, 150e9).forward_s
    fwd = chunk_times(instance.model, instance.training, gpu, probe, 150e9).forward_s
    emb, head = fwd[0] - f, fwd[1] - f
    # Backward = 2 x forward: every pseudo layer costs 3 x its forward (micro-batch 1).
    expected_e = 3 * np.array([emb, 0, *[f] * 8, 0, 0, head, 0])
    e = amp.amp_layer_costs(instance, plan)
    assert e == pytest.approx(expected_e)
    b_micro = 16 / (2 * 1)
    stage0, stage1 = 3 * (emb + 4 * f), 3 * (4 * f + head)
    # One hop, counted once, 4-byte elements over min(inter_0, inter_1) = 20 GB/s.
    hop = S * H * 4 / 20e9
    pipe = (b_micro - 1) * max(stage0, stage1) + hop + expected_e.sum()
    # DP ring: replica 1 -> replica 0 of each stage, same node: intra 150 GB/s.
    params = 12 * H**2 * 4 + H * V
    dp = 2 * (2 - 1) / (2 * 150e9) * params * 4
    assert amp.amp_cost(instance, plan) == pytest.approx(pipe + dp, rel=1e-12)
    assert amp.amp_dp_cost(instance, plan) == pytest.approx(dp, rel=1e-12)


def test_pipeline_hop_uses_per_node_not_per_link_bandwidth() -> None:
    gb = np.array([[0, 10, 30], [10, 0, 20], [30, 20, 0]]) * 1e9
    instance = small_instance(nodes=3, gpus_per_node=1, node_bandwidth=gb)
    info = amp.amp_cluster_info(instance.cluster)
    assert info[:, 0].tolist() == [20e9, 15e9, 25e9]
    plan = _plan(dp=1, pp=2, tp=1, placement=((0,), (2,)))
    cost_c = amp.amp_comm_costs(instance, plan)
    assert cost_c.shape == (8 + 5, 1)
    # Link 0 -> 2 measures 30 GB/s; AMP uses min(20, 25) = 20 GB/s.
    assert cost_c[3, 0] == pytest.approx(S * H * 4 / 20e9)
    assert cost_c[-1, 0] == pytest.approx(S * V * 4 / 20e9)  # after embed2v: b s V / t


def test_dp_cost_sees_only_the_last_ring_link() -> None:
    gb = np.full((3, 3), 20e9)
    gb[1, :] = gb[:, 1] = 2e9  # node 1 has a slow NIC
    instance = small_instance(nodes=3, gpus_per_node=1, node_bandwidth=gb)
    plan = _plan(dp=3, pp=1, tp=1)  # replicas on nodes 0, 1, 2
    inter = amp.amp_cluster_info(instance.cluster)[:, 0]
    assert inter.tolist() == pytest.approx([11e9, 2e9, 11e9])
    params = 12 * H**2 * 8 + H * V  # pp = 1: embedding counted once
    # Ring link replica 2 -> replica 0 only: min(11, 11) GB/s; node 1 is never looked at.
    expected = 2 * 2 / (3 * 11e9) * params * 4
    assert amp.amp_dp_cost(instance, plan) == pytest.approx(expected)


def _brute_force(e: np.ndarray, c: np.ndarray, pp: int, b: float) -> float:
    layers = len(e) - 6
    best = np.inf
    for cuts in itertools.combinations(range(1, layers), pp - 1):
        split = tuple(np.diff([0, *cuts, layers]))
        best = min(best, amp.amp_pipe_cost(e, c, b, split))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_partition_dp_is_optimal_for_amps_cost(seed: int) -> None:
    rng = np.random.default_rng(seed)
    layers, pp, b = int(rng.integers(3, 8)), int(rng.integers(2, 4)), float(rng.integers(2, 9))
    e = np.concatenate(
        [[rng.uniform(0, 2), 0], rng.uniform(0.5, 3, layers), [0, 0, rng.uniform(0, 3), 0]]
    )
    c = rng.uniform(0, 2, (layers + 5, pp - 1))
    split = amp.amp_partition(e, c, pp, b, faithful=False)
    assert sum(split) == layers and min(split) >= 1
    assert amp.amp_pipe_cost(e, c, b, split) == pytest.approx(_brute_force(e, c, pp, b))
    # Without hop costs AMP's own comparison is exact too.
    zero = np.zeros_like(c)
    faithful = amp.amp_partition(e, zero, pp, b)
    assert amp.amp_pipe_cost(e, zero, b, faithful) == pytest.approx(_brute_force(e, zero, pp, b))


def test_faithful_dp_keeps_amps_mixed_comparison() -> None:
    # 4 equal layers, 2 stages, B = 3, every hop costs 5: pipe_ast compares "6 + 5"
    # (cut after layer 1, stored as 6) with "4 + 5" (cut after layer 2) and keeps the first.
    e = np.array([0, 0, 1, 1, 1, 1, 0, 0, 0, 0], dtype=float)
    c = np.full((9, 1), 5.0)
    assert amp.amp_partition(e, c, 2, 3.0) == (1, 3)
    assert amp.amp_partition(e, c, 2, 3.0, faithful=False) == (2, 2)
    assert amp.amp_partition(e, np.full((9, 1), 1.0), 2, 3.0) == (2, 2)


def test_one_microbatch_uses_amps_uniform_split() -> None:
    e = np.ones(16)
    assert amp.amp_partition(e, np.zeros((15, 3)), 4, 1.0) == (3, 3, 2, 2)
    assert amp.amp_partition(e, np.zeros((15, 0)), 1, 8.0) == (10,)


def test_amp_method_places_in_rank_order_and_reports_its_cost() -> None:
    instance = small_instance(nodes=2, gpus_per_node=4, layers=8)
    plan = METHODS["amp"](instance, _plan(dp=2, pp=2, tp=2), SolveOptions())
    assert plan.placement == megatron_placement(2, 2, 2)
    assert [v for f in (*STRUCTURAL, "no_failed_link") for v in CHECKS[f](instance, plan)] == []
    info = plan.solve_info
    assert info is not None and info.method == "amp" and info.status == "heuristic"
    assert info.objective == pytest.approx(amp.amp_cost(instance, plan))
    # The split is AMP's DP over the costs of the rank-order placement.
    start = _plan(dp=2, pp=2, tp=2)
    b_micro = amp.amp_num_microbatches(instance, start)
    expected = amp.amp_partition(
        amp.amp_layer_costs(instance, start), amp.amp_comm_costs(instance, start), 2, b_micro
    )
    assert plan.layer_split == expected


def test_amp_refuses_what_it_cannot_express() -> None:
    instance = small_instance(nodes=2, gpus_per_node=4, layers=8)
    with pytest.raises(LayoutError, match="vpp"):
        METHODS["amp"](instance, _plan(dp=1, pp=2, tp=4, vpp=2), SolveOptions())
    with pytest.raises(LayoutError, match="vpp"):
        amp.amp_cost(instance, _plan(dp=1, pp=2, tp=4, vpp=2))
    with pytest.raises(LayoutError, match="tp=8"):
        METHODS["amp"](instance, _plan(dp=1, pp=1, tp=8), SolveOptions())
