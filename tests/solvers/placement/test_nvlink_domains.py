"""NVLink domains larger than a node (GB200 NVL72: 18 trays x 4 GPUs per rack): the
cluster field and its files, the generator, tensor groups across the trays of one
domain (never across domains), NVLink instead of NICs between trays of a domain, and
the placement masters against the Evaluator and the brute-force oracle."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from pipette_cp.checker.checks import check_plan
from pipette_cp.cli import app
from pipette_cp.clusters.generators.registry import check_targets, generate
from pipette_cp.cost.evaluator.evaluate import Evaluator, validate_layout
from pipette_cp.cost.network import collectives as comm
from pipette_cp.errors import LayoutError, SpecError
from pipette_cp.io.cluster_file import cluster_from_mapping, read_cluster_file, write_cluster_file
from pipette_cp.io.model_file import load_model
from pipette_cp.search.loop import search
from pipette_cp.search.options import SearchOptions
from pipette_cp.search.space import check_degrees, degrees, tensor_sizes
from pipette_cp.solvers import placement
from pipette_cp.solvers.options import SolveOptions
from pipette_cp.solvers.placement import solve_placement
from pipette_cp.solvers.placement.build import build_placement_data, node_uniform
from pipette_cp.solvers.placement.kelley import CutPool, kelley, lower_x, worst_x
from pipette_cp.solvers.placement.model import PlacementModel
from pipette_cp.solvers.placement.oracle import any_groups, brute_force_placement
from pipette_cp.specs import ClusterSpec, Instance, SearchSpace, TrainingSpec, validate_spec
from pipette_cp.specs.layouts import make_plan
from pipette_cp.units import GB
from tests.conftest import ROOT

SCHEMAS = ROOT / "pipette_cp" / "schemas"


def racks(nodes: int = 4, trays: int = 2, **kw: object) -> ClusterSpec:
    """GB200 racks of ``trays`` trays of 4 GPUs (2 x 2 trays: two 8-GPU domains)."""
    return generate("gb200-nvl72", nodes=nodes, seed=0, trays_per_rack=trays, **kw)  # type: ignore[arg-type]


def on(cluster: ClusterSpec, model: str = "llama-2-13b", **space: object) -> Instance:
    training = TrainingSpec(global_batch_size=16, seq_length=4096)
    return Instance(name="nvl", model=load_model(model), cluster=cluster, training=training,
                    search_space=SearchSpace(**space))  # type: ignore[arg-type]  # fmt: skip


def layout(instance: Instance, dp: int, pp: int, tp: int, **kw: object):
    return make_plan(num_layers=instance.model.num_layers, dp=dp, pp=pp, tp=tp,  # type: ignore[arg-type]
                     micro_batch_size=1, **kw)  # fmt: skip


# ------------------------------------------------------------------ the cluster field
def test_the_domain_size_must_divide_the_nodes() -> None:
    fields = racks().model_dump()
    for value, message in ((3, "cluster.nodes_per_nvlink_domain=3: must divide num_nodes=4: "
                               "a domain is that many consecutive whole nodes"),
                           (0, "cluster.nodes_per_nvlink_domain=0: Input should be greater than 0")):  # fmt: skip
        with pytest.raises(SpecError) as info:
            validate_spec(ClusterSpec, {**fields, "nodes_per_nvlink_domain": value}, "cluster")
        assert str(info.value) == message
    cluster = racks()
    assert (cluster.nodes_per_nvlink_domain, cluster.gpus_per_domain, cluster.num_domains) == (
        2,
        8,
        2,
    )
    assert [cluster.domain_of(g) for g in (0, 7, 8, 15)] == [0, 0, 1, 1]
    assert cluster.domain_of_node(3) == 1
    assert "NVLink domains of 2 nodes" in cluster.describe()


BASE = {"gpu": "gb200", "gpus_per_node": 2, "nominal": True, "num_nodes": 4,
        "inter_node_bandwidth_gb_per_s": 40, "nic_bandwidth_gb_per_s": 50}  # fmt: skip


@pytest.mark.parametrize(
    ("domains", "message"),
    [
        ([0, 0, 0, 1, 1, 1, 1, 1], "node 1 has GPUs in domains [0, 1]: a domain must hold whole nodes"),
        ([0, 1, 0, 1], "domain 0 holds nodes [0, 2], not consecutive: domains overlap; a domain "
                       "must be a run of consecutive whole nodes"),
        ([0, 0, 0, 1], "domains of 1 and 3 nodes: every domain must hold as many nodes, a divisor "
                       "of num_nodes=4"),
        ([0, 0, 1], "expected 4 domain ids (one per node) or 8 (one per GPU)"),
        ([0, -1, 1, 1], "expected a list of integer domain ids >= 0"),
    ],
)  # fmt: skip
def test_bad_domain_maps_are_refused_in_one_line(domains: list[int], message: str) -> None:
    with pytest.raises(SpecError) as info:
        cluster_from_mapping({**BASE, "nvlink_domains": domains})
    assert str(info.value) == f"cluster.nvlink_domains={domains}: {message}"


def test_domain_maps_and_round_trips(tmp_path: Path) -> None:
    for domains in ([5, 5, 2, 2], [0] * 4 + [1] * 4):  # per node, per GPU (any ids)
        assert (
            cluster_from_mapping({**BASE, "nvlink_domains": domains}).nodes_per_nvlink_domain == 2
        )
    cluster = racks(nodes=6, trays=3)
    path = tmp_path / "nvl.yaml"
    write_cluster_file(cluster, path, decimals=None)
    assert "nodes_per_nvlink_domain: 3" in path.read_text()
    assert read_cluster_file(path) == cluster
    plain = generate("healthy-a100", nodes=2, seed=0)
    write_cluster_file(plain, path)
    assert "nvlink" not in path.read_text() and read_cluster_file(path).nodes_per_nvlink_domain == 1
    schema = json.loads((SCHEMAS / "ClusterSpec.schema.json").read_text())
    assert schema["properties"]["nodes_per_nvlink_domain"]["default"] == 1


# ------------------------------------------------------------------ the generator
def test_gb200_nvl72_racks() -> None:
    cluster = generate("gb200-nvl72", nodes=36, seed=0)
    assert (cluster.num_nodes, cluster.gpus_per_node, cluster.num_domains) == (36, 4, 2)
    assert cluster.nodes_per_nvlink_domain == 18 and cluster.gpus_per_domain == 72
    assert cluster.node_groups == (0,) * 18 + (1,) * 18
    bw = cluster.bandwidth_bytes_per_s
    rack = np.arange(144) // 72
    inside = (rack[:, None] == rack[None, :]) & ~np.eye(144, dtype=bool)
    assert bw[inside].max() == 900 * GB and bw[inside].min() > 750 * GB  # NVLink 5, capped
    assert np.median(bw[~inside]) == pytest.approx(40 * GB, rel=0.05)  # ConnectX-7 across racks
    assert node_uniform(on(cluster))
    assert check_targets("gb200-nvl72", cluster) == []
    assert "ConnectX-8" in cluster.source and "NVL Multi-Node Tuning Guide" in cluster.source
    assert generate("nvl72", nodes=18, seed=1).num_domains == 1
    for call, message in (
        (lambda: generate("gb200-nvl72", nodes=20, seed=0),
         "nodes=20: must be a multiple of trays_per_rack=18 (whole racks)"),
        (lambda: generate("gb200-nvl72", nodes=18, seed=0, gpus_per_node=8),
         "gpus_per_node=8: must be 4 for gb200-nvl72 (a GB200 compute tray holds 4 GPUs)"),
    ):  # fmt: skip
        with pytest.raises(SpecError) as info:
            call()
        assert str(info.value) == message


def test_the_cli_generates_two_racks(tmp_path: Path) -> None:
    out = tmp_path / "nvl72.yaml"
    result = CliRunner().invoke(
        app, ["cluster", "generate", "gb200-nvl72", "--nodes", "36", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    cluster = read_cluster_file(out)
    assert cluster.num_gpus == 144 and cluster.nodes_per_nvlink_domain == 18


# ------------------------------------------------------------------ layouts
def test_tp_sizes_reach_the_domain() -> None:
    assert tensor_sizes(on(racks())) == [1, 2, 4, 8]
    assert tensor_sizes(on(generate("gb200-nvl72", nodes=36, seed=0))) == [
        1,
        2,
        4,
        8,
        12,
        24,
        36,
        72,
    ]
    assert tensor_sizes(on(generate("healthy-a100", nodes=2, seed=0))) == [1, 2, 4, 8]
    instance = on(racks())
    assert {d.tp for d in degrees(instance)} == {1, 2, 4, 8}
    with pytest.raises(SpecError) as info:
        check_degrees(instance, SearchSpace(tp=[16]))
    assert str(info.value) == ("search_space.tp=(16,): no tensor-parallel size can run: 16 exceeds "
                               "the 8 GPUs of an NVLink domain (possible: 1, 2, 4, 8)")  # fmt: skip


def test_a_tp8_plan_spanning_two_trays_evaluates() -> None:
    instance = on(racks())
    plan = layout(instance, 2, 1, 8)  # units (0..7) on trays 0-1, (8..15) on trays 2-3
    validate_layout(instance, plan)
    evaluation = Evaluator(instance).evaluate(plan)
    assert evaluation.fits and evaluation.iteration_time_s > 0
    # the TP rings run over NVLink: faster than the same layout charged at the NIC rate
    slow = racks(nvlink_gbytes_per_s=50.0)
    assert evaluation.iteration_time_s < Evaluator(on(slow)).iteration_time(plan)


def test_the_checker_accepts_a_tp8_plan_spanning_two_trays() -> None:
    instance = on(racks())
    assert check_plan(instance, layout(instance, 2, 1, 8)) == []


def test_a_tensor_group_across_two_racks_is_refused() -> None:
    instance = on(racks())
    plan = layout(instance, 2, 1, 8)
    across = plan.model_copy(
        update={"placement": (tuple(range(4, 12)), (*range(4), *range(12, 16)))}
    )
    with pytest.raises(LayoutError) as info:
        Evaluator(instance).iteration_time(across)
    assert str(info.value) == (
        "plan.placement[0]=(4, 5, 6, 7, 8, 9, 10, 11): the tp=8 ranks of unit 0 span NVLink "
        "domains [0, 1] (nodes_per_nvlink_domain=2); a unit must sit in one NVLink domain"
    )
    with pytest.raises(LayoutError, match=r"tp=16 exceeds the 8 GPUs of an NVLink domain"):
        validate_layout(instance, layout(instance, 1, 1, 16))
    three = on(racks(nodes=6, trays=3), model="tiny-gpt")  # 12-GPU domains
    with pytest.raises(LayoutError, match=r"tp=8 > gpus_per_node=4 must be a multiple of it "
                                          r"dividing the 12 GPUs of an NVLink domain"):  # fmt: skip
        validate_layout(three, layout(three, 3, 1, 8))
    plain = on(generate("healthy-a100", nodes=2, seed=0, gpus_per_node=4))
    with pytest.raises(LayoutError, match=r"^plan.tp=8: tp=8 exceeds gpus_per_node=4$"):
        validate_layout(plain, layout(plain, 1, 1, 8))


def test_flows_inside_a_domain_skip_the_nics() -> None:
    fabric = comm.Fabric.from_cluster(racks())
    src = np.arange(4)  # every GPU of tray 0 at once
    same_rack = comm.flow_bandwidths(fabric, src, src + 4)  # to tray 1: NVLink
    other_rack = comm.flow_bandwidths(fabric, src, src + 8)  # to tray 2: 4 flows, 4 NICs
    assert same_rack.tolist() == fabric.bandwidth[src, src + 4].tolist()
    assert (same_rack > 800 * GB).all()
    assert other_rack.max() <= 40.1 * GB
    two = comm.flow_bandwidths(fabric, np.r_[src, src], np.r_[src + 8, src + 12])  # 8 flows
    assert two.max() == pytest.approx(4 * 40 * GB / 8, rel=1e-9)  # the tray's 4 NICs shared
    _, latency = comm.concurrent_flows(fabric, src, src + 4)
    assert (latency == fabric.inter_node_latency_s).all()  # another host, NVLink or not


# ------------------------------------------------------------------ placement vs Evaluator
CASES = [(2, 1, 8), (1, 2, 8), (2, 2, 4), (4, 2, 2), (4, 1, 2)]


@pytest.mark.parametrize(("dp", "pp", "tp"), CASES)
def test_the_placement_model_charges_what_the_evaluator_charges(dp, pp, tp) -> None:
    instance = on(racks(nic_gbytes_per_s=10.0), use_all_gpus=False)
    plan = layout(instance, dp, pp, tp)
    data = build_placement_data(instance, plan)
    assert data.slots_complete  # uniform trays; tp8: the one cut of a domain
    ring = Evaluator(instance, dp_algorithm="ring", validate=False)
    rng = np.random.default_rng(0)
    seats = np.repeat(np.arange(data.num_places), data.capacity)
    for _ in range(20):
        assign = rng.permutation(seats)[: data.num_units]
        placed = plan.model_copy(update={"placement": data.placement(assign)})
        validate_layout(instance, placed)
        truth = ring.iteration_time(placed)
        assert data.total_time_s(data.x_of(assign)) == pytest.approx(truth, rel=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["cpsat", "milp"])
@pytest.mark.parametrize(("dp", "pp", "tp"), [(2, 1, 8), (2, 2, 4), (4, 2, 2)])
def test_the_masters_match_the_oracle_across_trays(backend, dp, pp, tp) -> None:
    """NIC sharing only across racks: the master from no start reaches the brute-force
    optimum (ring all-reduce, the master's model) on 2 racks x 2 trays."""
    instance = on(racks(nic_gbytes_per_s=10.0), model="gpt3-1.3b", use_all_gpus=False)
    plan = layout(instance, dp, pp, tp)
    _, best = brute_force_placement(instance, plan, "ring")
    data = build_placement_data(instance, plan)
    pool = CutPool(data, upper_s=2 * data.total_time_s(worst_x(data)))
    pool.add_at(lower_x(data))
    doms = [np.flatnonzero(data.allowed[data.stage_of(u)]) for u in range(data.num_units)]
    res = kelley(data, placement.BACKENDS[backend], domains=doms, start=None, pool=pool,
                 deadline=time.perf_counter() + 60)  # fmt: skip
    assert res.status == "optimal"
    assert res.value_s == pytest.approx(best, rel=1e-6)


@pytest.mark.parametrize("backend", ["cpsat", "milp"])
@pytest.mark.parametrize(("dp", "pp", "tp"), [(4, 2, 2), (4, 1, 2), (2, 2, 4), (1, 2, 8)])
def test_the_masters_inputs_are_the_evaluators_for_fixed_placements(backend, dp, pp, tp) -> None:
    """Every unit fixed, the master's least inputs (hops, DP rings, their NIC sharing:
    flows between the trays of a rack share no NIC) are the Evaluator's."""
    instance = on(racks(nic_gbytes_per_s=10.0), model="gpt3-1.3b", use_all_gpus=False)
    plan = layout(instance, dp, pp, tp, vpp=2 if pp > 1 else 1)
    data = build_placement_data(instance, plan)
    xi = data.xi
    timed = np.concatenate((xi.hf, xi.hb, xi.ring)).astype(int)
    rng = np.random.default_rng(1)
    seats = np.repeat(np.arange(data.num_places), data.capacity)
    for _ in range(4):
        assign = rng.permutation(seats)[: data.num_units]
        truth = data.x_of(assign)
        model = PlacementModel(data, placement.BACKENDS[backend](), [np.array([p]) for p in assign],
                               lower_x(data), np.full(xi.size, np.inf), 10 * data.value(assign),
                               symmetry=False)  # fmt: skip
        gradient = np.zeros(xi.size)
        gradient[timed] = 1.0
        model.add_cut(0.0, gradient, "sum")  # t >= the sum of the timed inputs
        assert model.b.solve(10, 1, 0).status == "optimal"
        got = np.array([model.b.value(model.xvar[i]) for i in timed])
        scale = 1e-9 if backend == "cpsat" else 1e-6  # the backends' time units
        assert got * scale == pytest.approx(truth[timed], rel=1e-7, abs=2e-9)


def test_a_solved_tp8_placement_is_the_evaluators_time() -> None:
    instance = on(racks(nic_gbytes_per_s=10.0), use_all_gpus=False)
    plan = layout(instance, 1, 2, 8)
    result = solve_placement(instance, plan, SolveOptions(time_limit_s=10), dp_algorithm="ring")
    info = result.solve_info
    assert info is not None and info.status == "optimal"  # one way to cut a domain into 8s
    assert Evaluator(instance, dp_algorithm="ring").iteration_time(result) == pytest.approx(
        info.objective
    )
    assert len(any_groups(instance, 8)) == 2  # any 8 GPUs of one domain: the domain itself
    _, anywhere = brute_force_placement(instance, plan, "ring", groups="any")
    assert info.objective == pytest.approx(anywhere, rel=1e-6)


@pytest.mark.slow
def test_the_search_finds_tp8_when_it_is_fastest() -> None:
    instance = on(racks(), pp=[1])  # no pipeline: dp2-tp8 beats dp4-tp4 and dp8-tp2
    found = search(instance, SearchOptions(top_k=3, time_limit_s=10))
    best = found.plans[0]
    assert best.tp == 8 and {g // 4 for g in best.placement[0]} == {0, 1}
    assert check_plan(instance, best) == []
