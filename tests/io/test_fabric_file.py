"""Fabric clusters in files and on the command line: the ``fabric:`` section of a cluster
file (inline and ``.npz`` exceptions), the ``fat-tree`` generator, ``import nccl-tests
--fabric`` and what ``show`` / ``cluster compare`` print for them."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from pipette_cp.cli import app
from pipette_cp.clusters.generators.fat_tree import fat_tree_cluster
from pipette_cp.clusters.generators.registry import generate, generate_timeline
from pipette_cp.errors import InputFileError, SpecError
from pipette_cp.io.cluster_file import (
    cluster_from_mapping,
    cluster_to_mapping,
    read_cluster_file,
    write_cluster_file,
)
from pipette_cp.io.fabric_file import INLINE_EXCEPTIONS_MAX
from pipette_cp.io.instance_file import instance_from_mapping
from pipette_cp.io.measurements.fabric_import import fabric_from_dense, levels_option
from pipette_cp.io.measurements.nccl_pairwise import convert_nccl_tests_dir
from tests.conftest import FIXTURES, ROOT

PAIRWISE = FIXTURES / "nccl" / "pairwise"
CLUSTER00 = ROOT / "instances" / "clusters" / "h100-cluster00.yaml"
runner = CliRunner()

BASE: dict[str, Any] = {
    "gpu": "h100", "gpus_per_node": 2, "num_nodes": 4,
    "fabric": {
        "nvlink_bandwidth_gb_per_s": 300,
        "levels": [{"name": "leaf", "nodes": 2, "bandwidth_gb_per_s": 40, "latency_us": 4},
                   {"name": "spine", "nodes": 4, "bandwidth_gb_per_s": 30}],
        "slow_nics": {"node": [3], "nic_factor": [0.5]},
        "node_pairs": {"src": [0, 1], "dst": [2, 0], "bandwidth_gb_per_s": [0, 12.5]},
        "gpu_pairs": {"src": [0], "dst": [1], "bandwidth_gb_per_s": [150]},
    },
}  # fmt: skip


def run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def small_tree(**params: Any) -> Any:
    return fat_tree_cluster(256, seed=3, leaf_nodes=2, pod_leaves=4, slow_nic_rate=0.1,
                            failed_pair_rate=0.01, **params)  # fmt: skip


# ------------------------------------------------------------------ the file format
def test_the_fields_mean_what_the_module_doc_says() -> None:
    c = cluster_from_mapping(copy.deepcopy(BASE))
    f = c.fabric
    assert c.bandwidth_bytes_per_s is None and f is not None and c.num_gpus == 8
    assert [lv.nodes for lv in f.levels] == [2, 4] and f.levels[1].latency_s == 10e-6
    assert f.levels[0].latency_s == 4e-6 and f.nvlink_latency_s == 5e-6  # file defaults
    m = c.matrix
    assert m[0, 1] == 150e9 and m[1, 0] == 300e9  # a GPU pair, NVLink
    assert m[0, 2] == 40e9 and m[0, 4] == 0.0 and m[2, 0] == 12.5e9  # leaf, failed, degraded
    assert m[0, 6] == 15e9  # spine x the slow NIC of node 3
    assert c.nic_bandwidth_bytes_per_s == 40e9  # default: one stream on the leaf


def test_round_trip_inline_is_equal(tmp_path: Path) -> None:
    cluster = small_tree()
    assert cluster.fabric is not None and cluster.fabric.node_pairs.src.size > 0
    path = tmp_path / "tree.yaml"
    write_cluster_file(cluster, path, decimals=None)
    assert not (tmp_path / "tree.npz").exists()
    data = yaml.safe_load(path.read_text())
    assert data["fabric"]["levels"][0] == {
        "name": "leaf", "nodes": 2, "bandwidth_gb_per_s": 46.0, "latency_us": 5.0}  # fmt: skip
    assert read_cluster_file(path) == cluster
    assert cluster_from_mapping(cluster_to_mapping(cluster, decimals=None)) == cluster
    rounded = read_cluster_file(write_and(cluster, tmp_path / "rounded.yaml"))
    assert rounded != cluster  # 3 decimals of GB/s: within 1 MB/s
    diff = rounded.fabric.node_pairs.bandwidth_bytes_per_s - cluster.fabric.node_pairs.bandwidth_bytes_per_s  # type: ignore[union-attr]  # fmt: skip
    assert np.abs(diff).max() <= 0.5e6


def write_and(cluster: Any, path: Path) -> Path:
    write_cluster_file(cluster, path)
    return path


def test_many_exceptions_go_to_an_exact_sidecar(tmp_path: Path) -> None:
    cluster = fat_tree_cluster(4096, seed=1, leaf_nodes=8, pod_leaves=4, degraded_pair_rate=0.05)
    assert cluster.fabric is not None
    assert cluster.fabric.node_pairs.src.size > INLINE_EXCEPTIONS_MAX
    path = write_and(cluster, tmp_path / "big.yaml")
    assert yaml.safe_load(path.read_text())["fabric"]["exceptions"] == "big.npz"
    assert read_cluster_file(path) == cluster  # bytes/s at full precision


@pytest.mark.slow
def test_a_100k_gpu_tree_round_trips_in_seconds(tmp_path: Path) -> None:
    cluster = fat_tree_cluster(100_000, leaf_nodes=25, pod_leaves=20)
    start = time.perf_counter()
    path = write_and(cluster, tmp_path / "ft100k.yaml")
    back = read_cluster_file(path)
    took = time.perf_counter() - start
    assert back == cluster and back.num_gpus == 100_000
    sizes = path.stat().st_size, (tmp_path / "ft100k.npz").stat().st_size
    assert sizes[0] < 1e6 and sizes[1] < 40e6, sizes
    assert took < 30, took  # about 3 s on 2 cores


def _edit(path: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    *keys, last = path.split(".")
    node = data
    for key in keys:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if value is _DROP:
        del node[last]
    else:
        node[last] = value
    return data


_DROP = object()
BAD = [
    ("fabric.levels.1.nodes", 3, "cluster.fabric.levels[1].nodes=3: must be a multiple of the level below's 2"),
    ("fabric.levels.1.nodes", 8, "cluster.fabric.levels[1].nodes=8: the last level must hold every one of the 4 nodes"),
    ("fabric.levels", [], "cluster.fabric.levels=[]: expected a non-empty list"),
    ("fabric.levels.0.nodes", _DROP, "cluster.fabric.levels[0].nodes=None: missing"),
    ("fabric.levels.0.bandwidth_gb_per_s", -1, "cluster.fabric.levels[0].bandwidth_gb_per_s=-1: expected a bandwidth"),
    ("fabric.levels.0.speed", 1, "cluster.fabric.levels[0].speed=1: unknown field"),
    ("fabric.levels.0.latency_us", 2e6, "cluster.fabric.levels[0].latency_us=2000000.0: expected 0 to"),
    ("fabric.node_pairs.dst", [2, 9], "cluster.fabric.node_pairs.dst[1]=9: no such node: the fabric has 4"),
    ("fabric.node_pairs.dst", [2], "cluster.fabric.node_pairs=[2, 1, 2]: its arrays must have one length"),
    ("fabric.node_pairs.src", [0, "a"], "cluster.fabric.node_pairs.src[1]='a': expected an index >= 0"),
    ("fabric.node_pairs.bandwidth_gb_per_s", [0, 1e-9], "cluster.fabric.node_pairs.bandwidth_gb_per_s[1]=1e-09: expected 0 (failed) or 0.001"),
    ("fabric.node_pairs.dst", [0, 0], "cluster.fabric.node_pairs.dst[0]=0: a pair needs two different ends"),
    ("fabric.gpu_pairs.src", [8], "cluster.fabric.gpu_pairs.src[0]=8: no such GPU: the fabric has 8"),
    ("fabric.slow_nics.nic_factor", [1.5], "cluster.fabric.slow_nics.nic_factor[0]=1.5: must be in (0, 1]"),
    ("fabric.slow_nics.node", [4], "cluster.fabric.slow_nics.node[0]=4: no such node"),
    ("fabric.links", 1, "cluster.fabric.links=1: unknown field"),
    ("fabric.exceptions", "x.npz", "cluster.fabric.slow_nics='{...}': give the exceptions inline or in fabric.exceptions"),
    ("num_nodes", 6, "cluster.fabric.levels[1].nodes=4: the last level must hold every one of the 6 nodes"),
    ("intra_node_bandwidth_gb_per_s", 100, "cluster.intra_node_bandwidth_gb_per_s=100: a fabric gives fabric.nvlink_bandwidth_gb_per_s"),
    ("nominal", True, "cluster=['nominal', 'fabric']: give exactly one of node_bandwidth_gb_per_s, gpu_bandwidth_gb_per_s, nominal, fabric"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "value", "message"), BAD)
def test_bad_fields_are_one_line_naming_field_value_and_rule(path: str, value: Any, message: str) -> None:  # fmt: skip
    with pytest.raises(SpecError) as info:
        cluster_from_mapping(_edit(path, value))
    text = str(info.value)
    assert text.startswith(message) and "\n" not in text, text


def test_a_node_cut_off_by_failed_pairs_is_refused() -> None:
    data = _edit("fabric.node_pairs", {"src": [0, 0, 0, 1, 2, 3], "dst": [1, 2, 3, 0, 0, 0],
                                       "bandwidth_gb_per_s": [0] * 6})  # fmt: skip
    with pytest.raises(SpecError, match=r"node 0 .* has every outgoing inter-node link failed"):
        cluster_from_mapping(data)


def _sidecar(tmp_path: Path, **arrays: Any) -> Path:
    cluster = cluster_from_mapping(copy.deepcopy(BASE))
    path = tmp_path / "c.yaml"
    data = cluster_to_mapping(cluster)
    for key in ("slow_nics", "node_pairs", "gpu_pairs"):
        data["fabric"].pop(key)
    data["fabric"]["exceptions"] = "c.npz"
    path.write_text(yaml.safe_dump(_plain(data)))
    if arrays is not None:
        base = {"format": np.array("pipette-cp-fabric-exceptions/1"),
                "node_pairs.src": np.array([0, 1]), "node_pairs.dst": np.array([2, 0]),
                "node_pairs.bandwidth_bytes_per_s": np.array([0.0, 12.5e9])}  # fmt: skip
        base.update(arrays)
        with (tmp_path / "c.npz").open("wb") as fh:
            np.savez_compressed(fh, **{k: v for k, v in base.items() if v is not None})
    return path


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return [_plain(v) for v in value] if isinstance(value, list) else value


@pytest.mark.parametrize(("arrays", "message"), [
    ({}, None),
    ({"node_pairs.dst": np.array([2])}, "cluster.fabric.exceptions[c.npz].node_pairs=[2, 1, 2]: its arrays must have one length"),
    ({"node_pairs.src": np.array([0, 7])}, "cluster.fabric.exceptions[c.npz].node_pairs.src[1]=7: no such node"),
    ({"node_pairs.src": np.array([0.0, 1.0])}, "cluster.fabric.exceptions[c.npz].node_pairs.src='float64[2]': expected a 1-D array of integers"),
    ({"node_pairs.bandwidth_bytes_per_s": np.array([0.0, -1.0])}, "cluster.fabric.exceptions[c.npz].node_pairs.bandwidth_bytes_per_s[1]=-1.0: expected 0 (failed)"),
    ({"node_pairs.speed": np.array([1])}, "cluster.fabric.exceptions[c.npz].node_pairs.speed='array': unknown array"),
    ({"format": None}, "cluster.fabric.exceptions[c.npz].format=None: expected 'pipette-cp-fabric-exceptions/1'"),
])  # fmt: skip
def test_sidecar_arrays_are_checked(tmp_path: Path, arrays: dict[str, Any], message: str | None) -> None:  # fmt: skip
    path = _sidecar(tmp_path, **arrays)
    if message is None:
        assert read_cluster_file(path).matrix[2, 0] == 12.5e9
        return
    with pytest.raises(InputFileError) as info:
        read_cluster_file(path)
    assert str(info.value) == f"{path}: {message}" or message in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


def test_a_missing_or_broken_sidecar_is_one_line(tmp_path: Path) -> None:
    path = _sidecar(tmp_path)
    (tmp_path / "c.npz").unlink()
    code, out = run("show", str(path))
    assert code == 2 and "cluster.fabric.exceptions='c.npz': no such file" in out, out
    (tmp_path / "c.npz").write_bytes(b"not a zip")
    code, out = run("show", str(path))
    assert code == 2 and "not a readable .npz file" in out and "Traceback" not in out, out


# ------------------------------------------------------------------ the generator
def test_fat_tree_is_a_generator_kind_with_its_parameters(tmp_path: Path) -> None:
    cluster = generate("fat-tree", gpus=16384, seed=0)
    assert cluster.fabric is not None and cluster.num_gpus == 16384
    assert cluster == fat_tree_cluster(16384, seed=0)
    set_ = generate("ft", nodes=64, seed=2, leaf_nodes=4, pod_leaves=4, slow_nic_rate=0.25)
    assert set_.fabric is not None and set_.fabric.slow_nics.node.size == 16
    inst = instance_from_mapping({
        "model": "tiny-gpt", "training": {"global_batch_size": 8, "seq_length": 256},
        "cluster": {"generator": {"kind": "fat-tree", "gpus": 512, "seed": 2, "leaf_nodes": 4,
                                  "pod_leaves": 4, "slow_nic_rate": 0.25}}})  # fmt: skip
    assert inst.cluster == set_


@pytest.mark.parametrize(("call", "message"), [
    (lambda: generate("fat-tree", seed=0), "gpus=None: give exactly one of gpus and nodes"),
    (lambda: generate("fat-tree", gpus=100, seed=0), "gpus=100: must be a positive multiple of 8"),
    (lambda: generate("fat-tree", gpus=64, seed=0, leaf="4"), "fat-tree.leaf='4': unknown parameter"),
    (lambda: generate("fat-tree", gpus=64, seed=0, leaf_nodes=0), "fat-tree.leaf_nodes=0: must be >= 1"),
    (lambda: generate("fat-tree", gpus=64, seed=0, slow_nic_rate=2), "fat-tree.slow_nic_rate=2: must be in [0, 1]"),
    (lambda: generate("fat-tree", gpus=64, seed=0, gpus_per_node=4), "gpus_per_node=4: fat-tree nodes hold 8 GPUs"),
    (lambda: generate_timeline("fat-tree", nodes=8, seed=0, snapshots=2), "generator.kind='fat-tree': a hierarchical cluster"),
    (lambda: generate("g9", nodes=2, seed=0), "generator.kind='g9': unknown generator; known: healthy-a100"),
])  # fmt: skip
def test_bad_generator_calls(call: Any, message: str) -> None:
    with pytest.raises(SpecError) as info:
        call()
    assert str(info.value).startswith(message), str(info.value)


def test_cli_generate_fat_tree_writes_a_fabric_file(tmp_path: Path) -> None:
    out = tmp_path / "ft.yaml"
    code, text = run("cluster", "generate", "fat-tree", "--gpus", "16384", "--seed", "0", "-o", str(out))  # fmt: skip
    assert code == 0 and "levels leaf 32 x 46 GB/s" in text, text
    assert read_cluster_file(out) == fat_tree_cluster(16384, seed=0)
    code, text = run("show", str(out))  # 16,384 GPUs: the matrix would be refused
    assert code == 0 and "level spine" in text and "83,845 degraded" in text, text
    code, text = run("cluster", "compare", str(out), str(out))
    assert code == 2 and "needs the GPU x GPU matrix" in text and "Traceback" not in text
    code, text = run("cluster", "generate", "fat-tree", "--gpus", "64", "-o", str(out),
                     "--set", "leaf_nodes=x")  # fmt: skip
    assert code == 2 and "fat-tree.leaf_nodes='x': expected an integer" in text


def test_show_and_compare_small_fabrics(tmp_path: Path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    write_cluster_file(small_tree(), a)
    write_cluster_file(small_tree(degraded_factor=0.25), b)
    code, text = run("show", str(a))
    assert code == 0 and "Failed pairs" in text and "Slowest node pairs" in text, text
    code, text = run("cluster", "compare", str(a), str(b), "--json")
    assert code == 0 and '"gpu_pairs_changed"' in text, text


# ------------------------------------------------------------------ measurements
def _reproduces(fabric: Any, dense: Any, tolerance: float) -> None:
    f, d = fabric.matrix, dense.matrix
    assert np.array_equal(f <= 0, d <= 0)  # failed pairs exactly failed
    assert (np.abs(f - d) <= tolerance * f + 1e-3).all()


def test_an_nccl_import_as_a_fabric_reproduces_the_dense_one() -> None:
    dense = convert_nccl_tests_dir(PAIRWISE)
    levels = levels_option("leaf:2,spine", dense.num_nodes, dense.inter_node_latency_s)
    fabric = fabric_from_dense(dense, levels)
    _reproduces(fabric, dense, 0.1)
    f = fabric.fabric
    assert f is not None and f.node_pairs.src.size == 4  # 001-004 degraded, 002-008 failed
    assert sorted(zip(f.node_pairs.src.tolist(), f.node_pairs.dst.tolist(), strict=True)) == [
        (0, 2), (1, 3), (2, 0), (3, 1)]  # fmt: skip
    given = fabric_from_dense(dense, levels_option("leaf:2@13.5,spine@13.5", 4, 1e-5))
    assert [lv.bandwidth_bytes_per_s for lv in given.fabric.levels] == [13.5e9, 13.5e9]  # type: ignore[union-attr]  # fmt: skip


def test_the_bundled_17_node_measurement_as_a_fabric() -> None:
    dense = read_cluster_file(CLUSTER00)
    for tolerance in (0.1, 0.02):
        fabric = fabric_from_dense(dense, levels_option("spine", 17, 1e-5), tolerance=tolerance)
        _reproduces(fabric, dense, tolerance)
    assert fabric.fabric is not None and fabric.fabric.node_pairs.src.size < 17 * 16


def test_a_node_whose_every_pair_is_slow_is_a_slow_nic() -> None:
    n = 6
    node = np.full((n, n), 20.0)
    node[3, :] = node[:, 3] = 9.0
    node[0, 1] = node[1, 0] = 0.0
    rows = [[None if a == b else float(node[a, b]) for b in range(n)] for a in range(n)]
    dense = cluster_from_mapping(
        {"gpu": "h100", "gpus_per_node": 2, "node_bandwidth_gb_per_s": rows}
    )
    fabric = fabric_from_dense(dense, levels_option("leaf:2,spine", n, 1e-5))
    f = fabric.fabric
    assert f is not None and f.slow_nics.node.tolist() == [3] and f.slow_nics.nic_factor[0] == 0.45
    assert sorted(zip(f.node_pairs.src.tolist(), f.node_pairs.dst.tolist(), strict=True)) == [(0, 1), (1, 0)]  # fmt: skip
    _reproduces(fabric, dense, 0.1)


def test_cli_import_with_fabric(tmp_path: Path) -> None:
    out, levels = tmp_path / "imp.yaml", tmp_path / "levels.yaml"
    levels.write_text(
        "levels:\n- {name: leaf, nodes: 2}\n- {name: spine, bandwidth_gb_per_s: 13.4}\n"
    )
    code, text = run("cluster", "import", "nccl-tests", str(PAIRWISE), "-o", str(out), "--fabric", str(levels))  # fmt: skip
    assert code == 0 and "4 node pairs (2 failed)" in text, text
    _reproduces(read_cluster_file(out), convert_nccl_tests_dir(PAIRWISE), 0.1)
    for bad, message in (("leaf:3,spine", "--fabric.levels[1].nodes=4: must be a multiple"),
                         ("leaf:x", "--fabric[0]='leaf:x': expected name:nodes[@GB/s]")):  # fmt: skip
        code, text = run("cluster", "import", "nccl-tests", str(PAIRWISE), "-o", str(out), "--fabric", bad)  # fmt: skip
        assert code == 2 and message in text, text
    code, text = run("cluster", "import", "nccl-tests", str(PAIRWISE), "-o", str(out),
                     "--fabric", "spine", "--tolerance", "1.5")  # fmt: skip
    assert code == 2 and "--tolerance=1.5: must be a share in [0, 1)" in text


def test_a_sidecar_header_claiming_more_than_its_file_holds_is_refused_unread(tmp_path) -> None:
    """numpy allocates what an .npy header claims before reading a byte: the claim is
    checked against the member's size first (here 8 TB claimed by a 144-byte member)."""
    import io
    import zipfile

    import numpy as np
    import pytest

    from pipette_cp.errors import SpecError
    from pipette_cp.io.fabric_file import SIDECAR_FORMAT, read_exceptions

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        marker = io.BytesIO()
        np.save(marker, np.array(SIDECAR_FORMAT))
        archive.writestr("format.npy", marker.getvalue())
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            header, {"descr": "<f8", "fortran_order": False, "shape": (10**12,)}
        )
        archive.writestr("gpu_pairs.bandwidth_bytes_per_s.npy", header.getvalue() + bytes(16))
    (tmp_path / "x.npz").write_bytes(buf.getvalue())
    with pytest.raises(SpecError, match="its header claims 8000000000000 bytes"):
        read_exceptions("x.npz", "cluster.fabric.exceptions", tmp_path)
