"""The placement masters' families of expert all-to-alls, context-parallel rings and
expert data-parallel rings: their inputs are the Evaluator's, a master with every unit
fixed reads the Evaluator's time (neither above: a valid bound; nor below: exact), and
from no start the masters reach the brute-force optimum and prove it."""

from __future__ import annotations

import time

import numpy as np
import pytest

from pipette_cp.clusters.expand import cluster_from_node_matrix
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.solvers import SolveOptions, get_method
from pipette_cp.solvers.placement import BACKENDS
from pipette_cp.solvers.placement.build import build_placement_data
from pipette_cp.solvers.placement.families import SYMMETRY
from pipette_cp.solvers.placement.families.group_tables import group_tables
from pipette_cp.solvers.placement.families.symmetry import rotation_period, rotations_keep_rings
from pipette_cp.solvers.placement.kelley import CutPool, kelley, lower_x, worst_x
from pipette_cp.solvers.placement.model import PlacementModel
from pipette_cp.solvers.placement.oracle import brute_force_placement
from pipette_cp.specs import TrainingSpec, resolve_gpu
from pipette_cp.specs.layouts import make_plan
from tests.cost.network.test_parallel_groups import _instance, _moe_model, slow_pairs_cluster
from tests.solvers.placement.test_nvlink_domains import racks

GB = 1e9
#: a model whose step takes ~0.2-0.4 s (the masters work in 1 ns quanta)
MODEL = _moe_model(hidden_size=2048, ffn_hidden_size=8192, moe_ffn_hidden_size=4096,
                   num_attention_heads=16)  # fmt: skip
#: (dp, pp, tp, cp, ep, etp)
LAYOUTS = [
    (4, 1, 1, 1, 2, None), (4, 1, 1, 1, 4, None), (2, 2, 1, 2, 2, None), (2, 1, 2, 1, 4, 1),
    (4, 1, 2, 1, 2, None), (2, 1, 2, 2, 4, 1), (1, 2, 2, 2, 2, None), (8, 1, 1, 1, 8, None),
    (2, 1, 1, 4, 4, None), (4, 1, 2, 1, 8, 1), (2, 2, 2, 1, 2, 1), (2, 1, 1, 2, 4, None),
]  # fmt: skip


def uneven(nodes: int, gpus: int, seed: int = 5):
    """Every GPU pair of two nodes alike (node places), node pairs at 5, 12 or 20 GB/s."""
    rng = np.random.default_rng(seed)
    matrix = rng.choice([5 * GB, 12 * GB, 20 * GB], size=(nodes, nodes))
    return cluster_from_node_matrix(
        node_bandwidth=np.minimum(matrix, matrix.T), intra_node=200 * GB, gpus_per_node=gpus,
        gpu=resolve_gpu("h100"), nics_per_node=1, nic_bandwidth_bytes_per_s=25 * GB,
    )  # fmt: skip


def setup(layout, gpus: int = 4, cluster=None, dispatcher: str = "alltoall"):
    dp, pp, tp, cp, ep, etp = layout
    n = dp * pp * tp * cp
    inst = _instance(MODEL, cluster or uneven(max(2, n // gpus), gpus), seq=4096, gbs=16)
    training = inst.training.model_copy(update={"moe_token_dispatcher": dispatcher})
    inst = inst.model_copy(update={"training": training})
    plan = make_plan(num_layers=4, dp=dp, pp=pp, tp=tp, cp=cp, ep=ep, etp=etp,
                     micro_batch_size=1, sequence_parallel=tp > 1,
                     distributed_optimizer=True)  # fmt: skip
    return inst, plan


def random_assignments(data, count: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    seats = np.repeat(np.arange(data.num_places), data.capacity)
    for _ in range(count):
        yield rng.permutation(seats)[: data.num_units]


@pytest.mark.parametrize("gpus", [2, 4])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_group_inputs_are_the_evaluators(layout, gpus) -> None:
    if layout[2] > gpus:
        pytest.skip("tp above the node")
    inst, plan = setup(layout, gpus)
    data = build_placement_data(inst, plan)
    assert data.exact and group_tables(data) is not None
    ring = Evaluator(inst, dp_algorithm="ring", validate=False)
    for assign in random_assignments(data, 8):
        truth = ring.iteration_time(plan.model_copy(update={"placement": data.placement(assign)}))
        assert data.total_time_s(data.x_of(assign)) == pytest.approx(truth, rel=1e-12)


@pytest.mark.parametrize("dispatcher", ["flex", "allgather"])
def test_other_dispatchers_and_nvlink_domains_keep_the_inputs(dispatcher) -> None:
    for inst, plan in (setup((4, 1, 1, 1, 4, None), 2, dispatcher=dispatcher),
                       setup((2, 1, 2, 2, 4, 1), cluster=racks(), dispatcher=dispatcher)):  # fmt: skip
        data = build_placement_data(inst, plan)
        ring = Evaluator(inst, dp_algorithm="ring", validate=False)
        for assign in random_assignments(data, 6):
            placed = plan.model_copy(update={"placement": data.placement(assign)})
            truth = ring.iteration_time(placed)
            assert data.total_time_s(data.x_of(assign)) == pytest.approx(truth, rel=1e-12)
        # DeepEP's saving depends on how many nodes a group spans: priced by its floor
        assert data.exact == (dispatcher != "flex")


def _fixed_master_time(data, assign, backend: str) -> tuple[float, float]:
    """The master's least time over the placement's, and the rounding it may lose: the
    masters' times are whole nanoseconds, so each input may read up to 1 ns low, times
    its slope in the cut (an iteration runs ~100 all-to-alls of each stage)."""
    x = data.x_of(assign)
    f = data.total_time_s(x)
    pool = CutPool(data, upper_s=2 * f)
    pool.add_at(x)
    lx, ux = np.zeros(data.xi.size), np.full(data.xi.size, np.inf)
    ux[data.xi.booleans] = 1.0
    domains = [np.array([p]) for p in assign]
    model = PlacementModel(data, BACKENDS[backend](), domains, lx, ux, 2 * f, symmetry=False)
    for k, (a, g) in enumerate(pool.cuts):
        model.add_cut(a, g, f"cut_{k}")
    res = model.b.solve(20, 1, 0)
    assert res.status == "optimal"
    slopes = sum(float(g.sum()) for _, g in pool.cuts)
    return float(res.objective_s) / f, (2e-9 * slopes + 1e-8) / f


@pytest.mark.parametrize("backend", ["cpsat", "milp"])
@pytest.mark.parametrize("layout", [*LAYOUTS[::2], LAYOUTS[-1]])
def test_every_unit_fixed_the_master_reads_the_evaluators_time(layout, backend) -> None:
    """With one cut at the placement's own inputs, the master's least time is that
    placement's time: no family over-charges (the bound stays valid) and none is loose
    (1 ns quanta and the cut's rounding aside)."""
    for gpus, cluster in ((2, None), (4, None), (4, racks())):
        if layout[2] > gpus or (cluster is not None and np.prod(layout[:4]) > 16):
            continue
        inst, plan = setup(layout, gpus, cluster)
        data = build_placement_data(inst, plan)
        for assign in random_assignments(data, 3, seed=gpus):
            ratio, rounding = _fixed_master_time(data, assign, backend)
            assert ratio == pytest.approx(1.0, abs=rounding)


@pytest.mark.parametrize("backend", ["cpsat", "milp"])
@pytest.mark.parametrize(
    ("layout", "gpus"),
    [((4, 1, 1, 1, 2, None), 2), ((2, 1, 1, 2, 2, None), 2), ((2, 1, 2, 1, 4, 1), 2),
     ((3, 1, 1, 2, 2, None), 3), ((6, 1, 1, 1, 2, None), 3), ((1, 2, 2, 2, 2, None), 2),
     ((2, 1, 2, 2, 2, None), 4)],
)  # fmt: skip
def test_the_masters_reach_and_prove_the_oracles_optimum(layout, gpus, backend) -> None:
    """From no start (ring all-reduce, the masters' model), on clusters whose node pairs
    differ: the brute-force optimum, proved optimal, with a bound below it."""
    inst, plan = setup(layout, gpus, uneven(int(np.prod(layout[:4])) // gpus, gpus, seed=3))
    _, best = brute_force_placement(inst, plan, "ring")
    data = build_placement_data(inst, plan)
    pool = CutPool(data, upper_s=2 * data.total_time_s(worst_x(data)))
    pool.add_at(lower_x(data))
    domains = [np.flatnonzero(data.allowed[data.stage_of(u)]) for u in range(data.num_units)]
    res = kelley(data, BACKENDS[backend], domains=domains, start=None, pool=pool,
                 deadline=time.perf_counter() + 60)  # fmt: skip
    assert res.status == "optimal"
    assert res.value_s == pytest.approx(best, rel=1e-6)
    assert res.bound_s <= best * (1 + 1e-9)


def test_groups_are_priced_only_where_the_unit_form_is_exact() -> None:
    inst = _instance(MODEL, slow_pairs_cluster(), seq=2048, gbs=12)
    plan = make_plan(num_layers=4, dp=6, pp=1, tp=1, ep=2, micro_batch_size=1)
    data = build_placement_data(inst, plan)  # slow pairs inside a node: slot places
    assert (tables := group_tables(data)) is not None and not tables.priced and not data.exact
    # bounded by 0 where unpriced, and the placement's own value is still the Evaluator's
    ring = Evaluator(inst, dp_algorithm="ring", validate=False)
    for assign in random_assignments(data, 8):
        if np.isfinite(value := data.value(assign)):  # not across a failed pair
            placed = plan.model_copy(update={"placement": data.placement(assign)})
            assert value == pytest.approx(ring.iteration_time(placed), rel=1e-12)


@pytest.mark.parametrize(
    ("layout", "period"),
    [((4, 1, 1, 1, 1, None), 1), ((2, 1, 1, 2, 1, None), 2), ((4, 1, 1, 1, 4, None), 1),
     ((8, 1, 1, 1, 4, None), 4), ((2, 1, 1, 2, 4, None), 2), ((4, 1, 2, 1, 4, 1), 2),
     ((4, 1, 2, 1, 2, 1), 1)],
)  # fmt: skip
def test_replica_rotations_keep_the_groups(layout, period) -> None:
    """Only rotations by the period map every group onto one of its kind; the canonical
    form of a placement has the same time (where a rotation may change the ring NCCL
    builds, more than two replicas over more than two nodes, none is made)."""
    inst, plan = setup(layout, 2)
    data = build_placement_data(inst, plan)
    assert rotation_period(data) == period
    keeps = rotations_keep_rings(data)
    assert keeps == (plan.replicas <= 2 or inst.cluster.num_nodes <= 2)
    for assign in random_assignments(data, 5):
        moved = SYMMETRY.canonical(data, assign)
        assert data.value(moved) == pytest.approx(data.value(assign), rel=1e-12)
        grid = moved.reshape(plan.pp, plan.replicas)
        if keeps:
            assert grid[0, 0] == grid[0, ::period].min()
        else:
            assert np.array_equal(moved, assign)


@pytest.mark.parametrize("method", ["cpsat", "milp"])
def test_solving_claims_optimal_only_at_the_oracles_optimum(method) -> None:
    """The whole method (seeds, master, the Evaluator's choice of all-reduce): one GPU per
    node, so the ring is the only all-reduce and the master's bound is the claim's."""
    inst, plan = setup((4, 1, 1, 1, 2, None), 1, uneven(4, 1, seed=2))
    training = TrainingSpec(global_batch_size=16, seq_length=4096)
    inst = inst.model_copy(update={"training": training})
    _, best = brute_force_placement(inst, plan)
    solved = get_method(method)(inst, plan, SolveOptions(time_limit_s=5))
    info = solved.solve_info
    assert info is not None and info.status == "optimal"
    assert Evaluator(inst).iteration_time(solved) == pytest.approx(best, rel=1e-6)
    assert info.bound is not None and info.bound <= best * (1 + 1e-9)


def test_an_uneven_expert_group_is_left_to_the_bound() -> None:
    """ep x etp (6) neither a multiple nor a divisor of tp (4): a unit's ranks have
    different peers, so the all-to-all is not priced (0 bounds it) and nothing is claimed;
    a placement's value is still the Evaluator's."""
    model = MODEL.model_copy(update={"num_experts": 12})
    inst = _instance(model, uneven(3, 4), seq=4096, gbs=12)
    plan = make_plan(num_layers=4, dp=3, pp=1, tp=4, ep=6, etp=1, micro_batch_size=1,
                     sequence_parallel=True)  # fmt: skip
    data = build_placement_data(inst, plan)
    tables = group_tables(data)
    assert tables is not None and "a2a" not in tables.priced and not data.exact
    ring = Evaluator(inst, dp_algorithm="ring", validate=False)
    for assign in random_assignments(data, 4):
        placed = plan.model_copy(update={"placement": data.placement(assign)})
        assert data.value(assign) == pytest.approx(ring.iteration_time(placed), rel=1e-12)


@pytest.mark.parametrize("layout", [(4, 1, 2, 1, 1, 1), (2, 2, 2, 1, 1, 1)])
def test_expert_rings_inside_units_are_synced_and_left_to_the_bound(layout) -> None:
    """ep = 1 with etp below tp: the experts' gradients still need their own rings (each
    through the units' tp ranks in turn: links inside a unit, so not priced); the
    Evaluator charges them, and a placement's value is the Evaluator's."""
    inst, plan = setup(layout, 2)
    data = build_placement_data(inst, plan)
    assert (tables := group_tables(data)) is not None and tables.ering_classes and not data.exact
    ring = Evaluator(inst, dp_algorithm="ring", validate=False)
    dense_only = plan.model_copy(update={"etp": None})  # etp = tp: no rings of their own
    for assign in random_assignments(data, 4):
        placed = plan.model_copy(update={"placement": data.placement(assign)})
        truth = ring.iteration_time(placed)
        assert data.value(assign) == pytest.approx(truth, rel=1e-12)
        inputs, _ = ring.pipeline_inputs(placed)
        other, _ = ring.pipeline_inputs(
            dense_only.model_copy(update={"placement": placed.placement})
        )
        assert (inputs.dp_sync_s > other.dp_sync_s).all()  # the experts' sync is charged
