"""The rings a plan is charged for are the ones NCCL builds from the exported rank map,
and none of them crosses a failed pair."""

from __future__ import annotations

import numpy as np
import pytest

from pipette_cp.api import solve
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.experiments.solving.nccl_rings import check_instance, launched_rings
from pipette_cp.io.instance_file import load_instance
from pipette_cp.report.launch import write_launch_files
from pipette_cp.report.rings import charged_rings, failed_ring_links
from pipette_cp.specs.layouts import make_plan
from tests.conftest import small_instance


def _launched(instance, plan, tmp_path):
    write_launch_files(instance, plan, tmp_path, megatron_args=[])
    return launched_rings(instance, plan, tmp_path / "rank_map.csv")


def test_an_interleaved_placement_is_charged_the_ring_nccl_builds(tmp_path) -> None:
    """Replicas on nodes 0, 1, 0, 2, 1, 3 (tp=2): rank order would run 0 1 0 2 1 3, NCCL
    runs nodes 0 1 2 3, each node's GPUs together; both tp ranks alike."""
    instance = small_instance(nodes=4, gpus_per_node=4, global_batch_size=12)
    nodes = (0, 1, 0, 2, 1, 3)
    used: dict[int, int] = {}
    units = []
    for n in nodes:
        k = used.get(n, 0)
        used[n] = k + 1
        units.append((4 * n + 2 * k, 4 * n + 2 * k + 1))
    plan = make_plan(num_layers=8, dp=6, pp=1, tp=2, micro_batch_size=1, placement=tuple(units))
    charged = {(r.kind, r.stage, r.index): r.gpus for r in charged_rings(instance, plan)}
    assert charged[("dp", 0, 0)] == (0, 2, 4, 6, 8, 12)
    assert charged[("dp", 0, 0)] != tuple(u[0] for u in units)  # not rank order
    launched = _launched(instance, plan, tmp_path)
    assert launched == {k: v for k, v in charged.items() if k[0] == "dp"}
    assert np.isfinite(Evaluator(instance).iteration_time(plan))


def test_a_failed_pair_on_nccls_ring_is_named_and_one_off_it_is_not() -> None:
    """Nodes 0 1 0 2 1 3, one GPU each: NCCL's ring 0 1 4 5 8 12 takes 5 -> 8, rank
    order's 0 4 1 8 5 12 would take 1 -> 8 instead."""
    instance = small_instance(nodes=4, gpus_per_node=4)
    matrix = instance.cluster.bandwidth_bytes_per_s.copy()
    matrix[5, 8] = matrix[1, 8] = 0.0
    cluster = instance.cluster.model_copy(update={"bandwidth_bytes_per_s": matrix})
    instance = instance.model_copy(update={"cluster": cluster})
    units = tuple((g,) for g in (0, 4, 1, 8, 5, 12))
    plan = make_plan(num_layers=8, dp=6, pp=1, tp=1, micro_batch_size=1, placement=units)
    rings = charged_rings(instance, plan)
    assert [r.gpus for r in rings] == [(0, 1, 4, 5, 8, 12)]
    assert failed_ring_links(instance, rings) == [(5, 8)]


@pytest.mark.parametrize(
    ("name", "method"),
    [("llama-2-7b-g3-11n-failednode", "cpsat"), ("gpt3-760m-g5-3n-slownic", "cpsat"),
     ("llama-2-70b-real00-136", "greedy")],
)  # fmt: skip
def test_bundled_plans_run_the_rings_they_are_charged(name, method, tmp_path) -> None:
    instance = load_instance(name)
    # a work budget, not wall time: the same plan on any machine, however loaded
    plan = solve(instance, method=method, time_limit_s=4, top_k=1, deterministic=True)[0]
    rings = charged_rings(instance, plan)
    launched = _launched(instance, plan, tmp_path)
    charged = {(r.kind, r.stage, r.index): r.gpus for r in rings if r.kind != "tp"}
    assert launched == charged
    assert failed_ring_links(instance, rings) == []


def test_the_benchmark_line_counts_rings() -> None:
    line, rings, differ, failed = check_instance("gpt3-1.3b-nominal-8", 3.0)
    assert "gpt3-1.3b-nominal-8" in line and (differ, failed) == (0, 0)
    assert rings >= 0


def test_expert_rings_of_an_interleaved_moe_plan_are_nccls(tmp_path) -> None:
    """ep = etp = 2 over 6 replicas of tp = 2: expert rings of 3 ranks each, indexed
    ``e_t ep + e`` as Megatron's expert groups, on nodes 0 1 0 2 1 3."""
    from tests.cost.network.test_parallel_groups import _cluster, _instance, _moe_model

    instance = _instance(_moe_model(), _cluster(nodes=4, gpus=4), gbs=12)
    nodes, used, units = (0, 1, 0, 2, 1, 3), {}, []
    for n in nodes:
        k = used.setdefault(n, 0)
        used[n] = k + 1
        units.append((4 * n + 2 * k, 4 * n + 2 * k + 1))
    plan = make_plan(num_layers=4, dp=6, pp=1, tp=2, ep=2, etp=2, micro_batch_size=1,
                     placement=tuple(units))  # fmt: skip
    rings = charged_rings(instance, plan)
    experts = {(r.kind, r.stage, r.index): r.gpus for r in rings if r.kind == "expert-dp"}
    assert len(experts) == 4 and all(len(g) == 3 for g in experts.values())
    launched = _launched(instance, plan, tmp_path)
    assert {k: v for k, v in launched.items() if k[0] == "expert-dp"} == experts
