"""One-node clusters: every generator, the cluster file, the statistics, ``show``,
``solve`` and ``export`` (a node alone has no inter-node pair; nothing may need one)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from pipette_cp.api import solve
from pipette_cp.cli import app
from pipette_cp.clusters.generators.registry import (
    GENERATORS,
    check_targets,
    generate,
    generate_timeline,
)
from pipette_cp.clusters.generators.targets import measure, measure_timeline
from pipette_cp.clusters.stats import cluster_stats, snapshot_correlation
from pipette_cp.errors import SpecError
from pipette_cp.io.cluster_file import cluster_from_mapping, read_cluster_file, write_cluster_file
from pipette_cp.io.model_file import load_model
from pipette_cp.specs import ClusterSpec, Instance, SearchSpace, TrainingSpec
from pipette_cp.units import GB

runner = CliRunner()
#: The kinds that make a one-node cluster (G4's pods meet only across node pairs).
KINDS = sorted(set(GENERATORS) - {"oversubscribed"})
#: Each kind's intra-node GPU pair bandwidth by default, GB/s (G5: one NVLink).
INTRA_GB = {"healthy-a100": 235, "h100-multileaf": 367, "degraded": 235, "v100-cube": 22.5,
            "failslow": 235}  # fmt: skip


def run(*args: str) -> tuple[int, str]:
    """Exit code and output, its whitespace runs made single spaces (rich wraps lines)."""
    result = runner.invoke(app, list(args))
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("gpus", [1, 8])
def test_every_kind_makes_one_node(kind: str, gpus: int) -> None:
    gpn = 8 if kind == "v100-cube" else gpus
    cluster = generate(kind, nodes=1, seed=4, gpus_per_node=gpn)
    assert cluster.num_nodes == 1 and cluster.num_gpus == gpn
    assert cluster.name == f"{GENERATORS[kind].alias}-{kind}-n1-s4"
    assert not cluster.failed_mask.any()
    if gpn > 1:
        assert cluster.bandwidth_bytes_per_s[0, 1] == pytest.approx(INTRA_GB[kind] * GB)
    assert cluster == generate(kind, nodes=1, seed=4, gpus_per_node=gpn)


def test_one_node_is_the_base_node_of_the_unhealthy_kinds() -> None:
    """G3 degrades and G6 slows node pairs: with no pair their node is G1's."""
    healthy = generate("healthy-a100", nodes=1, seed=0).bandwidth_bytes_per_s
    for kind in ("degraded", "failslow"):
        assert np.array_equal(generate(kind, nodes=1, seed=0).bandwidth_bytes_per_s, healthy)


def test_a_one_node_timeline_does_not_drift() -> None:
    timeline = generate_timeline("failslow", nodes=1, seed=1, snapshots=4, slow_nic_fraction=0.5)
    assert [c.name for c in timeline] == [f"g6-failslow-n1-s1-t{t:02d}" for t in range(4)]
    first = timeline[0].bandwidth_bytes_per_s
    assert all(np.array_equal(c.bandwidth_bytes_per_s, first) for c in timeline)


@pytest.mark.parametrize("kind", sorted(GENERATORS))
def test_no_node_is_refused(kind: str) -> None:
    with pytest.raises(SpecError) as info:
        generate(kind, nodes=0, seed=0)
    assert str(info.value) == "nodes=0: must be >= 1"


def test_oversubscribed_pods_need_two_nodes() -> None:
    with pytest.raises(SpecError) as info:
        generate("oversubscribed", nodes=1, seed=0, pod_size=1)
    assert info.value.field == "nodes"
    assert str(info.value) == (
        "nodes=1: must be >= 2 for oversubscribed (its pods meet only across node pairs)"
    )


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("decimals", [3, None])
def test_file_round_trip(kind: str, decimals: int | None, tmp_path: Path) -> None:
    cluster = generate(kind, nodes=1, seed=2)
    path = tmp_path / "one.yaml"
    write_cluster_file(cluster, path, decimals=decimals)
    data = yaml.safe_load(path.read_text())
    assert data["node_bandwidth_gb_per_s"] == [[None]] and data["node_names"] == ["node000"]
    again = read_cluster_file(path)
    assert again == cluster


def _one_node(**over: object) -> dict[str, object]:
    """The fields of a one-node B200 file; a field set to None is left out."""
    base = {"gpu": "b200", "gpus_per_node": 8, "num_nodes": 1, "nic_bandwidth_gb_per_s": 50}
    return {k: v for k, v in {**base, **over}.items() if v is not None}


def test_a_one_node_file_needs_no_matrix() -> None:
    cluster = cluster_from_mapping(_one_node())
    assert cluster.describe() == "1 x 8 B200-SXM-180GB, 8 NICs x 50.0 GB/s"
    assert cluster.bandwidth_bytes_per_s[0, 7] == pytest.approx(900 * GB)  # NVLink, one way
    named = cluster_from_mapping(_one_node(num_nodes=None, node_names=["hgx01"]))
    assert named.node_names == ("hgx01",) and named.num_nodes == 1
    nominal = cluster_from_mapping(_one_node(nominal=True, inter_node_bandwidth_gb_per_s=25))
    assert np.array_equal(nominal.bandwidth_bytes_per_s, cluster.bandwidth_bytes_per_s)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (_one_node(nic_bandwidth_gb_per_s=None),
         "cluster.nic_bandwidth_gb_per_s=None: needed for one node (no inter-node pair to "
         "take the median of)"),
        (_one_node(num_nodes=2),
         "cluster=[]: give exactly one of node_bandwidth_gb_per_s, gpu_bandwidth_gb_per_s, "
         "nominal"),
        (_one_node(num_nodes=0), "cluster=[]: give exactly one of node_bandwidth_gb_per_s, "
         "gpu_bandwidth_gb_per_s, nominal"),
        (_one_node(node_names=["a"], num_nodes=3), "cluster.num_nodes=3: the matrix has 1 nodes"),
    ],
)  # fmt: skip
def test_bad_one_node_files_are_one_line(fields: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError) as info:
        cluster_from_mapping(fields)
    assert str(info.value) == message


def test_statistics_of_no_pair() -> None:
    cluster = generate("degraded", nodes=1, seed=0)
    stats = cluster_stats(cluster)
    assert stats.num_pairs == 0 and stats.median_bytes_per_s == 0.0
    assert stats.degraded_fraction == stats.failed_fraction == stats.asymmetry_max == 0.0
    assert stats.cross_vs_same_group_ratio is None
    assert set(measure(cluster).values()) == {None}  # nothing measured, so no target missed
    assert check_targets("degraded", cluster) == []
    timeline = generate_timeline("failslow", nodes=1, seed=0, snapshots=3)
    assert measure_timeline(timeline)["snapshot_correlation"] is None
    assert check_targets("failslow", timeline) == []
    one = timeline[0].node_matrix()
    assert snapshot_correlation(one, one) == 1.0


def test_cli_generate_show_and_refusals(tmp_path: Path) -> None:
    out = tmp_path / "one.yaml"
    code, text = run("cluster", "generate", "g1", "--nodes", "1", "-o", str(out))
    assert code == 0 and "1 x 8 A100-SXM4-80GB" in text, text
    code, text = run("show", str(out))
    assert code == 0 and "inter-node" in text and "none (one node" in text, text
    assert "healthy CV" not in text  # no node pair, no inter-node statistics
    code, text = run("cluster", "generate", "g6", "-n", "1", "--snapshots", "2", "-o", str(out))
    assert code == 0 and (tmp_path / "one-t01.yaml").exists(), text
    for args, message in (
        (["g1", "--nodes", "0"], "error: nodes=0: must be >= 1"),
        (["g4", "--nodes", "1"], "error: nodes=1: must be >= 2 for oversubscribed (its pods "
                                 "meet only across node pairs)"),
    ):  # fmt: skip
        code, text = run("cluster", "generate", *args, "-o", str(tmp_path / "x.yaml"))
        assert code == 2 and text.strip() == message


def test_cli_import_of_a_one_node_matrix(tmp_path: Path) -> None:
    csv = tmp_path / "m.csv"
    csv.write_text("node,hgx01\nhgx01,\n")
    out = tmp_path / "m.yaml"
    code, text = run("cluster", "import", "csv", str(csv), "--gpu", "mi300x", "-o", str(out))
    assert code == 2
    assert (
        text.strip() == "error: --nic-gb-per-s=None: needed: the matrix has no live inter-node pair"
    )
    code, text = run("cluster", "import", "csv", str(csv), "--gpu", "mi300x", "-o", str(out),
                     "--nic-gb-per-s", "50", "--intra-gb-per-s", "64")  # fmt: skip
    assert code == 0, text
    cluster = read_cluster_file(out)
    assert cluster.node_names == ("hgx01",) and cluster.bandwidth_bytes_per_s[0, 1] == 64 * GB


def _instance(cluster: ClusterSpec) -> Instance:
    return Instance(
        name="tiny-llama-one-node",
        model=load_model("tiny-llama"),
        cluster=cluster,
        training=TrainingSpec(global_batch_size=32, seq_length=1024),
        search_space=SearchSpace(pp=(1, 2, 4), tp=(1, 2, 4, 8)),
    )


@pytest.mark.slow
@pytest.mark.parametrize("method", ["cpsat", "milp", "greedy"])
def test_solve_on_one_node(method: str) -> None:
    inst = _instance(cluster_from_mapping(_one_node()))
    plans = solve(inst, method=method, top_k=3, time_limit_s=20)
    assert plans and all(p.evaluation.fits and p.num_gpus == 8 for p in plans)
    best = plans[0]
    assert best.dp * best.pp * best.tp == 8
    times = [p.evaluation.iteration_time_s for p in plans]
    assert times == sorted(times)


@pytest.mark.slow
def test_solve_and_export_on_one_node_from_the_cli(tmp_path: Path) -> None:
    cluster_file = tmp_path / "mi300x.yaml"
    write_cluster_file(cluster_from_mapping(_one_node(gpu="mi300x")), cluster_file)
    inst = tmp_path / "inst.yaml"
    inst.write_text(yaml.safe_dump({
        "name": "one-mi300x", "model": "tiny-llama",
        "cluster": yaml.safe_load(cluster_file.read_text()),
        "training": {"global_batch_size": 32, "seq_length": 1024},
    }))  # fmt: skip
    plan = tmp_path / "plan.json"
    code, text = run("solve", str(inst), "--time-limit", "20", "--pp", "2", "--tp", "2",
                     "-o", str(plan))  # fmt: skip
    assert code == 0, text
    saved = json.loads(plan.read_text())
    assert (saved["pp"], saved["tp"], saved["dp"]) == (2, 2, 2)
    launch = tmp_path / "launch"
    code, text = run("export", str(plan), "--instance", str(inst), "--megatron",
                     "--hostfile", str(launch))  # fmt: skip
    assert code == 0, text
    assert "--pipeline-model-parallel-size 2" in text and "--attention-backend flash" in text
    rows = (launch / "rank_map.csv").read_text().splitlines()
    assert len(rows) == 1 + 8 and all(",node000," in r for r in rows[1:]), rows
