"""Sensitivity report (``pipette-cp explain``): which links and nodes a plan depends on.

Oracles: the iteration time recomputed on a cluster whose matrix is edited here
by hand, and every GPU pair the plan does not use halved directly."""

from __future__ import annotations

import json
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from pipette_cp.cli import app
from pipette_cp.cost.evaluator.evaluate import evaluate
from pipette_cp.errors import LayoutError, SpecError
from pipette_cp.io.instance_file import load_instance
from pipette_cp.report.plan_file import read_plan_document
from pipette_cp.report.sensitivity.analysis import plan_links, scaled_instance, sensitivity
from pipette_cp.report.sensitivity.view import sensitivity_json, summary_line
from pipette_cp.specs import ClusterSpec, Instance, Plan
from pipette_cp.specs.layouts import make_plan
from tests.conftest import small_instance

runner = CliRunner()


def untied(instance: Instance) -> Instance:
    model = instance.model.model_copy(update={"tied_embeddings": False})
    return instance.model_copy(update={"model": model})


def time_with_halved(instance: Instance, plan: Plan, pairs: list[tuple[int, int]]) -> float:
    """Independent recomputation: copy the matrix, halve both directions of ``pairs``,
    rebuild the cluster from its dumped fields and evaluate from scratch."""
    matrix = np.array(instance.cluster.bandwidth_bytes_per_s)
    for a, b in pairs:
        matrix[a, b] *= 0.5
        matrix[b, a] *= 0.5
    data = instance.cluster.model_dump()
    data["bandwidth_bytes_per_s"] = matrix.tolist()
    cluster = ClusterSpec.model_validate(data)
    return evaluate(instance.model_copy(update={"cluster": cluster}), plan).iteration_time_s


PLANS = {
    "dp2-pp2-tp2-vpp2": dict(dp=2, pp=2, tp=2, vpp=2),
    "dp4-pp2-tp1": dict(dp=4, pp=2, tp=1),
    "dp8": dict(dp=8, pp=1, tp=1),
    "dp1-pp2-tp4": dict(dp=1, pp=2, tp=4),
}


# ------------------------------------------------------------- (a) unused pairs
@pytest.mark.parametrize("name", PLANS)
def test_a_pair_the_plan_never_uses_has_zero_sensitivity(name: str) -> None:
    instance = small_instance()
    plan = make_plan(num_layers=8, micro_batch_size=1, **PLANS[name])
    used = plan_links(instance, plan)
    report = sensitivity(instance, plan, top=100)
    assert report.num_links == len(used) == len(report.links)
    assert {link.gpus for link in report.links} == set(used)
    base = evaluate(instance, plan).iteration_time_s
    unused = [p for p in combinations(range(instance.cluster.num_gpus), 2) if p not in used]
    assert unused, "the case must have an unused pair to be a test"
    for pair in unused:
        assert time_with_halved(instance, plan, [pair]) == base, pair


@pytest.mark.slow
def test_unused_pairs_of_a_greedy_plan_on_a_bundled_instance(plan_file: Path) -> None:
    plan = read_plan_document(json.loads(plan_file.read_text()))
    instance = load_instance("llama-2-7b-g3-32")
    used = plan_links(instance, plan)
    base = evaluate(instance, plan).iteration_time_s
    pairs = list(combinations(range(instance.cluster.num_gpus), 2))
    unused = [p for p in pairs if p not in used][::7]
    assert len(unused) > 20
    for pair in unused:
        assert time_with_halved(instance, plan, [pair]) == base, pair


@settings(max_examples=12, deadline=None)
@given(
    st.sampled_from([(2, 2, 2, 1), (4, 2, 1, 1), (2, 2, 2, 2), (8, 1, 1, 1), (2, 4, 1, 2)]),
    st.randoms(use_true_random=False),
)
def test_any_placement_unused_pairs_do_not_matter(degrees: tuple, rng) -> None:
    dp, pp, tp, vpp = degrees
    instance = small_instance()
    blocks = [b for b in range(0, 8, tp)]
    rng.shuffle(blocks)
    placement = tuple(tuple(range(b, b + tp)) for b in blocks)
    plan = make_plan(
        num_layers=8, dp=dp, pp=pp, tp=tp, vpp=vpp, micro_batch_size=1, placement=placement
    )
    used = plan_links(instance, plan)
    base = evaluate(instance, plan).iteration_time_s
    for pair in combinations(range(8), 2):
        if pair not in used:
            assert time_with_halved(instance, plan, [pair]) == base, pair


# ------------------------------------------------------- (b) the reported time
def test_the_most_sensitive_link_gives_the_reported_time() -> None:
    instance = small_instance()
    plan = make_plan(num_layers=8, dp=2, pp=2, tp=2, micro_batch_size=1)
    report = sensitivity(instance, plan, top=3)
    top = report.links[0]
    assert top.gpus is not None and top.impact.increase_s > 0
    again = time_with_halved(instance, plan, [top.gpus])
    assert again == pytest.approx(top.impact.time_s, rel=1e-12)
    base = evaluate(instance, plan).iteration_time_s
    assert top.impact.increase_s == pytest.approx(again - base, rel=1e-9)
    assert top.impact.increase_pct == pytest.approx(100 * (again - base) / base, rel=1e-9)
    # it is the largest over every communicating pair, recomputed one by one
    worst = max(time_with_halved(instance, plan, [p]) for p in plan_links(instance, plan))
    assert worst == pytest.approx(top.impact.time_s, rel=1e-12)
    # and the report is sorted and deterministic
    increases = [link.impact.increase_s for link in report.links]
    assert increases == sorted(increases, reverse=True)
    assert sensitivity(instance, plan, top=3) == report


def test_node_nic_and_nvlink_recomputed() -> None:
    instance = small_instance()
    plan = make_plan(num_layers=8, dp=2, pp=2, tp=2, micro_batch_size=1)
    report = sensitivity(instance, plan)
    by_name = {node.node: node for node in report.nodes}
    inside = list(instance.cluster.gpus_of_node(0))
    outside = list(instance.cluster.gpus_of_node(1))
    nic = [(a, b) for a in inside for b in outside]
    nvlink = list(combinations(inside, 2))
    assert by_name[0].nic.time_s == pytest.approx(time_with_halved(instance, plan, nic))
    assert by_name[0].nvlink.time_s == pytest.approx(time_with_halved(instance, plan, nvlink))


# ---------------------------------------------------------- (c) constructed cases
def test_pipeline_across_two_nodes_depends_on_the_pipeline_link() -> None:
    instance = untied(small_instance(nodes=2, gpus_per_node=1))
    plan = make_plan(num_layers=8, dp=1, pp=2, tp=1, micro_batch_size=1)
    report = sensitivity(instance, plan)
    (link,) = report.links
    assert link.gpus == (0, 1) and link.traffic == ("pp",)
    assert link.impact.cause == "pp_comm" and link.impact.increase_s > 0
    assert all(node.nic.cause == "pp_comm" for node in report.nodes)
    # the link and either node's NIC are the same single link: the link is named
    summary = summary_line(report)
    assert summary.startswith("this plan depends most on the link GPU 0 (node000) <-> GPU 1")
    assert "if it halves" in summary and "of 1 communicating GPU pairs" in summary


def test_pipeline_with_tensor_parallel_nodes() -> None:
    instance = untied(small_instance())
    plan = make_plan(num_layers=8, dp=1, pp=2, tp=4, micro_batch_size=1)
    report = sensitivity(instance, plan, top=100)
    inter = [link for link in report.links if link.nodes[0] != link.nodes[1]]
    assert inter and all(link.traffic == ("pp",) for link in inter)
    assert all(link.impact.cause == "pp_comm" for link in inter)
    assert all(node.nic.cause == "pp_comm" for node in report.nodes)
    # inside the nodes only the TP rings: cause tp_comm or, for the stage that is not
    # the busiest, the bubble it adds
    intra = [link for link in report.links if link.nodes[0] == link.nodes[1]]
    assert {link.traffic for link in intra} == {("tp",)}


def test_pure_data_parallel_depends_on_dp_comm() -> None:
    instance = small_instance()
    plan = make_plan(num_layers=8, dp=8, pp=1, tp=1, micro_batch_size=1)
    report = sensitivity(instance, plan)
    assert report.links[0].impact.cause == "dp_comm"
    assert all(set(link.traffic) == {"dp"} for link in report.links)
    assert all(node.nic.cause == "dp_comm" for node in report.nodes)


def test_node_pairs_above_the_pair_limit() -> None:
    instance = small_instance()
    plan = make_plan(num_layers=8, dp=2, pp=2, tp=2, micro_batch_size=1)
    report = sensitivity(instance, plan, max_pairs=1)
    assert report.granularity == "node" and any("node" in note for note in report.notes)
    (link,) = report.links  # two nodes: one node pair
    assert link.gpus is None and link.nodes == (0, 1)
    # with two nodes, every link between them = either node's NIC
    assert link.impact.time_s == pytest.approx(report.nodes[0].nic.time_s, rel=1e-12)


def test_headroom_bandwidth_where_another_plan_wins() -> None:
    instance = untied(small_instance(nodes=3, gpus_per_node=1))
    plan = make_plan(num_layers=8, dp=1, pp=3, tp=1, micro_batch_size=2)
    # the pipeline over the other pairs of nodes, with a slower micro-batch size
    other = make_plan(
        num_layers=8, dp=1, pp=3, tp=1, micro_batch_size=1, placement=((0,), (2,), (1,))
    )
    assert evaluate(instance, other).iteration_time_s > evaluate(instance, plan).iteration_time_s
    report = sensitivity(instance, plan, alternatives=[plan, other])
    h = report.headroom
    assert h is not None and h.factor is not None and h.overtaken_by == other.layout()
    assert h.link == report.links[0] and h.link.gpus is not None
    mask_pairs = [h.link.gpus]

    def times(f: float) -> tuple[float, float]:
        matrix = np.array(instance.cluster.bandwidth_bytes_per_s)
        for a, b in mask_pairs:
            matrix[a, b] *= f
            matrix[b, a] *= f
        data = instance.cluster.model_dump() | {"bandwidth_bytes_per_s": matrix.tolist()}
        scaled = instance.model_copy(update={"cluster": ClusterSpec.model_validate(data)})
        return evaluate(scaled, plan).iteration_time_s, evaluate(scaled, other).iteration_time_s

    mine, theirs = times(h.factor * 1.01)
    assert mine <= theirs
    mine, theirs = times(h.factor * 0.99)
    assert mine > theirs
    assert "faster" in h.note


def test_bad_arguments_and_invalid_plans() -> None:
    instance = small_instance()
    plan = make_plan(num_layers=8, dp=2, pp=2, tp=2, micro_batch_size=1)
    with pytest.raises(SpecError, match="factor"):
        sensitivity(instance, plan, factor=1.0)
    with pytest.raises(SpecError, match="top"):
        sensitivity(instance, plan, top=0)
    big = make_plan(num_layers=8, dp=4, pp=2, tp=2, micro_batch_size=1)
    with pytest.raises(LayoutError, match="16 GPUs"):
        sensitivity(instance, big)


# ----------------------------------------------------------------- (d), (e) CLI
@pytest.fixture(scope="module")
def plan_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("explain") / "plan.json"
    result = runner.invoke(
        app,
        ["solve", "llama-2-7b-g3-32", "--method", "greedy", "--top", "1", "--time-limit", "30",
         "-o", str(path)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return path


def test_cli_explain_tables_json_and_plot(plan_file: Path, tmp_path: Path) -> None:
    png = tmp_path / "s.png"
    result = runner.invoke(app, ["explain", str(plan_file), "--top", "4", "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert (
        "this plan depends most on" in result.output and "communicating GPU pairs" in result.output
    )
    assert "Links (top 4 of" in result.output and "NVLink" in result.output
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = runner.invoke(app, ["explain", str(plan_file), "--json", "--factor", "0.25"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["factor"] == 0.25 and data["instance"] == "llama-2-7b-g3-32"
    assert len(data["links"]) == 10 and data["summary"].startswith("this plan depends")
    first = data["links"][0]
    assert first["increase_s"] >= data["links"][-1]["increase_s"] >= 0
    assert set(first) >= {"gpus", "nodes", "bandwidth_gb_per_s", "traffic", "increase_pct", "cause"}


def test_json_contract_of_a_report() -> None:
    instance = small_instance()
    plan = make_plan(num_layers=8, dp=8, pp=1, tp=1, micro_batch_size=1)
    data = sensitivity_json(sensitivity(instance, plan, top=2))
    assert json.loads(json.dumps(data)) == data
    assert data["granularity"] == "gpu" and len(data["links"]) == 2 and data["headroom"] is None


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["explain", "/nonexistent/plan.json"], "no such file"),
        (["explain", "PLAN", "--instance", "gpt3-1.3b-nominal-8"], "the plan was made for"),
        (["explain", "PLAN", "--factor", "1.5"], "--factor=1.5"),
        (["explain", "PLAN", "--top", "0"], "--top=0"),
    ],
)
def test_cli_bad_input_is_one_line(args: list[str], expected: str, plan_file: Path) -> None:
    args = [str(plan_file) if a == "PLAN" else a for a in args]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert expected in result.output and "Traceback" not in result.output


def test_scaled_copy_is_a_valid_cluster_and_leaves_the_input_alone() -> None:
    instance = small_instance()
    before = np.array(instance.cluster.bandwidth_bytes_per_s)
    mask = np.zeros((8, 8), dtype=bool)
    mask[0, 5] = mask[5, 0] = True
    scaled = scaled_instance(instance, mask, 0.5).cluster
    assert ClusterSpec.model_validate(scaled.model_dump()) == scaled
    assert scaled.bandwidth_bytes_per_s[0, 5] == 0.5 * before[0, 5]
    assert (
        np.delete(scaled.bandwidth_bytes_per_s.ravel(), [5, 40])
        == np.delete(before.ravel(), [5, 40])
    ).all()
    assert np.array_equal(instance.cluster.bandwidth_bytes_per_s, before)
    with pytest.raises(SpecError, match="positive"):
        scaled_instance(instance, mask, 0.0)
