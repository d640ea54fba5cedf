"""pipette-sa: Pipette's objective, moves, schedule, budget and node-grid -> rank mapping."""

from __future__ import annotations

import math
import random
import re
import time
from dataclasses import replace

import numpy as np
import pytest

from pipette_cp.checker.checks import CHECKS, check_no_failed_link
from pipette_cp.errors import LayoutError
from pipette_cp.solvers import METHODS, SolveOptions
from pipette_cp.solvers.baselines import pipette_sa as sa
from pipette_cp.solvers.baselines.common import finish_plan
from pipette_cp.specs import Instance, Plan
from pipette_cp.specs.layouts import make_plan
from tests.conftest import small_instance

STRUCTURAL = ("split_covers_layers", "split_contiguous", "placement_bijection", "tp_within_node")


def _skeleton(dp: int, pp: int, tp: int, layers: int = 8, **kw: object) -> Plan:
    return make_plan(num_layers=layers, dp=dp, pp=pp, tp=tp, micro_batch_size=1, **kw)  # type: ignore[arg-type]


def _hetero(nodes: int = 8, seed: int = 1, layers: int = 8) -> Instance:
    rng = np.random.default_rng(seed)
    matrix = rng.uniform(5e9, 25e9, (nodes, nodes))
    return small_instance(
        nodes=nodes, gpus_per_node=4, layers=layers, node_bandwidth=(matrix + matrix.T) / 2
    )


class _FixedRng:
    """Stands in for random.Random with preset answers."""

    def __init__(self, samples: list[int], draws: list[int]) -> None:
        self.samples, self.draws = samples, list(draws)

    def sample(self, population: range, k: int) -> list[int]:
        assert k == 2
        return list(self.samples)

    def randrange(self, n: int) -> int:
        return self.draws.pop(0)


def test_objective_matches_hand_computation() -> None:
    # 4 nodes, pp=2 -> 2 grid rows; GB/s node matrix, intra 150 GB/s.
    gb = np.array([[0, 10, 20, 40], [10, 0, 5, 20], [20, 5, 0, 10], [40, 20, 10, 0]]) * 1e9
    instance = small_instance(nodes=4, gpus_per_node=4, node_bandwidth=gb)
    plan = _skeleton(dp=4, pp=2, tp=2)  # inner dp = 4/2 = 2, outer dp = 4/2 = 2
    inputs = sa.pipette_inputs(instance, plan)
    h, s, v, layers = 1024, 1024, 32000, 4
    s_act = 1 * s * h * 2
    s_dp = (h * v + 16 * h**2 * layers) / 2 * 2
    assert inputs.pp_msg_bytes == s_act and inputs.dp_msg_bytes == pytest.approx(s_dp)
    cost = sa.pipette_objective([0, 1, 3, 2], inputs)  # rows [0, 1] and [3, 2]
    assert cost.pipeline_s == pytest.approx((2 * s_act / 10e9, 2 * s_act / 10e9))
    assert cost.pp_s == pytest.approx(2 * s_act / 10e9)
    # Stage 0 ring: nodes 0 and 3, links 0->3 and 3->0 at 40 GB/s, full S_dp.
    assert cost.dp_inter_s == pytest.approx(2 * 1 / 2 * s_dp / 40e9)
    assert cost.dp_inner_s == pytest.approx(2 * 1 / 2 * s_dp / 150e9)
    assert cost.total_s == pytest.approx(cost.pp_s + cost.dp_inter_s + cost.dp_inner_s)


def test_objective_ignores_dp_rings_of_later_stages() -> None:
    gb = np.full((4, 4), 20e9)
    gb[1, 3] = gb[3, 1] = 1e9  # nodes 1 and 3 both hold stage 1 below
    instance = small_instance(nodes=4, gpus_per_node=4, node_bandwidth=gb)
    inputs = sa.pipette_inputs(instance, _skeleton(dp=4, pp=2, tp=2))
    slow_stage1 = sa.pipette_objective([0, 1, 2, 3], inputs).total_s
    uniform = small_instance(nodes=4, gpus_per_node=4, node_bandwidth=np.full((4, 4), 20e9))
    fast = sa.pipette_objective([0, 1, 2, 3], sa.pipette_inputs(uniform, _skeleton(4, 2, 2)))
    assert slow_stage1 == pytest.approx(fast.total_s)


def test_latency_formula_drops_the_remainder_microbatches() -> None:
    cost = sa.PipetteCost((0.0,), 0.0, 0.0, 0.0)
    # m = 7, p = 4: k = 1 -> 3 + 4 = 7 steps, while m + p - 1 = 10 are executed.
    assert sa.pipette_latency_s(cost, 1.0, 0.0, num_microbatches=7, pp=4) == 7.0
    assert sa.pipette_latency_s(cost, 1.0, 0.0, num_microbatches=2, pp=4) == 5.0


def _pipette_insert_route(state: list[int], i: int, j: int, pos: int, reverse: bool) -> list[int]:
    """Pipette's list.insert loop, written out as the oracle."""
    state = list(state)
    route = state[min(i, j) : max(i, j)]
    del state[min(i, j) : max(i, j)]
    for node in route if reverse else route[::-1]:
        state.insert(pos, node)
    return state


@pytest.mark.parametrize("i,j,pos", [(1, 3, 3), (4, 0, 5), (2, 2, 0), (0, 5, 1), (3, 5, 5)])
def test_route_moves_follow_pipette(i: int, j: int, pos: int) -> None:
    start = [10, 11, 12, 13, 14, 15]
    for reverse, move in ((False, sa._insert_route), (True, sa._insert_reversed)):
        state = list(start)
        move(state, _FixedRng([], [i, j, pos]))  # type: ignore[arg-type]
        assert state == _pipette_insert_route(start, i, j, pos, reverse)


def test_point_moves_follow_pipette() -> None:
    state = [0, 1, 2, 3, 4]
    sa._two_opt(state, _FixedRng([3, 1], []))  # type: ignore[arg-type]
    assert state == [0, 2, 1, 3, 4]  # state[1:3] reversed
    sa._insert(state, _FixedRng([0, 4], []))  # type: ignore[arg-type]
    assert state == [4, 0, 2, 1, 3]  # node at 4 moved before position 0
    sa._swap(state, _FixedRng([1, 3], []))  # type: ignore[arg-type]
    assert state == [4, 1, 2, 0, 3]


def test_moves_keep_a_permutation() -> None:
    rng = random.Random(0)
    for move in sa.MOVES:
        state = list(range(7))
        for _ in range(200):
            move(state, rng)
            assert sorted(state) == list(range(7))


def test_acceptance_scales_the_increase_like_pipette() -> None:
    rng = random.Random(0)
    assert sa._accept(-1.0, 1.0, rng) and sa._accept(0.0, 1.0, rng)
    assert not sa._accept(math.inf, 1.0, rng) and not sa._accept(5.0, 0.0, rng)
    # d = 350 ms -> d' = 0.35; p = exp(-0.35 / T).
    hits = sum(sa._accept(350.0, 0.5, random.Random(k)) for k in range(4000))
    assert hits / 4000 == pytest.approx(math.exp(-0.7), abs=0.03)


def test_mapping_matches_pipettes_process_groups() -> None:
    g, tp, pp = 8, 2, 2
    state = [3, 0, 2, 1]  # rows [3, 0] and [2, 1]
    placement = sa.state_to_placement(state, pp=pp, tp=tp, gpus_per_node=g)
    inner = g // tp
    # initialize_model_parallel: TP group k of node n = ranks n*g + k*tp ...; pipeline of
    # row i and local group k runs through node row[j] for stage j; DP replica i*inner + k.
    tp_groups = {
        (n, k): tuple(n * g + k * tp + t for t in range(tp)) for n in range(4) for k in range(inner)
    }
    rows = [state[0:2], state[2:4]]
    dp = len(rows) * inner
    for i, row in enumerate(rows):
        for k in range(inner):
            for stage in range(pp):
                assert placement[stage * dp + i * inner + k] == tp_groups[row[stage], k]


def test_anneal_improves_its_own_objective_and_is_seeded() -> None:
    instance = _hetero()
    inputs = sa.pipette_inputs(instance, _skeleton(dp=4, pp=4, tp=2))
    one = sa.anneal(inputs, seed=7, time_limit_s=30.0, max_iterations=3000)
    two = sa.anneal(inputs, seed=7, time_limit_s=30.0, max_iterations=3000)
    assert replace(one, wall_time_s=0.0) == replace(two, wall_time_s=0.0)
    assert one.iterations == 3000
    assert one.best_cost_s < one.start_cost_s
    assert sa.pipette_objective(list(one.best_state), inputs).total_s == one.best_cost_s
    other = sa.anneal(inputs, seed=8, time_limit_s=30.0, max_iterations=3000)
    assert other.start_state != one.start_state


def test_method_honours_the_time_budget_and_is_valid() -> None:
    instance = _hetero()
    plan = METHODS["pipette-sa"](
        instance, _skeleton(dp=4, pp=4, tp=2), SolveOptions(time_limit_s=0.2)
    )
    info = plan.solve_info
    assert info is not None and info.method == "pipette-sa" and info.status == "heuristic"
    assert 0.2 <= info.wall_time_s < 2.0  # runs until the budget is spent, then stops
    assert [v for f in STRUCTURAL for v in CHECKS[f](instance, plan)] == []
    assert plan.layer_split == (2, 2, 2, 2)
    inputs = sa.pipette_inputs(instance, plan)
    nodes = [plan.placement[s * plan.dp + r][0] // 4 for r in (0, 2) for s in range(4)]
    assert info.objective == pytest.approx(sa.pipette_objective(nodes, inputs).total_s)


def test_method_same_seed_same_plan_on_a_tiny_instance() -> None:
    instance = _hetero(nodes=3, layers=9)
    sk = _skeleton(dp=4, pp=3, tp=1, layers=9)
    one = METHODS["pipette-sa"](instance, sk, SolveOptions(time_limit_s=0.05, seed=1))
    two = METHODS["pipette-sa"](instance, sk, SolveOptions(time_limit_s=0.05, seed=1))
    assert one.placement == two.placement


@pytest.mark.parametrize(
    "dims,field",
    [
        ((2, 3, 2), "plan.pp"),
        ((2, 2, 2), "plan.dp"),
        ((4, 2, 3), "plan.tp"),
        ((4, 2, 2), "plan.vpp"),
    ],
)
def test_layouts_pipette_cannot_express_raise(dims: tuple[int, int, int], field: str) -> None:
    instance = small_instance(nodes=4, gpus_per_node=4, layers=12)
    dp, pp, tp = dims
    kw = {"vpp": 2} if field == "plan.vpp" else {}
    with pytest.raises(LayoutError, match=re.escape(field)):
        METHODS["pipette-sa"](instance, _skeleton(dp, pp, tp, layers=12, **kw), SolveOptions())


def test_layers_not_divisible_by_pp_raise() -> None:
    instance = small_instance(nodes=4, gpus_per_node=4, layers=10)
    with pytest.raises(LayoutError, match=r"model\.num_layers"):
        METHODS["pipette-sa"](instance, _skeleton(1, 4, 4, layers=10), SolveOptions())


def test_failed_node_pair_is_avoided_only_where_the_objective_sees_it() -> None:
    gb = np.full((4, 4), 20e9)
    gb[2, 3] = gb[3, 2] = 0.0  # nodes 2 and 3 cannot talk
    instance = small_instance(nodes=4, gpus_per_node=4, node_bandwidth=gb)
    inputs = sa.pipette_inputs(instance, _skeleton(dp=4, pp=2, tp=2))
    # A pipeline hop 2 -> 3 or a stage-0 ring through 2 and 3: infinite cost.
    assert math.isinf(sa.pipette_objective([2, 3, 0, 1], inputs).total_s)
    assert math.isinf(sa.pipette_objective([2, 0, 3, 1], inputs).total_s)
    # 2 and 3 both at stage 1: their DP ring uses the failed pair, the objective is blind.
    blind = [0, 2, 1, 3]
    assert math.isfinite(sa.pipette_objective(blind, inputs).total_s)
    placement = sa.state_to_placement(blind, pp=2, tp=2, gpus_per_node=4)
    plan = _skeleton(dp=4, pp=2, tp=2, placement=placement)
    found = check_no_failed_link(instance, plan)
    assert found and "dp traffic" in found[0].message
    # The annealer never returns an infinite-cost state when a finite one exists.
    result = sa.anneal(inputs, seed=0, time_limit_s=30.0, max_iterations=500)
    assert math.isfinite(result.best_cost_s)


def test_an_annealer_that_only_finds_failed_states_reports_no_objective() -> None:
    """Pipette's cost is inf on every state that crosses a failed pair: the plan is
    still returned (the checker reports it), with no objective rather than an error."""
    plan = make_plan(num_layers=8, dp=2, pp=2, tp=2, micro_batch_size=1)
    out = finish_plan(plan, layer_split=plan.layer_split, placement=plan.placement,
                      method="pipette-sa", objective_s=math.inf, started_at=time.perf_counter())  # fmt: skip
    assert out.solve_info is not None and out.solve_info.objective is None
