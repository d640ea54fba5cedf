"""Kelley cuts are valid under-estimators, also where pieces of the time function tie.

The placement masters prove optimality only if every cut lies below the iteration
time at every placement; ties between pipeline hops (equal links, equal stages) are
the common case and were where finite differences mixed two pieces' slopes.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pipette_cp.clusters.generators.registry import generate
from pipette_cp.errors import InfeasibleError, SolverTimeoutError
from pipette_cp.io.model_file import load_model
from pipette_cp.solvers.cuts import supporting_cut
from pipette_cp.solvers.methods import exact_placement
from pipette_cp.solvers.options import SolveOptions
from pipette_cp.solvers.placement import kelley as kelley_module
from pipette_cp.solvers.placement.build import build_placement_data
from pipette_cp.solvers.placement.kelley import CutPool
from pipette_cp.solvers.placement.oracle import brute_force_placement
from pipette_cp.specs import Instance, SearchSpace, TrainingSpec
from pipette_cp.specs.layouts import make_plan


@given(
    st.lists(st.integers(1, 64), min_size=2, max_size=6),
    st.integers(0, 2**16),
)
@settings(max_examples=60, deadline=None)
@example(slopes=[30, 59, 2, 61, 41, 63], seed=65534)  # a slope of 2 read as 1.9999 (rounding)
def test_cut_at_a_tie_of_steep_and_flat_slopes_is_valid(slopes, seed) -> None:
    """``max_k (slopes rolled by k) . x`` at a point where every piece ties."""
    n = len(slopes)
    rows = np.array([np.roll(slopes, k) for k in range(n)], dtype=float)

    def f(v: np.ndarray) -> float:
        return float((rows @ v).max())

    rng = np.random.default_rng(seed)
    cut = supporting_cut(f, np.ones(n), rng=rng)
    assert cut(np.ones(n)) == pytest.approx(f(np.ones(n)), rel=1e-6)  # tight at the tie
    # one piece's slopes, each within the rounding bound the cut states for it
    assert cut.error is not None
    assert any((np.abs(cut.gradient - r) <= cut.error + 1e-9 * np.abs(r)).all() for r in rows)
    for p in rng.random((200, n)) * 2:
        assert cut(p) <= f(p) * (1 + 1e-6)


def _degraded_pipeline(seed: int = 0) -> tuple[Instance, object]:
    """gpt3-350m, dp1-pp8 on a generated 4 x 2 degraded A100 cluster: equal hop times tie."""
    cluster = generate("g3", nodes=4, seed=seed, gpus_per_node=2)
    model = load_model("gpt3-350m")
    training = TrainingSpec(global_batch_size=32, seq_length=2048)
    instance = Instance(
        name="tie", model=model, cluster=cluster, training=training, search_space=SearchSpace()
    )
    return instance, make_plan(num_layers=model.num_layers, dp=1, pp=8, tp=1, micro_batch_size=1)


def _random_inputs(data, seed: int, count: int) -> tuple[list[np.ndarray], np.ndarray]:
    """The master's inputs and times of ``count`` random placements."""
    rng = np.random.default_rng(seed)
    slots = np.repeat(np.arange(data.num_places), data.capacity)
    xs = [data.x_of(rng.permutation(slots)[: data.num_units]) for _ in range(count)]
    return xs, np.array([data.total_time_s(x) for x in xs])


def test_master_cuts_lie_below_the_time_of_random_placements() -> None:
    instance, plan = _degraded_pipeline()
    data = build_placement_data(instance, plan)
    xs, times = _random_inputs(data, seed=1, count=120)
    pool = CutPool(data, upper_s=float(times.max()))
    for x in xs[:60]:
        intercept, gradient = pool.add_at(x)
        assert (intercept + np.array(xs) @ gradient <= times).all()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["cpsat", "milp"])
def test_optimal_claim_at_tied_hops_matches_the_oracle(backend) -> None:
    instance, plan = _degraded_pipeline()
    solved = exact_placement(instance, plan, SolveOptions(time_limit_s=20, seed=0), backend=backend)
    _, best = brute_force_placement(instance, plan)
    info = solved.solve_info
    assert info.bound is not None and info.bound <= best * (1 + 1e-9)
    if info.status == "optimal":
        assert info.objective == pytest.approx(best, rel=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 2, 4, 5, 7, 8])
@pytest.mark.parametrize(("dp", "pp", "tp"), [(2, 2, 1), (4, 1, 1), (2, 1, 2), (4, 2, 1)])
def test_two_level_layouts_get_a_bound_that_holds(seed, dp, pp, tp) -> None:
    """Two replicas of a stage may share a node, so the Evaluator may pick the two-level
    all-reduce (outside the master): the reported bound is the floor of both, and it
    must lie below the brute-force optimum under the Evaluator's own choice."""
    from tests.solvers.placement.test_oracle import random_cluster

    instance = random_cluster(seed, 2, 4)
    if instance is None:
        raise AssertionError("the random cluster cut a node off")
    plan = make_plan(num_layers=8, dp=dp, pp=pp, tp=tp, micro_batch_size=1)
    try:
        _, best = brute_force_placement(instance, plan)
    except InfeasibleError:
        pytest.skip("no placement avoids the failed links")
    solved = exact_placement(instance, plan, SolveOptions(time_limit_s=10, seed=0))
    info = solved.solve_info
    assert info.bound is not None and info.gap is not None
    assert info.bound <= best * (1 + 1e-9) and info.objective >= best * (1 - 1e-9)
    if info.status == "optimal":
        assert info.objective == pytest.approx(best, rel=1e-6)


def test_where_no_supporting_cut_is_found_the_flat_floor_still_holds(monkeypatch) -> None:
    instance, plan = _degraded_pipeline()
    data = build_placement_data(instance, plan)
    xs, times = _random_inputs(data, seed=2, count=60)

    def no_cut(*args, **kwargs):
        raise ValueError("no hair gives agreeing difference quotients")

    monkeypatch.setattr(kelley_module, "supporting_cut", no_cut)
    pool = CutPool(data, upper_s=float(times.max()))
    intercept, gradient = pool.add_at(xs[0])
    assert not gradient.any() and 0 < intercept <= times.min()


def test_a_cut_stops_when_its_time_runs_out() -> None:
    """Building one cut prices f twice a coordinate: minutes on thousands of GPUs, so it
    checks the deadline between coordinates (a 60 s search ran past 5 minutes)."""
    calls = []

    def f(v: np.ndarray) -> float:
        calls.append(1)
        return float(v.sum())

    with pytest.raises(SolverTimeoutError):
        supporting_cut(f, np.ones(50), expired=lambda: len(calls) > 10)
    assert len(calls) <= 13  # stopped at the next coordinate, not after all 50
    assert supporting_cut(f, np.ones(3), expired=lambda: False)(np.zeros(3)) <= 1e-6
