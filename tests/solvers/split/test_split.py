"""Exact layer split (CP-SAT and MILP): cost forms, families, oracle, Megatron flags."""

from __future__ import annotations

import re
import time
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipette_cp.checker.checks import (
    check_memory_limit,
    check_split_contiguous,
    check_split_covers_layers,
)
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.cost.memory.peak import memory_by_stage, usable_memory_bytes
from pipette_cp.errors import InfeasibleError, LayoutError
from pipette_cp.solvers import METHODS, SolveOptions
from pipette_cp.solvers.split import (
    brute_force_split,
    megatron_split_args,
    solve_split,
    with_optimal_split,
)
from pipette_cp.solvers.split import cost as split_cost_module
from pipette_cp.solvers.split.cost import MemoryModel, split_cost
from pipette_cp.solvers.split.heuristics import feasible_start, local_search
from pipette_cp.specs import Instance, Plan
from pipette_cp.specs.layouts import even_split, make_plan
from pipette_cp.units import GB, GiB
from tests.conftest import small_instance

BACKENDS = ("cpsat", "milp")


def plan_for(instance: Instance, dp: int = 1, pp: int = 4, tp: int = 1, vpp: int = 1) -> Plan:
    layers = instance.model.num_layers
    return make_plan(num_layers=layers, dp=dp, pp=pp, tp=tp, micro_batch_size=1, vpp=vpp)


def noisy_instance(nodes: int, layers: int, seed: int, gpus_per_node: int = 1) -> Instance:
    rng = np.random.default_rng(seed)
    bandwidth = 20 * GB * rng.lognormal(0.0, 0.6, (nodes, nodes))
    return small_instance(
        nodes=nodes, gpus_per_node=gpus_per_node, layers=layers, node_bandwidth=bandwidth
    )


def with_usable_memory(instance: Instance, usable_bytes: float) -> Instance:
    """The instance with a GPU whose usable memory is ``usable_bytes`` (< 49 GiB)."""
    cluster = instance.cluster
    (name, gpu), *_ = cluster.gpu_types.items()
    small = gpu.model_copy(update={"memory_bytes": usable_bytes + GiB})  # headroom is 1 GiB
    assert abs(usable_memory_bytes(small) - usable_bytes) < 1.0
    new = cluster.model_copy(update={"gpu_types": {name: small}})
    return instance.model_copy(update={"cluster": new})


def stage_bytes(instance: Instance, plan: Plan, split: tuple[int, ...]) -> np.ndarray:
    candidate = plan.model_copy(update={"layer_split": split})
    return np.array(
        [b.total_bytes for b in memory_by_stage(instance.model, instance.training, candidate)]
    )


def with_split(plan: Plan, split: tuple[int, ...]) -> Plan:
    return plan.model_copy(update={"layer_split": tuple(int(n) for n in split)})


# ------------------------------------------------------------- the cost forms
@pytest.mark.parametrize(
    ("nodes", "kw"),
    [(8, {"dp": 2, "pp": 4}), (4, {"dp": 2, "pp": 2, "vpp": 2}), (4, {"dp": 1, "pp": 4, "vpp": 2})],
)
def test_split_cost_matches_the_evaluator_and_memory_model(nodes: int, kw: dict) -> None:
    instance = noisy_instance(nodes, 16, seed=nodes)
    plan = plan_for(instance, **kw)
    cost = split_cost(instance, plan)
    evaluator = Evaluator(instance, validate=False)
    rng = np.random.default_rng(0)
    chunks = plan.pp * plan.vpp
    for _ in range(6):
        split = tuple(int(n) for n in rng.multinomial(16 - chunks, np.ones(chunks) / chunks) + 1)
        expected = evaluator.evaluate(with_split(plan, split)).iteration_time_s
        assert cost.iteration_time_s(np.array(split)) == pytest.approx(expected, rel=1e-12)
        assert cost.relaxed_time_s(np.array(split)) <= expected * (1 + 1e-12)
        np.testing.assert_allclose(
            cost.memory.stage_bytes(np.array(split), plan.pp),
            stage_bytes(instance, plan, split),
            rtol=1e-12,
        )
    assert cost.convex  # ring vs two-level choice does not change with the stage size here


@pytest.mark.parametrize("kw", [{"dp": 2, "pp": 4}, {"dp": 1, "pp": 4, "vpp": 2}])
def test_relaxed_time_is_convex_and_cuts_support_it(kw: dict) -> None:
    """Midpoint inequality on random real splits; every cut under-estimates everywhere."""
    instance = noisy_instance(8 if kw["dp"] == 2 else 4, 16, seed=3)
    cost = split_cost(instance, plan_for(instance, **kw))
    rng = np.random.default_rng(1)
    chunks = cost.num_chunks
    points = [rng.dirichlet(np.ones(chunks)) * (16 - chunks) + 1 for _ in range(40)]
    for a, b in zip(points[::2], points[1::2], strict=True):
        mid = cost.relaxed_time_s((a + b) / 2)
        assert mid <= (cost.relaxed_time_s(a) + cost.relaxed_time_s(b)) / 2 * (1 + 1e-12)
    cuts = [cost.cut(p, rng) for p in points[:6]]
    for cut in cuts:
        for p in points:
            assert cut(p) <= cost.relaxed_time_s(p) * (1 + 1e-8)  # FD rounding


@settings(max_examples=60, deadline=None)
@given(
    w=st.integers(1, 10_000),
    x=st.integers(0, 10_000),
    r=st.integers(0, 400_000),
    k_min=st.integers(1, 3),
)
def test_memory_facets_keep_exactly_the_integer_points(w: int, x: int, r: int, k_min: int) -> None:
    memory = MemoryModel(
        np.zeros(1), np.array([float(w)]), np.array([float(x)]), np.array([float(r)])
    )
    top, rows = memory.facets(0, k_min, 40)
    for k in range(k_min, 41):
        for n in range(1, k + 1):
            exact = w * k + x * n <= r
            faceted = k <= top and all(a * k + b * n <= c for a, b, c in rows)
            assert exact == faceted, (k, n, top, rows)


# ----------------------------------------------------- per constraint family
def test_split_covers_layers_and_contiguous_on_every_backend() -> None:
    instance = noisy_instance(4, 11, seed=5)
    plan = plan_for(instance, pp=4)
    for backend in BACKENDS:
        result = solve_split(instance, plan, backend=backend)
        done = with_split(plan, result.split)
        assert check_split_covers_layers(instance, done) == []
        assert check_split_contiguous(instance, done) == []
        assert min(result.split) >= 1 and sum(result.split) == 11


def _memory_bound_instance() -> tuple[Instance, Plan, np.ndarray]:
    """12 layers on pp=4 (1F1B: stage 0 holds 4 micro-batches, stage 3 one) with a
    memory limit between stage 0's need at 2 and at 3 layers."""
    instance = small_instance(nodes=1, gpus_per_node=4, layers=12)
    plan = plan_for(instance, pp=4)
    two = stage_bytes(instance, plan, (2, 3, 3, 4))[0]
    three = stage_bytes(instance, plan, (3, 3, 3, 3))[0]
    return with_usable_memory(instance, (two + three) / 2), plan, np.array([two, three])


@pytest.mark.parametrize("backend", BACKENDS)
def test_memory_limit_forces_an_uneven_split(backend: str) -> None:
    instance, plan, _ = _memory_bound_instance()
    assert check_memory_limit(instance, plan)  # the even split does not fit
    result = solve_split(instance, plan, backend=backend)
    done = with_split(plan, result.split)
    assert result.status == "optimal"
    assert result.split[0] <= 2
    assert check_memory_limit(instance, done) == []
    _, best_s = brute_force_split(instance, plan)
    assert result.objective_s == pytest.approx(best_s, rel=1e-6)


def test_memory_limit_nothing_fits_names_the_stage() -> None:
    instance, plan, _ = _memory_bound_instance()
    one_layer = stage_bytes(instance, plan, (1, 1, 1, 9))[0]
    tiny = with_usable_memory(instance, 0.5 * one_layer)
    for backend in BACKENDS:
        with pytest.raises(
            InfeasibleError, match=r"stage 3 needs >= [\d.]+ GB with 1 layer, [\d.]+ GB usable"
        ):
            solve_split(tiny, plan, backend=backend)
    with pytest.raises(InfeasibleError):
        brute_force_split(tiny, plan)


def test_memory_limit_total_capacity_too_small() -> None:
    """Every stage fits one layer, but together they hold fewer than the model's 12."""
    instance = small_instance(nodes=1, gpus_per_node=4, layers=12)
    plan = plan_for(instance, pp=4)
    limit = stage_bytes(instance, plan, (1, 1, 1, 1)).max() + 1.0

    def capacity(stage: int) -> int:
        grown = [
            k
            for k in range(1, 10)
            if stage_bytes(instance, plan, (1,) * stage + (k,) + (1,) * (3 - stage))[stage] <= limit
        ]
        return max(grown)

    assert sum(capacity(s) for s in range(4)) < 12
    tight = with_usable_memory(instance, limit)
    for backend in BACKENDS:
        with pytest.raises(InfeasibleError, match="hold at most"):
            solve_split(tight, plan, backend=backend)


def test_too_few_layers_is_a_layout_error() -> None:
    instance = small_instance(nodes=1, gpus_per_node=4, layers=3)
    plan = make_plan(num_layers=4, dp=1, pp=4, tp=1, micro_batch_size=1)
    with pytest.raises(LayoutError):
        solve_split(instance, plan)


def test_chunk_balance_limits_the_spread_within_a_stage() -> None:
    instance = noisy_instance(2, 12, seed=11)
    plan = plan_for(instance, pp=2, vpp=2)
    for spread in (1, None):
        result = solve_split(instance, plan, chunk_spread=spread)
        chunks = np.reshape(result.split, (2, 2))
        if spread is not None:
            assert (np.abs(chunks[0] - chunks[1]) <= spread).all()
        _, best_s = brute_force_split(instance, plan, chunk_spread=spread)
        assert result.objective_s == pytest.approx(best_s, rel=1e-6)


# --------------------------------------------------------------- the oracle
@st.composite
def tiny_cases(draw: st.DrawFn) -> tuple[Instance, Plan]:
    vpp = draw(st.sampled_from((1, 1, 2)))
    pp = 2 if vpp == 2 else draw(st.integers(1, 4))
    dp = draw(st.sampled_from((1, 2)))
    layers = draw(st.integers(pp * vpp, 12))
    instance = noisy_instance(pp * dp, layers, seed=draw(st.integers(0, 10_000)))
    plan = plan_for(instance, dp=dp, pp=pp, vpp=vpp)
    # usable memory from "everything fits" down to "nothing fits"
    needs = stage_bytes(instance, plan, even_split(layers, pp, vpp))
    scale = draw(st.floats(0.6, 1.3))
    # 12345 B off any round number: the exact-equality boundary is rounded differently
    # by the solvers (conservatively) and the float checker
    return with_usable_memory(instance, float(needs.max() * scale) + 12345.0), plan


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=tiny_cases())
def test_exact_solvers_match_brute_force(case: tuple[Instance, Plan]) -> None:
    instance, plan = case
    try:
        best, best_s = brute_force_split(instance, plan)
    except InfeasibleError:
        for backend in BACKENDS:
            with pytest.raises(InfeasibleError):
                solve_split(instance, plan, backend=backend)
        return
    even = even_split(instance.model.num_layers, plan.pp, plan.vpp)
    even_fits = not check_memory_limit(instance, with_split(plan, even))
    evaluator = Evaluator(instance, validate=False)
    for backend in BACKENDS:
        result = solve_split(instance, plan, backend=backend)
        done = with_split(plan, result.split)
        assert result.status == "optimal", result
        assert result.objective_s == pytest.approx(best_s, rel=1e-6), (backend, result, best)
        assert evaluator.evaluate(done).iteration_time_s == pytest.approx(result.objective_s)
        assert result.bound_s is not None and result.bound_s <= best_s * (1 + 1e-8)
        assert check_memory_limit(instance, done) == []
        assert check_split_covers_layers(instance, done) == []
        if even_fits:
            assert result.objective_s <= result.start_s * (1 + 1e-12)


def test_non_convex_dp_table_keeps_a_valid_bound() -> None:
    """A concave DP-sync table (ring below, two-level above a size) breaks convexity:
    the cuts use its envelope, the bound stays below the true optimum."""
    instance = noisy_instance(4, 10, seed=2)
    plan = plan_for(instance, pp=4)
    cost = split_cost(instance, plan)
    k = np.arange(cost.tails.shape[2])
    tails = cost.tails.copy()
    tails[0] = np.minimum(0.02 * k, 0.05 + 0.002 * k)[None, :]  # concave, large
    envelope = np.stack([[split_cost_module._lower_hull(row) for row in part] for part in tails])
    bent = replace(cost, tails=tails, envelope=envelope)
    assert not bent.convex
    truth = min(
        bent.iteration_time_s(np.array(s))
        for s in _compositions(10, 4)
        if bent.allowed(np.array(s))
    )
    for backend in BACKENDS:
        result = solve_split(instance, plan, backend=backend, cost=bent)
        assert result.bound_s is not None and result.bound_s <= truth * (1 + 1e-8)
        assert result.objective_s >= truth * (1 - 1e-12)
        if result.status == "optimal":
            assert result.objective_s == pytest.approx(truth, rel=1e-6)


def _compositions(total: int, parts: int) -> list[tuple[int, ...]]:
    if parts == 1:
        return [(total,)]
    return [(n, *rest) for n in range(1, total) for rest in _compositions(total - n, parts - 1)]


# ---------------------------------------------------- options and interface
def test_tiny_time_limit_still_returns_a_valid_split() -> None:
    instance = noisy_instance(8, 64, seed=4)
    plan = plan_for(instance, pp=8)
    for backend in BACKENDS:
        started = time.perf_counter()
        result = solve_split(instance, plan, SolveOptions(time_limit_s=1e-3), backend)
        assert time.perf_counter() - started < 2.0
        assert result.status in ("feasible", "optimal")
        done = with_split(plan, result.split)
        assert check_split_covers_layers(instance, done) == []
        assert check_memory_limit(instance, done) == []
        assert result.objective_s <= result.start_s * (1 + 1e-12)


def test_heuristics_start_feasible_and_never_get_worse() -> None:
    instance, plan, _ = _memory_bound_instance()
    cost = split_cost(instance, plan)
    start = feasible_start(cost)
    assert cost.allowed(start) and start.sum() == 12
    trail = local_search(cost, start, np.random.default_rng(0), deadline_s=time.perf_counter() + 5)
    assert trail.time_s <= cost.iteration_time_s(start)
    assert cost.allowed(trail.split)


def test_with_optimal_split_and_registry(tmp_path) -> None:
    instance = noisy_instance(4, 10, seed=8)
    plan = plan_for(instance, pp=4)
    done = with_optimal_split(instance, plan, SolveOptions(time_limit_s=5), "milp")
    assert done.placement == plan.placement
    assert done.solve_info is not None
    assert (done.solve_info.method, done.solve_info.status) == ("split-milp", "optimal")
    assert done.solve_info.gap is not None and done.solve_info.gap <= 1e-6
    assert {"split-cpsat", "split-milp"} <= set(METHODS)
    via_registry = METHODS["split-cpsat"](instance, plan, SolveOptions())
    assert via_registry.solve_info.objective == pytest.approx(done.solve_info.objective)
    for backend, name in (("cpsat", "split.pb.txt"), ("milp", "split.lp")):
        solve_split(instance, plan, backend=backend, export_path=tmp_path / name)
        text = (tmp_path / name).read_text()
        assert "memory_limit" in text and "iteration_time" in text


# ----------------------------------------------------------- Megatron flags
def _parse_layout(layout: str) -> list[int]:
    """Transformer layers per virtual stage of a Megatron layout string (E, t*k, L)."""
    assert layout.startswith("E") and layout.endswith("L")
    expanded = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), layout)
    return [group.count("t") for group in expanded.split("|")]


@pytest.mark.parametrize(
    ("pp", "vpp", "split", "expected"),
    [
        (4, 1, (2, 2, 2, 2), []),
        (2, 2, (3, 3, 3, 3), []),
        (4, 1, (1, 2, 2, 3), ["--decoder-first-pipeline-num-layers", "1",
                              "--decoder-last-pipeline-num-layers", "3"]),
        (4, 1, (3, 2, 2, 2), ["--decoder-first-pipeline-num-layers", "3"]),
        (4, 1, (2, 2, 2, 1), ["--decoder-last-pipeline-num-layers", "1"]),
        (2, 1, (3, 5), ["--decoder-first-pipeline-num-layers", "3"]),
        (4, 2, (1, 2, 2, 3, 1, 2, 2, 3), ["--decoder-first-pipeline-num-layers", "2",
                                          "--decoder-last-pipeline-num-layers", "6"]),
        (4, 1, (2, 1, 3, 2), ["--pipeline-model-parallel-layout", "Et*2|t|t*3|t*2L"]),
        (2, 2, (1, 2, 2, 2), ["--pipeline-model-parallel-layout", "Et|t*2|t*2|t*2L"]),
    ],
)  # fmt: skip
def test_megatron_split_args(pp: int, vpp: int, split: tuple, expected: list[str]) -> None:
    plan = make_plan(
        num_layers=sum(split), dp=1, pp=pp, tp=1, micro_batch_size=1, vpp=vpp, layer_split=split
    )
    args = megatron_split_args(plan, sum(split))
    assert args == expected
    if args[:1] == ["--pipeline-model-parallel-layout"]:
        assert _parse_layout(args[1]) == list(split)  # Megatron's chunk order: c * pp + s


def test_megatron_split_args_realise_the_split() -> None:
    """Re-derive every stage's layers from the flags as Megatron's get_num_layers_to_build."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        pp, vpp = int(rng.integers(2, 6)), int(rng.integers(1, 3))
        split = tuple(int(n) for n in rng.integers(1, 4, pp * vpp))
        plan = make_plan(num_layers=sum(split), dp=1, pp=pp, tp=1, micro_batch_size=1,
                         vpp=vpp, layer_split=split)  # fmt: skip
        args = dict(zip(*[iter(megatron_split_args(plan, sum(split)))] * 2, strict=True))
        if "--pipeline-model-parallel-layout" in args:
            assert _parse_layout(args["--pipeline-model-parallel-layout"]) == list(split)
            continue
        first = args.get("--decoder-first-pipeline-num-layers")
        last = args.get("--decoder-last-pipeline-num-layers")
        rest = sum(split) - int(first or 0) - int(last or 0)
        middle = rest // (pp - (first is not None) - (last is not None))
        totals = [middle] * pp
        if first is not None:
            totals[0] = int(first)
        if last is not None:
            totals[-1] = int(last)
        rebuilt = [totals[s] // vpp for c in range(vpp) for s in range(pp)]
        assert rebuilt == list(split)
