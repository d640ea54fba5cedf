"""Exact placement vs the brute-force oracle on tiny random clusters (<= 8 units).

The oracle (:mod:`pipette_cp.solvers.placement.oracle`) enumerates every placement on
tp-aligned blocks and scores it with the Evaluator; the exact methods must
reach its optimum, with DP rings in replica order (the master's model) and
with the Evaluator's default choice of ring or two-level all-reduce whenever
the method claims optimality.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.errors import InfeasibleError, SpecError
from pipette_cp.solvers import placement
from pipette_cp.solvers.methods import exact_placement
from pipette_cp.solvers.options import SolveOptions
from pipette_cp.solvers.placement.build import build_placement_data
from pipette_cp.solvers.placement.kelley import CutPool, kelley, lower_x
from pipette_cp.solvers.placement.oracle import brute_force_placement
from pipette_cp.specs import Instance, SearchSpace
from pipette_cp.specs.layouts import make_plan
from tests.conftest import small_instance


def random_cluster(seed: int, nodes: int, gpus: int) -> Instance | None:
    """Lognormal links, ~30 % degraded to 0.6x, ~15 % failed; None if a node is cut off."""
    rng = np.random.default_rng(seed)
    m = 20e9 * rng.lognormal(0.0, 0.1, (nodes, nodes))
    m[rng.random((nodes, nodes)) < 0.3] *= 0.6
    m[rng.random((nodes, nodes)) < 0.15] = 0.0
    np.fill_diagonal(m, 0.0)
    try:
        instance = small_instance(nodes=nodes, gpus_per_node=gpus, node_bandwidth=m)
    except SpecError:
        return None
    return instance.model_copy(update={"search_space": SearchSpace(use_all_gpus=False)})


@st.composite
def tiny_problems(draw: st.DrawFn) -> tuple[Instance, object] | None:
    nodes = draw(st.integers(2, 3))
    gpus = draw(st.sampled_from([2, 4]))
    tp = draw(st.sampled_from([t for t in (1, 2, 4) if gpus % t == 0]))
    slots = nodes * gpus // tp
    shapes = [(pp, dp) for pp in (1, 2, 4) for dp in (1, 2, 4) if 2 <= pp * dp <= min(slots, 6)]
    if not shapes or slots > 8:
        return None
    pp, dp = draw(st.sampled_from(shapes))
    vpp = draw(st.sampled_from([1, 2])) if pp > 1 else 1
    instance = random_cluster(draw(st.integers(0, 10_000)), nodes, gpus)
    if instance is None:
        return None
    plan = make_plan(num_layers=8, dp=dp, pp=pp, tp=tp, micro_batch_size=1, vpp=vpp)
    return instance, plan


def _solve(instance, plan, algorithm, backend="cpsat"):
    try:
        return exact_placement(instance, plan, SolveOptions(time_limit_s=10), backend, algorithm)
    except InfeasibleError:
        return None


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(tiny_problems())
def test_cpsat_matches_the_brute_force_oracle(problem) -> None:
    if problem is None:
        return
    instance, plan = problem
    for algorithm in ("ring", "best"):
        try:
            _, best = brute_force_placement(instance, plan, algorithm)
        except InfeasibleError:
            assert _solve(instance, plan, algorithm) is None
            continue
        result = _solve(instance, plan, algorithm)
        assert result is not None and result.solve_info is not None
        info = result.solve_info
        assert info.objective >= best * (1 - 1e-9)  # never better than the true optimum
        if algorithm == "ring" or info.status == "optimal":
            assert info.status == "optimal"
            assert info.objective == pytest.approx(best, rel=1e-6)


FIXED = [
    (11, 2, 4, 2, 2, 2, 1),
    (23, 2, 4, 1, 2, 4, 1),
    (5, 3, 2, 1, 2, 3, 1),
    (8, 2, 4, 2, 2, 2, 2),
]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["cpsat", "milp"])
@pytest.mark.parametrize("seed, nodes, gpus, tp, pp, dp, vpp", FIXED)
def test_masters_alone_match_the_oracle(backend, seed, nodes, gpus, tp, pp, dp, vpp) -> None:
    """The Kelley loop from no start at all (no seeds, no local search) is exact."""
    instance = random_cluster(seed, nodes, gpus)
    assert instance is not None
    plan = make_plan(num_layers=8, dp=dp, pp=pp, tp=tp, micro_batch_size=1, vpp=vpp)
    try:
        _, best = brute_force_placement(instance, plan, "ring")
    except InfeasibleError:
        best = None
    data = build_placement_data(instance, plan)
    pool = CutPool(data, upper_s=1e3)
    pool.add_at(lower_x(data))
    doms = [np.flatnonzero(data.allowed[data.stage_of(u)]) for u in range(data.num_units)]
    run = placement.BACKENDS[backend]
    deadline = time.perf_counter() + 30
    if best is None:
        with pytest.raises(InfeasibleError):
            kelley(data, run, domains=doms, start=None, pool=pool, deadline=deadline)
        return
    res = kelley(data, run, domains=doms, start=None, pool=pool, deadline=deadline)
    assert res.status == "optimal"
    assert res.value_s == pytest.approx(best, rel=1e-6)
    assert res.bound_s <= res.value_s


ZERO = [(0, "optim_grads"), (2, "optim_grads_params"), (5, "optim_grads_params")]


@pytest.mark.parametrize("backend", ["cpsat", "milp"])
@pytest.mark.parametrize("seed, sharding", ZERO)
def test_masters_see_the_zero_collectives(backend, seed, sharding) -> None:
    """ZeRO-2/3 collectives in the master: its value is the Evaluator's (ring) on every
    placement, the exposed per-layer collectives are part of it, and the Kelley loop
    reaches the brute-force optimum."""
    instance = random_cluster(seed, 2, 2)
    assert instance is not None
    plan = make_plan(num_layers=8, dp=4, pp=1, tp=1, micro_batch_size=1, dp_sharding=sharding)
    data = build_placement_data(instance, plan)
    ring = Evaluator(data.instance, dp_algorithm="ring")
    rng = np.random.default_rng(seed)
    exposed = 0.0
    seats = np.repeat(np.arange(data.num_places), data.capacity)  # a place holds capacity units
    for _ in range(6):
        assign = rng.permutation(seats)[: data.num_units]
        placed = plan.model_copy(update={"placement": data.placement(assign)})
        try:
            expected = ring.iteration_time(placed)
        except InfeasibleError:
            assert data.value(assign) == float("inf")
            continue
        assert data.value(assign) == pytest.approx(expected, rel=1e-9)
        x = data.x_of(assign)
        free = x.copy()
        free[data.xi.ring] = 0.0  # the collectives for free: only the latency is left
        exposed = max(exposed, data.total_time_s(x) - data.total_time_s(free))
    assert exposed > 0  # the placement changes the time through the ZeRO collectives
    _, best = brute_force_placement(data.instance, plan, "ring")
    pool = CutPool(data, upper_s=1e3)
    pool.add_at(lower_x(data))
    doms = [np.flatnonzero(data.allowed[data.stage_of(u)]) for u in range(data.num_units)]
    deadline = time.perf_counter() + 30
    res = kelley(data, placement.BACKENDS[backend], domains=doms, start=None, pool=pool, deadline=deadline)  # fmt: skip
    assert res.status == "optimal"
    assert res.value_s == pytest.approx(best, rel=1e-6)


def _ring_bound_by_full_sort(cost: np.ndarray, capacity: np.ndarray, size: int) -> float:
    """The reference: every pair sorted, Kruskal until a group holds ``size`` units."""
    n = len(capacity)
    best = float(np.where(capacity >= size, np.diagonal(cost), np.inf).min(initial=np.inf))
    pairs = sorted((min(cost[a, b], cost[b, a]), a, b) for a in range(n) for b in range(a + 1, n))
    group, held = list(range(n)), [int(c) for c in capacity]
    for v, a, b in pairs:
        if not np.isfinite(v) or v >= best:
            break
        ga, gb = group[a], group[b]
        if ga != gb:
            group = [ga if g == gb else g for g in group]
            held[ga] += held[gb]
            if held[ga] >= size:
                return float(v)
    return best if np.isfinite(best) else 0.0


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 40), st.integers(0, 2**16), st.integers(1, 12), st.booleans())
def test_ring_bound_is_the_full_sorts(n, seed, size, ties) -> None:
    """The banded Kruskal of ring_bound gives what sorting every pair gives (ties and
    failed pairs included)."""
    from pipette_cp.solvers.placement.kelley import ring_bound

    rng = np.random.default_rng(seed)
    cost = rng.integers(1, 4, (n, n)).astype(float) if ties else rng.random((n, n))
    cost[rng.random((n, n)) < 0.2] = np.inf
    capacity = rng.integers(1, 3, n)
    assert ring_bound(cost, capacity, size) == _ring_bound_by_full_sort(cost, capacity, size)
