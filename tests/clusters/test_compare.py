"""Drift between two measurements (clusters/compare.py): exact counts on hand-made
matrices, a loop-by-loop oracle on G6 fail-slow snapshots, and ``cluster compare``."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from pipette_cp.cli import app
from pipette_cp.clusters.compare import SLOW_QUANTILE, compare_clusters
from pipette_cp.clusters.expand import cluster_from_node_matrix
from pipette_cp.clusters.generators.registry import generate_timeline
from pipette_cp.errors import SpecError
from pipette_cp.io.cluster_file import write_cluster_file
from pipette_cp.specs import ClusterSpec, resolve_gpu
from pipette_cp.units import GB
from tests.conftest import FIXTURES

runner = CliRunner()
NCCL_PAIRWISE = FIXTURES / "nccl" / "pairwise"


def cluster(
    node_gb: np.ndarray | list[list[float]],
    gpus_per_node: int = 1,
    names: tuple[str, ...] | None = None,
    name: str = "c",
) -> ClusterSpec:
    matrix = np.asarray(node_gb, dtype=float) * GB
    n = matrix.shape[0]
    return cluster_from_node_matrix(
        node_bandwidth=matrix,
        intra_node=150 * GB,
        gpus_per_node=gpus_per_node,
        gpu=resolve_gpu("a100"),
        nics_per_node=gpus_per_node,
        nic_bandwidth_bytes_per_s=25 * GB,
        name=name,
        node_names=names or tuple(f"n{i}" for i in range(n)),
    )


def five(changes: dict[tuple[int, int], float] | None = None) -> ClusterSpec:
    """5 nodes x 1 GPU, every pair 20 GB/s but n0-n1 at 5 GB/s, then ``changes``
    (symmetric).  The 10th percentile of the 20 directed values is 18.5: only the
    two directions of n0-n1 are in the slowest decile."""
    m = np.full((5, 5), 20.0)
    m[0, 1] = m[1, 0] = 5.0
    for (i, j), v in (changes or {}).items():
        m[i, j] = m[j, i] = v
    np.fill_diagonal(m, 0.0)
    return cluster(m, name="five")


# ------------------------------------------------------------------ exact counts
def test_identical_snapshots_have_no_drift() -> None:
    r = compare_clusters(five(), five())
    assert (r.gpu_pairs, r.gpu_pairs_changed, r.node_pairs, r.node_pairs_changed) == (10, 0, 10, 0)
    assert r.correlation == pytest.approx(1.0)
    assert not r.new_failures and not r.recovered and not r.replan_recommended
    assert r.largest_changes == () and r.verdict.startswith("plan still valid")


def test_a_fast_pair_changing_keeps_the_plan() -> None:
    r = compare_clusters(five(), five({(2, 3): 26.0, (2, 4): 21.0}))
    assert r.gpu_pairs_changed == 1 and r.node_pairs_changed == 1  # +30 %; +5 % is below
    assert r.slow_pairs_changed == 0 and not r.replan_recommended
    top = r.largest_changes[0]
    assert (top.src_node, top.dst_node) in {("n2", "n3"), ("n3", "n2")}
    assert top.relative_change == pytest.approx(0.3) and not top.slowest_decile
    assert [c.relative_change for c in r.largest_changes] == pytest.approx([0.3, 0.05])


def test_a_slow_pair_changing_asks_for_a_replan() -> None:
    r = compare_clusters(five(), five({(0, 1): 6.5}))
    assert r.gpu_pairs_changed == 1 and r.slow_pairs_changed == 1 and r.replan_recommended
    assert "slowest decile" in r.verdict and r.verdict.startswith("re-plan recommended")
    # the same +30 % under a 0.35 threshold is no change at all
    assert not compare_clusters(five(), five({(0, 1): 6.5}), threshold=0.35).replan_recommended


def test_a_fast_pair_that_becomes_one_of_the_slowest_counts() -> None:
    r = compare_clusters(five(), five({(3, 4): 4.0}))
    assert r.slow_pairs_changed == 1 and r.replan_recommended


def test_new_failures_and_recoveries() -> None:
    failed = five({(2, 3): 0.0})
    r = compare_clusters(five(), failed)
    assert r.new_failures == (("n2", "n3"),) and r.new_failed_gpu_pairs == 1
    assert r.replan_recommended and "newly failed" in r.verdict
    assert r.largest_changes[0].relative_change == -1.0
    back = compare_clusters(failed, five())
    assert back.recovered == (("n2", "n3"),) and back.recovered_gpu_pairs == 1
    assert back.new_failed_gpu_pairs == 0 and not back.replan_recommended
    assert back.largest_changes[0].relative_change is None  # recoveries come first


def test_gpu_pairs_are_unordered_and_include_intra_node_pairs() -> None:
    base = [[0, 10, 10], [10, 0, 10], [10, 10, 0]]
    a = cluster(base, gpus_per_node=2)
    changed = np.array(base, dtype=float)
    changed[0, 1] = 13.0  # one direction only: the 4 GPU pairs of n0-n1 change
    r = compare_clusters(a, cluster(changed, gpus_per_node=2))
    assert r.gpu_pairs == 15 and r.gpu_pairs_changed == 4
    assert r.node_pairs == 3 and r.node_pairs_changed == 1
    # every inter-node pair ties at 10 GB/s, the 10th percentile: all are "slowest"
    assert r.slow_pairs_changed == 4 and r.replan_recommended
    intra = a.bandwidth_bytes_per_s.copy()
    intra[0, 1] = 100 * GB  # GPU 0 -> GPU 1 inside n0
    b = a.model_copy(update={"bandwidth_bytes_per_s": intra})
    r = compare_clusters(a, b)
    assert r.gpu_pairs_changed == 1 and r.node_pairs_changed == 0
    assert (r.largest_changes[0].src_node, r.largest_changes[0].dst_node) == ("n0", "n0")


def test_correlation_is_pearson_of_the_node_pairs() -> None:
    rng = np.random.default_rng(0)
    x = rng.uniform(10, 20, (6, 6))
    y = x + rng.normal(0, 2, (6, 6))
    np.fill_diagonal(x, 0)
    np.fill_diagonal(y, 0)
    r = compare_clusters(cluster(x), cluster(y), threshold=5)
    off = ~np.eye(6, dtype=bool)
    assert r.correlation == pytest.approx(np.corrcoef(x[off], y[off])[0, 1])
    flat = np.full((3, 3), 12.0)
    assert compare_clusters(cluster(flat), cluster(flat)).correlation is None


def test_nodes_are_matched_by_name() -> None:
    m = np.array([[0, 10, 20], [10, 0, 30], [20, 30, 0]], dtype=float)
    a = cluster(m, gpus_per_node=2, names=("x", "y", "z"))
    perm = [2, 0, 1]
    b = cluster(m[np.ix_(perm, perm)], gpus_per_node=2, names=("z", "x", "y"))
    assert compare_clusters(a, b).gpu_pairs_changed == 0
    assert compare_clusters(a, b, by_name=False).node_pairs_changed == 3


def test_bad_inputs_are_spec_errors() -> None:
    with pytest.raises(SpecError, match="expected the size of cluster A, 5 nodes x 1 GPUs"):
        compare_clusters(five(), cluster(np.full((4, 4), 10.0)))
    with pytest.raises(SpecError, match="'n4'"):
        compare_clusters(
            five(), cluster(np.full((5, 5), 10.0), names=("n0", "n1", "n2", "n3", "x"))
        )
    with pytest.raises(SpecError, match="threshold"):
        compare_clusters(five(), five(), threshold=0)


# ------------------------------------------------------------------ G6 snapshots
def oracle(a: ClusterSpec, b: ClusterSpec, threshold: float) -> tuple[int, int, int, bool]:
    """(changed GPU pairs, changed node pairs, new failed GPU pairs, re-plan), by loops
    over pairs, as the module doc states the rules."""
    x, y = a.bandwidth_bytes_per_s, b.bandwidth_bytes_per_s
    n = a.num_gpus
    alive_x = [x[i, j] for i in range(n) for j in range(n) if i != j and x[i, j] > 0]
    alive_y = [y[i, j] for i in range(n) for j in range(n) if i != j and y[i, j] > 0]
    cut_x, cut_y = np.quantile(alive_x, SLOW_QUANTILE), np.quantile(alive_y, SLOW_QUANTILE)

    def changed(u: float, v: float) -> bool:
        return (u > 0) != (v > 0) or (u > 0 and abs(v - u) / u > threshold)

    gpu_changed = new_failed = 0
    replan = False
    for i, j in itertools.combinations(range(n), 2):
        directions = [(x[i, j], y[i, j]), (x[j, i], y[j, i])]
        gpu_changed += any(changed(u, v) for u, v in directions)
        new_failed += any(u > 0 and v == 0 for u, v in directions)
        for u, v in directions:
            slow = (0 < u <= cut_x) or (0 < v <= cut_y)
            replan |= (u > 0 and v == 0) or (slow and changed(u, v) and u > 0)
    nx, ny = a.node_matrix(), b.node_matrix()
    node_changed = sum(
        changed(nx[i, j], ny[i, j]) or changed(nx[j, i], ny[j, i])
        for i, j in itertools.combinations(range(a.num_nodes), 2)
    )
    return gpu_changed, node_changed, new_failed, replan


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_g6_snapshots_match_the_oracle(seed: int) -> None:
    timeline = generate_timeline("failslow", nodes=8, seed=seed, snapshots=3, gpus_per_node=2)
    for a, b in itertools.combinations(timeline, 2):
        r = compare_clusters(a, b, threshold=0.1)
        got = (
            r.gpu_pairs_changed,
            r.node_pairs_changed,
            r.new_failed_gpu_pairs,
            r.replan_recommended,
        )
        assert got == oracle(a, b, 0.1)
        assert r.correlation is not None and -1 <= r.correlation <= 1
    same = compare_clusters(timeline[0], timeline[0])
    assert same.gpu_pairs_changed == 0 and not same.replan_recommended


def test_g6_snapshot_drift_is_seen() -> None:
    """Consecutive G6 snapshots correlate around 0.55 (docs/design.md); a 16-node pair of
    snapshots must show some change at a 5 % threshold and a correlation below 1."""
    t0, t1 = generate_timeline("failslow", nodes=16, seed=3, snapshots=2)
    r = compare_clusters(t0, t1, threshold=0.05)
    assert r.node_pairs == 120 and r.node_pairs_changed > 0
    assert r.correlation is not None and r.correlation < 0.99
    assert len(r.largest_changes) == 10
    sizes = [abs(c.relative_change) for c in r.largest_changes if c.relative_change is not None]
    assert sizes == sorted(sizes, reverse=True)
    pairs = [frozenset((c.src_node, c.dst_node)) for c in r.largest_changes]
    assert len(set(pairs)) == len(pairs)  # one row per node pair


# ------------------------------------------------------------------ CLI
def test_cli_compare_table_json_and_errors(tmp_path: Path) -> None:
    write_cluster_file(five(), tmp_path / "a.yaml")
    write_cluster_file(five({(0, 1): 6.5}), tmp_path / "b.yaml")
    write_cluster_file(cluster(np.full((4, 4), 10.0)), tmp_path / "small.yaml")
    result = runner.invoke(
        app, ["cluster", "compare", str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml")]
    )
    assert result.exit_code == 0, result.output
    assert "GPU pairs changed > 20%: 1 of 10" in result.output
    assert "n0:0 -> n1:0" in result.output or "n1:0 -> n0:0" in result.output
    assert "re-plan recommended" in result.output
    result = runner.invoke(
        app,
        [
            "cluster",
            "compare",
            str(tmp_path / "a.yaml"),
            str(tmp_path / "b.yaml"),
            "--json",
            "--threshold",
            "0.5",
        ],
    )
    data = json.loads(result.output)
    assert data["gpu_pairs_changed"] == 0 and data["verdict"].startswith("plan still valid")
    result = runner.invoke(
        app, ["cluster", "compare", str(tmp_path / "a.yaml"), str(tmp_path / "small.yaml")]
    )
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "error:" in result.output


def test_cli_compare_reads_nccl_tests_directories(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    shutil.copytree(NCCL_PAIRWISE, logs)
    result = runner.invoke(app, ["cluster", "compare", str(logs), str(logs)])
    assert result.exit_code == 0, result.output
    assert "plan still valid" in result.output and "of 6" in result.output
