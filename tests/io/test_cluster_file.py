"""The cluster file (io/cluster_file.py), CSV matrices and Pipette's JSON (io/matrix_files.py):
round trips and one-line errors."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pipette_cp.clusters.expand import cluster_from_node_matrix
from pipette_cp.errors import InputFileError, SpecError
from pipette_cp.io.cluster_file import (
    FORMAT,
    cluster_from_mapping,
    cluster_to_mapping,
    read_cluster_file,
    write_cluster_file,
)
from pipette_cp.io.matrix_files import (
    LabelledMatrix,
    cluster_from_matrix,
    read_matrix_csv,
    read_pipette_json,
    write_matrix_csv,
    write_pipette_json,
)
from pipette_cp.specs.cluster import ClusterSpec
from pipette_cp.specs.gpu import resolve_gpu
from pipette_cp.units import GB, MiB
from tests.conftest import FIXTURES
from tests.input_errors import refuses_missing_and_malformed

PIPETTE = FIXTURES / "pipette"


def node_cluster(node_gb: list[list[float]], g: int = 2, intra: Any = 300e9) -> ClusterSpec:
    return cluster_from_node_matrix(
        node_bandwidth=np.array(node_gb) * GB,
        intra_node=intra,
        gpus_per_node=g,
        gpu=resolve_gpu("a100"),
        nics_per_node=2,
        nic_bandwidth_bytes_per_s=25e9,
        name="t",
        node_names=("a", "b", "c"),
        source="test",
    )


NODE = [[0, 20.5, 10.25], [20.5, 0, 0], [10.25, 0, 0]]  # b - c failed


def base(**extra: Any) -> dict[str, Any]:
    data = {
        "format": FORMAT,
        "gpu": "A100",
        "gpus_per_node": 2,
        "nic_bandwidth_gb_per_s": 25,
        "node_bandwidth_gb_per_s": [[None, 20, 10], [20, None, 5], [10, 5, None]],
    }
    return data | extra


# ------------------------------------------------------------------ reading
def test_units_are_converted_once():
    cluster = cluster_from_mapping(
        base(intra_node_latency_us=4, inter_node_latency_us=12, intra_node_bandwidth_gb_per_s=200)
    )
    assert cluster.nic_bandwidth_bytes_per_s == 25e9
    assert cluster.nics_per_node == 2  # default: one NIC per GPU
    assert cluster.intra_node_latency_s == pytest.approx(4e-6)
    assert cluster.inter_node_latency_s == pytest.approx(12e-6)
    b = cluster.bandwidth_bytes_per_s
    assert b[0, 1] == 200e9 and b[0, 2] == 20e9 and b[3, 5] == 5e9 and b[0, 0] == 0
    assert cluster.node_names == ("node000", "node001", "node002")


def test_defaults_intra_node_to_nvlink_and_nic_to_the_median_pair():
    data = base()
    del data["nic_bandwidth_gb_per_s"]
    cluster = cluster_from_mapping(data)
    assert cluster.bandwidth_bytes_per_s[0, 1] == pytest.approx(300e9)  # A100 NVLink 600/2
    assert cluster.nic_bandwidth_bytes_per_s == pytest.approx(10e9)


def test_nominal_and_gpu_level_inputs():
    nominal = cluster_from_mapping(
        {"gpu": "h100", "gpus_per_node": 4, "num_nodes": 3, "nominal": True,
         "inter_node_bandwidth_gb_per_s": 40, "nic_bandwidth_gb_per_s": 50}
    )  # fmt: skip
    assert nominal.num_gpus == 12
    assert nominal.bandwidth_bytes_per_s[0, 4] == 40e9
    gpu_level = cluster_from_mapping(
        {"gpu": "a100", "gpus_per_node": 1, "nic_bandwidth_gb_per_s": 20,
         "gpu_bandwidth_gb_per_s": [[0, 20, 19], [21, 0, 18], [17, 16, 0]]}
    )  # fmt: skip
    assert gpu_level.bandwidth_bytes_per_s[1, 0] == 21e9  # asymmetric kept


def test_mixed_gpu_types_and_inline_gpu():
    custom = {
        "name": "X1", "memory_bytes": 64e9, "peak_flops_per_s": 5e14,
        "hbm_bandwidth_bytes_per_s": 2e12, "nvlink_bandwidth_bytes_per_s": 0,
    }  # fmt: skip
    data = base(node_gpu_types=["a100", "H100", custom], intra_node_bandwidth_gb_per_s=100)
    del data["gpu"]
    cluster = cluster_from_mapping(data)
    assert cluster.node_gpu_types == ("A100-SXM4-80GB", "H100-SXM5-80GB", "X1")
    assert cluster.gpu_of_node(2).memory_bytes == 64e9
    del data["intra_node_bandwidth_gb_per_s"]  # X1 has no NVLink: intra-node needed
    with pytest.raises(SpecError, match="intra_node_bandwidth_gb_per_s"):
        cluster_from_mapping(data)


@pytest.mark.parametrize(
    ("edit", "field", "message"),
    [
        ({"node_bandwidth_gb_per_s": [[0, 1], [1, 0, 2]]}, r"node_bandwidth_gb_per_s\[1\]", "square"),
        ({"node_bandwidth_gb_per_s": [[0, 1], [float("nan"), 0]]}, r"\[1\]\[0\]", "finite"),
        ({"node_bandwidth_gb_per_s": [[0, -1], [1, 0]]}, r"\[0\]\[1\]", "finite"),
        ({"node_bandwidth_gb_per_s": [[0, "fast"], [1, 0]]}, r"\[0\]\[1\]", "bandwidth"),
        ({"node_bandwidth_gb_per_s": [[0, 5, 0], [5, 0, 0], [0, 0, 0]]}, "cluster", "every inter-node link failed"),
        ({"gpu": "Z9000"}, "gpu", "unknown GPU"),
        ({"gpus_per_node": 0}, "gpus_per_node", "positive integer"),
        ({"nic_bandwidth_gb_per_s": 0}, "nic_bandwidth_gb_per_s", "> 0"),
        ({"nic_bandwidth_gb_per_s": "fast"}, "nic_bandwidth_gb_per_s", "finite number"),
        ({"nic_bandwith_gb_per_s": 1}, "nic_bandwith_gb_per_s", "unknown field"),
        ({"nic_bandwidth": 1}, "nic_bandwidth", "unit suffix"),
        ({"format": "other/2"}, "format", FORMAT),
        ({"nominal": True}, "cluster", "exactly one of"),
        ({"num_nodes": 4}, "num_nodes", "3 nodes"),
        ({"node_names": ["a", "b"]}, "node_names", "expected 3 entries"),
        ({"node_groups": [0, 1]}, "node_groups", "expected 3 entries"),
        ({"node_gpu_types": ["a100"] * 3}, "cluster", "exactly one of gpu, node_gpu_types"),
        ({"intra_node_bandwidth_gb_per_s": [[0, 1, 2]] * 3}, "intra_node", "2 x 2"),
        ({"gpu_bandwidth_gb_per_s": [[0, 1, 1], [1, 0, 1], [1, 1, 0]], "node_bandwidth_gb_per_s": None}, "gpu_bandwidth", "multiple of gpus_per_node=2"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_naming_the_field(edit, field, message):
    with pytest.raises(SpecError, match=message) as info:
        cluster_from_mapping(base(**edit))
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith("cluster")
    assert re.search(field, text.split("=")[0])


def test_file_errors(tmp_path: Path):
    bad = refuses_missing_and_malformed(
        read_cluster_file, tmp_path / "bad.yaml", "format: [unclosed\n", "malformed YAML at line"
    )
    bad.write_text("name: x\n")
    with pytest.raises(InputFileError, match="expected 'pipette-cp-cluster/1'"):
        read_cluster_file(bad)
    bad.write_text(yaml.safe_dump(base(gpu="Z9000")))
    with pytest.raises(InputFileError, match=r"bad.yaml: cluster.gpu='Z9000': unknown GPU"):
        read_cluster_file(bad)


# ------------------------------------------------------------------ writing
def test_node_level_round_trip_with_failed_pair(tmp_path: Path):
    cluster = node_cluster(NODE)
    path = tmp_path / "c.yaml"
    write_cluster_file(cluster, path, header="first line\n\nthird line")
    text = path.read_text()
    assert text.startswith("# first line\n#\n# third line\nformat: pipette-cp-cluster/1\n")
    assert "- [null, 20.5, 10.25]" in text  # one flow-style row per node
    data = yaml.safe_load(text)
    assert data["node_bandwidth_gb_per_s"][1] == [20.5, None, 0.0]
    assert data["intra_node_bandwidth_gb_per_s"] == 300.0
    assert data["gpu"] == "A100-SXM4-80GB"
    back = read_cluster_file(path)
    assert back.model_dump() == cluster.model_dump() | {"bandwidth_bytes_per_s": back.bandwidth_bytes_per_s.tolist()}  # fmt: skip
    np.testing.assert_array_equal(back.bandwidth_bytes_per_s, cluster.bandwidth_bytes_per_s)


def test_writer_picks_nominal_node_or_gpu_level():
    uniform = node_cluster([[0, 40, 40], [40, 0, 40], [40, 40, 0]])
    data = cluster_to_mapping(uniform)
    assert data["nominal"] is True and data["inter_node_bandwidth_gb_per_s"] == 40.0
    assert "node_bandwidth_gb_per_s" not in data
    assert cluster_from_mapping(data).model_dump() == uniform.model_dump()
    matrix = uniform.bandwidth_bytes_per_s.copy()
    matrix[0, 2] = 39e9  # one GPU pair differs: no longer a node expansion
    noisy = ClusterSpec.model_validate(uniform.model_dump() | {"bandwidth_bytes_per_s": matrix})
    data = cluster_to_mapping(noisy)
    assert "gpu_bandwidth_gb_per_s" in data and "intra_node_bandwidth_gb_per_s" not in data
    np.testing.assert_array_equal(cluster_from_mapping(data).bandwidth_bytes_per_s, matrix)


def test_non_uniform_intra_node_is_written_as_a_matrix():
    intra = np.array([[0, 45, 22.5, 10], [45, 0, 10, 22.5], [22.5, 10, 0, 45], [10, 22.5, 45, 0]])
    cluster = node_cluster(NODE, g=4, intra=intra * GB)
    data = cluster_to_mapping(cluster)
    assert data["intra_node_bandwidth_gb_per_s"][0] == [0.0, 45.0, 22.5, 10.0]
    np.testing.assert_array_equal(
        cluster_from_mapping(data).bandwidth_bytes_per_s, cluster.bandwidth_bytes_per_s
    )


def test_mixed_and_custom_gpus_round_trip():
    data = base(node_gpu_types=["a100", "h100", "v100"])
    del data["gpu"]
    cluster = cluster_from_mapping(data)
    out = cluster_to_mapping(cluster)
    assert out["node_gpu_types"] == ["A100-SXM4-80GB", "H100-SXM5-80GB", "V100-SXM2-32GB"]
    assert cluster_from_mapping(out).model_dump() == cluster.model_dump()
    custom = resolve_gpu("a100").model_copy(update={"name": "A100-custom", "memory_bytes": 1e9})
    one = cluster_from_mapping(base(gpu=custom.model_dump()))
    assert cluster_to_mapping(one)["gpu"]["memory_bytes"] == 1e9


def test_rounding_to_decimals():
    cluster = node_cluster([[0, 20.123456, 10], [20.123456, 0, 10], [10, 10, 0]])
    assert cluster_to_mapping(cluster)["node_bandwidth_gb_per_s"][0][1] == 20.123
    assert cluster_to_mapping(cluster, decimals=None)["node_bandwidth_gb_per_s"][0][1] == pytest.approx(20.123456)  # fmt: skip


@settings(max_examples=25, deadline=None)
@given(
    st.integers(2, 5).flatmap(
        lambda n: st.lists(
            st.lists(st.floats(0.5, 400, allow_nan=False), min_size=n, max_size=n),
            min_size=n,
            max_size=n,
        )
    ),
    st.integers(1, 3),
)
def test_any_node_matrix_round_trips_exactly(rows: list[list[float]], g: int):
    node = np.array(rows) * GB
    n = node.shape[0]
    cluster = cluster_from_node_matrix(
        node_bandwidth=node, intra_node=123e9, gpus_per_node=g, gpu=resolve_gpu("h100"),
        nics_per_node=1, nic_bandwidth_bytes_per_s=1e9, node_names=tuple("abcde"[:n]),
    )  # fmt: skip
    back = cluster_from_mapping(cluster_to_mapping(cluster, decimals=None))
    np.testing.assert_allclose(back.bandwidth_bytes_per_s, cluster.bandwidth_bytes_per_s, rtol=1e-12)  # fmt: skip
    assert back.node_names == cluster.node_names


# ------------------------------------------------------------------ CSV
def test_csv_round_trip_and_empty_cells(tmp_path: Path):
    names = ("a", "b", "c")
    matrix = np.array(NODE) * GB
    path = tmp_path / "m.csv"
    write_matrix_csv(LabelledMatrix(names, matrix), path)
    assert path.read_text().splitlines()[:2] == ["node,a,b,c", "a,,20.5,10.25"]
    back = read_matrix_csv(path)
    assert back.names == names
    np.testing.assert_array_equal(back.bandwidth_bytes_per_s, matrix)
    path.write_text("a,b\n0,12.5\n,0\n")  # no row labels; empty cell = failed
    plain = read_matrix_csv(path)
    assert plain.names == ("a", "b")
    assert plain.bandwidth_bytes_per_s.tolist() == [[0, 12.5e9], [0, 0]]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a,b\n1,2\n", "not square"),
        ("a,b\n0,x\n1,0\n", "'x' is not a number"),
        ("a,b\n0,nan\n1,0\n", "must be finite"),
        ("a,b\n0,-1\n1,0\n", "must be finite"),
        (",a,b\na,0,1\nc,1,0\n", "row names differ"),
        ("a,b\n", "header row"),
    ],
)
def test_bad_csv(tmp_path: Path, text: str, message: str):
    path = tmp_path / "m.csv"
    path.write_text(text)
    with pytest.raises(InputFileError, match=message):
        read_matrix_csv(path)


def test_cluster_from_csv_matrix_and_settings(tmp_path: Path):
    path = tmp_path / "m.csv"
    path.write_text(",x,y\nx,,30\ny,30,\n")
    cluster = cluster_from_matrix(read_matrix_csv(path), {"gpu": "h100", "gpus_per_node": 8})
    assert cluster.describe() == "2 x 8 H100-SXM5-80GB, 8 NICs x 30.0 GB/s"
    assert cluster.node_names == ("x", "y")


# ------------------------------------------------------------------ Pipette JSON
def test_pipette_json_is_node_level_with_intra_on_the_diagonal():
    lm = read_pipette_json(PIPETTE / "cluster_4nodes.json")
    assert lm.names == ("agpu01", "agpu02", "agpu03", "agpu04")
    assert lm.intra_node_bytes_per_s == 150e9
    assert lm.bandwidth_bytes_per_s[1, 2] == 10.2e9 and lm.bandwidth_bytes_per_s[2, 3] == 0
    assert np.diagonal(lm.bandwidth_bytes_per_s).tolist() == [0.0] * 4
    cluster = cluster_from_matrix(lm, {"gpu": "a100", "gpus_per_node": 8})
    assert cluster.bandwidth_bytes_per_s[0, 1] == 150e9
    assert cluster.failed_pairs()[0] == (16, 24)


def test_pipette_mpigraph_json_uses_the_receive_matrix():
    lm = read_pipette_json(PIPETTE / "mpigraph_2nodes.json")
    # "0" row agpu1425 receives from agpu1426 at 11000.5 MiB/s: agpu1426 -> agpu1425
    assert lm.bandwidth_bytes_per_s[1, 0] == pytest.approx(11000.5 * MiB)
    assert lm.bandwidth_bytes_per_s[0, 1] == pytest.approx(14500.25 * MiB)
    assert lm.intra_node_bytes_per_s is None  # the diagonal is a placeholder there


def test_pipette_json_round_trip_and_errors(tmp_path: Path):
    cluster = node_cluster(NODE)
    path = tmp_path / "p.json"
    write_pipette_json(cluster, path)
    raw = json.loads(path.read_text())
    assert raw["gpus"] == ["a", "b", "c"]
    assert raw["bandwidth"][0] == [300.0, 20.5, 10.25]
    back = read_pipette_json(path)
    assert back.intra_node_bytes_per_s == 300e9
    np.testing.assert_array_equal(back.bandwidth_bytes_per_s, np.array(NODE) * GB)
    path.write_text(json.dumps({"gpus": ["a"], "bandwidth": [[0, 1], [1, 0]]}))
    with pytest.raises(InputFileError, match="1 names for a 2-row matrix"):
        read_pipette_json(path)
    path.write_text(json.dumps({"nodes": []}))
    with pytest.raises(InputFileError, match=re.escape('expected {"gpus"')):
        read_pipette_json(path)
    path.write_text(json.dumps({"gpus": ["a", "b"], "bandwidth": [[0, -1], [1, 0]]}))
    with pytest.raises(InputFileError, match=r"bandwidth\[0\]\[1\]=-1"):
        read_pipette_json(path)
