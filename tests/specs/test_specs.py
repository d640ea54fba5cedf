"""Specs: validation with one-line errors, JSON round trips, schemas, units in names."""

from __future__ import annotations

import sqlite3
from contextlib import closing

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipette_cp.clusters.expand import cluster_from_node_matrix
from pipette_cp.errors import SpecError, UnsupportedError
from pipette_cp.specs import (
    SCHEMA_SPECS,
    ClusterSpec,
    Evaluation,
    ModelSpec,
    Plan,
    SearchSpace,
    SolveInfo,
    TimeBreakdown,
    TrainingSpec,
    resolve_gpu,
    validate_spec,
)
from pipette_cp.specs.layouts import even_split, make_plan, megatron_placement
from tests.conftest import ROOT

LLAMA_ISH = {
    "name": "m",
    "num_layers": 4,
    "hidden_size": 512,
    "num_attention_heads": 8,
    "num_kv_heads": 2,
    "ffn_hidden_size": 1024,
    "vocab_size": 1000,
    "max_seq_length": 256,
}


def test_heads_not_divisible_by_kv_heads_names_both_numbers() -> None:
    with pytest.raises(SpecError) as err:
        validate_spec(ModelSpec, {**LLAMA_ISH, "num_kv_heads": 3}, "model")
    message = str(err.value)
    assert "num_attention_heads=8" in message and "num_kv_heads=3" in message
    assert "\n" not in message


def test_unknown_field_is_named() -> None:
    with pytest.raises(SpecError, match=r"model\.hidden=.*unknown field"):
        validate_spec(ModelSpec, {**LLAMA_ISH, "hidden": 3}, "model")


def test_wrong_type_names_field_and_value() -> None:
    with pytest.raises(SpecError, match=r"model\.num_layers='many'"):
        validate_spec(ModelSpec, {**LLAMA_ISH, "num_layers": "many"}, "model")


def test_moe_accepted_but_refused_where_unsupported() -> None:
    model = ModelSpec(**{**LLAMA_ISH, "num_experts": 8})
    with pytest.raises(UnsupportedError, match="num_experts=8"):
        model.require_dense()


def test_unknown_gpu_lists_known_ones() -> None:
    with pytest.raises(SpecError, match=r"gpu='R100'.*H100-SXM5-80GB"):
        resolve_gpu("R100")


def test_inline_gpu_definition() -> None:
    gpu = resolve_gpu(
        {
            "name": "MI300X",
            "memory_bytes": 192e9,
            "peak_flops_per_s": 1307e12,
            "hbm_bandwidth_bytes_per_s": 5.3e12,
            "nvlink_bandwidth_bytes_per_s": 448e9,
        }
    )
    assert gpu.memory_bytes == 192e9


def _cluster_fields(matrix: object, nodes: int = 2, gpus: int = 2) -> dict:
    return {
        "num_nodes": nodes,
        "gpus_per_node": gpus,
        "gpu_types": {"A100-SXM4-80GB": resolve_gpu("a100")},
        "node_gpu_types": ("A100-SXM4-80GB",) * nodes,
        "node_names": tuple(f"n{i}" for i in range(nodes)),
        "nics_per_node": 1,
        "nic_bandwidth_bytes_per_s": 25e9,
        "bandwidth_bytes_per_s": matrix,
    }


@pytest.mark.parametrize(
    ("matrix", "match"),
    [
        (np.ones((4, 3)), "square"),
        (np.ones((3, 3)), "3x3 but the cluster has 2 nodes x 2 GPUs = 4"),
        (np.where(np.eye(4) == 0, np.nan, 0), "not a finite number"),
        (-np.ones((4, 4)), "negative"),
        ([[1, 2], [3]], "bandwidth_bytes_per_s"),
    ],
)
def test_bad_matrices(matrix: object, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        validate_spec(ClusterSpec, _cluster_fields(matrix), "cluster")


def test_node_with_every_link_failed() -> None:
    matrix = np.full((6, 6), 10e9)
    matrix[0:2, 2:] = 0
    matrix[2:, 0:2] = 0
    with pytest.raises(SpecError, match=r"node 0 \(n0\) has every inter-node link failed"):
        validate_spec(ClusterSpec, _cluster_fields(matrix, nodes=3), "cluster")


def test_failed_pairs_explicit_and_diagonal_ignored() -> None:
    matrix = np.full((4, 4), 10e9)
    matrix[0, 2] = 0
    cluster = validate_spec(ClusterSpec, _cluster_fields(matrix), "cluster")
    assert cluster.failed_pairs() == [(0, 2)]
    assert not cluster.bandwidth_bytes_per_s.flags.writeable
    assert np.diagonal(cluster.bandwidth_bytes_per_s).sum() == 0


def test_node_matrix_averages_healthy_gpu_pairs() -> None:
    nodes = np.array([[0, 20e9], [10e9, 0]])
    cluster = cluster_from_node_matrix(
        node_bandwidth=nodes,
        intra_node=100e9,
        gpus_per_node=4,
        gpu=resolve_gpu("h100"),
        nics_per_node=4,
        nic_bandwidth_bytes_per_s=25e9,
    )
    np.testing.assert_allclose(cluster.node_matrix(), [[100e9, 20e9], [10e9, 100e9]])
    assert cluster.node_of(5) == 1 and list(cluster.gpus_of_node(1)) == [4, 5, 6, 7]


def test_cluster_json_round_trip() -> None:
    cluster = validate_spec(ClusterSpec, _cluster_fields(np.full((4, 4), 5e9)), "cluster")
    again = ClusterSpec.model_validate_json(cluster.model_dump_json())
    np.testing.assert_array_equal(again.bandwidth_bytes_per_s, cluster.bandwidth_bytes_per_s)
    assert again.gpu_types == cluster.gpu_types


def test_plan_round_trips_through_json() -> None:
    plan = make_plan(
        num_layers=24, dp=2, pp=2, tp=2, micro_batch_size=2, vpp=2, recompute="selective"
    )
    plan = plan.model_copy(
        update={
            "evaluation": Evaluation(
                iteration_time_s=1.5,
                tokens_per_s=1e5,
                model_tflops_per_gpu=150,
                hardware_tflops_per_gpu=160,
                mfu=0.48,
                hfu=0.51,
                memory_bytes_by_stage=(60e9, 50e9),
                memory_bytes_max=60e9,
                memory_limit_bytes=80e9,
                fits=True,
                breakdown_s={"compute": 1.2, "bubble": 0.3},
            ),
            "solve_info": SolveInfo(
                method="cpsat", status="optimal", objective=1.5, bound=1.5, gap=0.0
            ),
        }
    )
    assert Plan.model_validate_json(plan.model_dump_json()) == plan


def test_time_breakdown_reads_and_writes_the_mapping_of_older_files() -> None:
    """The JSON of the breakdown is the object of its causes: a file written before
    ``cp_comm``/``ep_comm`` existed loads (they read 0), a rounding residue below zero on
    ``bubble`` too; the plans stored in the bundled benchmark results load."""
    old = {"compute": 1.2, "bubble": -5.3e-15, "pp_comm": 0.0, "dp_comm": 0.1,
           "tp_comm": 0.05, "optimizer": 0.02}  # fmt: skip
    parts = TimeBreakdown.model_validate(old)
    assert parts.bubble == -5.3e-15 and parts.cp_comm == parts.ep_comm == 0.0
    assert parts.model_dump() == {**old, "cp_comm": 0.0, "ep_comm": 0.0}
    assert list(parts.model_dump()) == [name for name, _ in parts.items()]
    assert sum(seconds for _, seconds in parts.items()) == pytest.approx(1.37)
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        TimeBreakdown(compute=-1.0)
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        TimeBreakdown.model_validate({"compute": 1.0, "idle": 0.5})
    stored = ROOT / "instances" / "bench" / "suite-default.sqlite"
    with closing(sqlite3.connect(f"file:{stored}?immutable=1", uri=True)) as db:  # no -wal
        rows = db.execute("SELECT plan_json FROM results WHERE plan_json IS NOT NULL")
        plans = [Plan.model_validate_json(text) for (text,) in rows]
    evaluated = [p.evaluation for p in plans if p.evaluation is not None]
    assert evaluated and all(e.breakdown_s.compute > 0 for e in evaluated)


@pytest.mark.parametrize(
    ("update", "match"),
    [
        ({"layer_split": (12, 12)}, "expected pp\\*vpp=2\\*2=4"),
        ({"placement": ((0, 1),)}, "expected pp\\*dp=4"),
        ({"placement": ((0,), (1,), (2,), (3,))}, "expected tp=2"),
    ],
)
def test_plan_shape_errors(update: dict, match: str) -> None:
    plan = make_plan(num_layers=24, dp=2, pp=2, tp=2, micro_batch_size=1, vpp=2)
    with pytest.raises(SpecError, match=match):
        validate_spec(Plan, {**plan.model_dump(), **update}, "plan")


def test_search_space_rejects_empty_and_non_positive() -> None:
    with pytest.raises(SpecError, match=r"search_space\.tp=\[\]: must not be empty"):
        validate_spec(SearchSpace, {"tp": []}, "search_space")
    with pytest.raises(SpecError, match=r"search_space\.micro_batch_size"):
        validate_spec(SearchSpace, {"micro_batch_size": [0, 1]}, "search_space")


@pytest.mark.parametrize("spec", SCHEMA_SPECS, ids=lambda s: s.__name__)
def test_every_field_has_a_description_and_a_schema(spec: type) -> None:
    schema = spec.model_json_schema()
    assert schema["properties"]
    for name, field in spec.model_fields.items():
        assert field.description, f"{spec.__name__}.{name} has no description"


_UNIT_WORDS = {"bytes", "s", "tflops", "flops", "fraction"}
_UNITLESS = {"mfu", "hfu", "gap", "objective", "bound", "norm_epsilon",
             "moe_router_aux_loss_coeff", "moe_z_loss_coeff", "moe_capacity_factor",
             "moe_load_imbalance"}  # fmt: skip


@pytest.mark.parametrize("spec", SCHEMA_SPECS, ids=lambda s: s.__name__)
def test_float_fields_carry_their_unit(spec: type) -> None:
    for name, field in spec.model_fields.items():
        if field.annotation in (float, float | None) and name not in _UNITLESS:
            assert _UNIT_WORDS & set(name.split("_")), f"{spec.__name__}.{name} lacks a unit"


@given(st.integers(1, 200), st.integers(1, 16), st.integers(1, 4))
def test_even_split_covers_every_layer_and_is_balanced(layers: int, pp: int, vpp: int) -> None:
    split = even_split(layers, pp, vpp)
    assert sum(split) == layers and len(split) == pp * vpp
    assert max(split) - min(split) <= 1


@given(st.integers(1, 8), st.integers(1, 8), st.sampled_from([1, 2, 4, 8]))
def test_megatron_placement_is_a_bijection_in_rank_order(dp: int, pp: int, tp: int) -> None:
    units = megatron_placement(dp, pp, tp)
    flat = [gpu for unit in units for gpu in unit]
    assert sorted(flat) == list(range(dp * pp * tp))
    # tp ranks are consecutive; the next dp replica follows; stages are outermost (tp-dp-pp).
    assert units[0] == tuple(range(tp))
    if dp > 1:
        assert units[1][0] == tp


def test_cluster_equality_compares_the_matrix() -> None:
    matrix = np.full((4, 4), 5e9)
    a = validate_spec(ClusterSpec, _cluster_fields(matrix), "cluster")
    b = validate_spec(ClusterSpec, _cluster_fields(matrix.copy()), "cluster")
    other = matrix.copy()
    other[0, 1] = 1e9
    c = validate_spec(ClusterSpec, _cluster_fields(other), "cluster")
    assert a == b and hash(a) == hash(b)
    assert a != c


# ------------------------------------------------------------------ finite numbers, physical bounds
@pytest.mark.parametrize(
    ("entry", "match"),
    [
        (1e-3, r"bandwidth\[0\]\[2\]=0.001 is below 1e\+06 bytes/s"),
        (1e300, r"bandwidth\[0\]\[2\]=1e\+300 is above 1e\+15 bytes/s"),
        (np.inf, "not a finite number"),
    ],
)
def test_cluster_links_are_zero_or_physical(entry: float, match: str) -> None:
    matrix = np.full((4, 4), 10e9)
    matrix[0, 2] = entry
    with pytest.raises(SpecError, match=match):
        validate_spec(ClusterSpec, _cluster_fields(matrix), "cluster")
    diagonal = np.full((4, 4), 10e9)
    np.fill_diagonal(diagonal, 1e-3)  # the diagonal is ignored, whatever it holds
    assert not validate_spec(ClusterSpec, _cluster_fields(diagonal)).bandwidth_bytes_per_s[0, 0]


def test_non_finite_numbers_are_refused_in_nested_specs_and_from_numpy() -> None:
    gpu = resolve_gpu("a100").model_dump()
    for bad in (np.float32("inf"), np.float64("nan"), float("-inf"), "1e400"):
        fields = _cluster_fields(np.full((4, 4), 10e9))
        fields["gpu_types"] = {"A100-SXM4-80GB": gpu | {"hbm_bandwidth_bytes_per_s": bad}}
        with pytest.raises(SpecError, match="finite number") as info:
            validate_spec(ClusterSpec, fields, "cluster")
        assert info.value.field == "cluster.gpu_types.A100-SXM4-80GB.hbm_bandwidth_bytes_per_s"
    with pytest.raises(SpecError, match="finite number"):
        validate_spec(TrainingSpec, {"global_batch_size": 8, "seq_length": 256,
                                     "framework": {"runtime_bytes": np.inf}})  # fmt: skip
    with pytest.raises(SpecError, match="node_groups must be >= 0"):
        validate_spec(
            ClusterSpec, _cluster_fields(np.full((4, 4), 10e9)) | {"node_groups": (0, -1)}
        )
