"""Robust planning over bandwidth snapshots (pipette_cp.search.robust, solve --snapshots)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from pipette_cp.checker import check_plan, communication_pairs
from pipette_cp.cli import app
from pipette_cp.cli.robust import snapshot_paths
from pipette_cp.errors import InputFileError, SpecError
from pipette_cp.io.cluster_file import write_cluster_file
from pipette_cp.search import search
from pipette_cp.search.options import SearchOptions
from pipette_cp.search.robust import (
    planning_cluster,
    planning_matrix,
    quantile_index,
    robust_search,
    score_plans,
    snapshot_times,
    with_cluster,
)
from pipette_cp.specs import ClusterSpec, Instance, Plan, SearchSpace, validate_spec
from tests.conftest import small_instance

runner = CliRunner()


def _snapshot(base: ClusterSpec, matrix: np.ndarray, name: str) -> ClusterSpec:
    return validate_spec(ClusterSpec, {**dict(base), "name": name, "bandwidth_bytes_per_s": matrix})


def _three_snapshots() -> list[ClusterSpec]:
    """Three snapshots of a 3 x 2 cluster with random inter-node bandwidth; pair (0, 2)
    failed in the second."""
    base = small_instance(nodes=3, gpus_per_node=2).cluster
    rng = np.random.default_rng(0)
    out = []
    for k in range(3):
        matrix = base.bandwidth_bytes_per_s * rng.uniform(0.5, 1.0, size=(6, 6))
        if k == 1:
            matrix[0, 2] = 0.0
        out.append(_snapshot(base, matrix, f"snap{k}"))
    return out


# ------------------------------------------------------------------ planning matrix
def test_planning_matrix_q1_is_the_minimum_and_failed_anywhere_is_failed() -> None:
    snaps = _three_snapshots()
    stack = np.stack([s.bandwidth_bytes_per_s for s in snaps])
    matrix = planning_matrix(snaps, 1.0)
    assert np.array_equal(matrix, stack.min(axis=0))
    assert matrix[0, 2] == 0.0 and stack[[0, 2], 0, 2].min() > 0
    cluster = planning_cluster(snaps, 1.0)
    assert (0, 2) in cluster.failed_pairs() and cluster.num_gpus == 6
    assert "1-quantile" in cluster.source and "3 snapshots" in cluster.source


def test_planning_matrix_q_below_one_is_the_slow_side_quantile() -> None:
    snaps = _three_snapshots()
    stack = np.stack([s.bandwidth_bytes_per_s for s in snaps])
    median = planning_matrix(snaps, 0.5)
    assert np.allclose(median, np.median(stack, axis=0))
    assert median[0, 2] > 0  # failed in one snapshot of three: not at the median
    q = planning_matrix(snaps, 0.75)  # protects 75 %: the 25 % quantile, below the median
    assert np.allclose(q, np.quantile(stack, 0.25, axis=0)) and (q <= median).all()


def test_quantile_index_takes_an_actual_snapshot() -> None:
    assert [quantile_index(3, q) for q in (1.0, 0.67, 0.5, 0.34, 0.01)] == [2, 2, 1, 1, 0]
    assert [quantile_index(4, q) for q in (1.0, 0.75, 0.5, 0.25)] == [3, 2, 1, 0]


# ------------------------------------------------------------------ bad input
def test_snapshots_of_different_clusters_raise_spec_error() -> None:
    small = small_instance(nodes=2, gpus_per_node=2).cluster
    large = small_instance(nodes=3, gpus_per_node=2).cluster
    with pytest.raises(SpecError, match=r"snapshots\[1\]\.num_nodes=3"):
        planning_matrix([small, large])
    renamed = validate_spec(ClusterSpec, {**dict(small), "node_names": ("a", "b")})
    with pytest.raises(SpecError, match="node_names"):
        robust_search(small_instance(nodes=2, gpus_per_node=2), [small, renamed])
    with pytest.raises(SpecError, match="at least one"):
        planning_matrix([])


@pytest.mark.parametrize("q", [0.0, -0.5, 1.5, math.nan])
def test_quantile_outside_zero_one_raises_spec_error(q: float) -> None:
    with pytest.raises(SpecError, match="quantile"):
        planning_matrix(_three_snapshots(), q)


# ------------------------------------------------------------------ robust vs single
def _pipeline_instance() -> Instance:
    """4 nodes x 4 GPUs at 5 GB/s; dp4 x pp4 x tp1, so each pipeline hop crosses nodes."""
    inst = small_instance(nodes=4, gpus_per_node=4, node_bandwidth=np.full((4, 4), 5e9))
    space = SearchSpace(
        tp=(1,), pp=(4,), micro_batch_size=(1,), vpp=(1,), recompute=("none",),
        distributed_optimizer=(True,), flash_attention=(True,), sequence_parallel=(False,),
    )  # fmt: skip
    return validate_spec(Instance, {**dict(inst), "search_space": space})


def _middle_hop_links(plan: Plan) -> set[tuple[int, int]]:
    """GPU pairs of the plan's hop from stage 1 to stage 2, both directions."""
    return {
        pair
        for d in range(plan.dp)
        for a, b in zip(plan.unit_gpus(1, d), plan.unit_gpus(2, d), strict=True)
        for pair in ((a, b), (b, a))
    }


@pytest.mark.parametrize("factor", [0.5, 0.0], ids=["halved", "failed"])
def test_robust_plan_avoids_links_that_degrade_in_snapshot_two(factor: float) -> None:
    inst = _pipeline_instance()
    first = inst.cluster
    single = search(inst, SearchOptions(method="greedy", top_k=1, time_limit_s=30)).plans[0]
    degraded = _middle_hop_links(single)
    matrix = first.bandwidth_bytes_per_s.copy()
    for a, b in degraded:
        matrix[a, b] *= factor
    snaps = [first, _snapshot(first, matrix, "degraded")]
    result = robust_search(inst, snaps, SearchOptions(method="greedy", time_limit_s=30))
    best = result.plans[0]
    single_worst = max(snapshot_times(inst, snaps, [single])[0])
    robust_worst = max(result.times_s[0])
    assert robust_worst < single_worst  # the single plan pays for the degraded hop
    if factor == 0.0:
        assert math.isinf(single_worst)  # it crosses a failed link in snapshot 2
    used = set().union(*communication_pairs(best, inst.model.tied_embeddings).values())
    assert not used & degraded
    # no cost on the first snapshot: the cluster is uniform there
    assert result.times_s[0][0] == pytest.approx(snapshot_times(inst, [first], [single])[0][0])
    for plan, times in zip(result.plans, result.times_s, strict=True):
        for snap, t in zip(snaps, times, strict=True):
            if math.isfinite(t):
                assert check_plan(with_cluster(inst, snap), plan) == []
        assert plan.evaluation is not None and plan.evaluation.fits
    assert best.evaluation is not None
    assert best.evaluation.iteration_time_s == result.scores_s[0] == robust_worst
    assert result.scores_s == sorted(result.scores_s)


def test_score_plans_ranks_by_the_quantile_snapshot() -> None:
    inst = _pipeline_instance()
    base = inst.cluster
    plans = search(inst, SearchOptions(method="greedy", top_k=3, time_limit_s=30)).plans
    snaps = [_snapshot(base, base.bandwidth_bytes_per_s * f, f"x{f}") for f in (1.0, 0.25, 0.5)]
    times = snapshot_times(inst, snaps, plans)
    result = score_plans(inst, snaps, plans, quantile=0.5)
    for score, crit, row in zip(result.scores_s, result.critical, result.times_s, strict=True):
        assert score == sorted(row)[1] == row[crit] and crit == 2  # the median: x0.5
    assert sorted(result.scores_s) == sorted(sorted(row)[1] for row in times)


# ------------------------------------------------------------------ command line
def test_snapshot_paths_accept_repeats_commas_globs_and_generate_stem(tmp_path: Path) -> None:
    files = [tmp_path / f"g6-t{t:02d}.yaml" for t in range(3)]
    for path in files:
        path.write_text("x")
    assert snapshot_paths([str(tmp_path / "g6.yaml")]) == files
    assert snapshot_paths([f"{files[0]},{files[2]}", str(files[1])]) == [
        files[0], files[2], files[1],
    ]  # fmt: skip
    assert snapshot_paths([str(tmp_path / "g6-t0[01].yaml")]) == files[:2]
    with pytest.raises(InputFileError, match="no such cluster file"):
        snapshot_paths([str(tmp_path / "other.yaml")])


def test_cli_solve_snapshots_prints_the_per_snapshot_table(tmp_path: Path) -> None:
    inst = _pipeline_instance()
    first = inst.cluster
    matrix = first.bandwidth_bytes_per_s.copy()
    matrix[4:8, 8:12] *= 0.5
    paths = [tmp_path / "s-t00.yaml", tmp_path / "s-t01.yaml"]
    write_cluster_file(first, paths[0])
    write_cluster_file(_snapshot(first, matrix, "slow"), paths[1])
    instance_file = tmp_path / "inst.yaml"
    instance_file.write_text(
        json.dumps(
            {
                "name": "small",
                "model": inst.model.model_dump(mode="json"),
                "cluster": {"file": str(paths[0])},
                "training": inst.training.model_dump(mode="json"),
                "search_space": inst.search_space.model_dump(mode="json"),
            }
        )
    )
    args = ["solve", str(instance_file), "--method", "greedy", "--time-limit", "20", "--top", "2"]
    result = runner.invoke(app, [*args, "--snapshots", str(paths[0]), "--snapshots", str(paths[1])])
    assert result.exit_code == 0, result.output
    assert "Iteration time per snapshot" in result.output and "worst" in result.output
    assert "s1 = slow" in result.output.replace("\n", " ")
    out = tmp_path / "plan.json"
    result = runner.invoke(
        app, [*args, "--snapshots", str(tmp_path / "s.yaml"), "--json", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    entries = json.loads(result.output)
    assert set(entries[0]["snapshot_times_s"]) == {first.name, "slow"}
    assert entries[0]["robust_time_s"] == max(entries[0]["snapshot_times_s"].values())
    assert out.exists() and (tmp_path / "plan.instance.yaml").exists()
    result = runner.invoke(app, [*args, "--snapshots", str(paths[0]), "--cluster", str(paths[1])])
    assert result.exit_code == 2 and "either --cluster or --snapshots" in result.output
