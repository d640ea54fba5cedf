"""The placement master's per-problem memo: its cost matrices and per-class lower bounds
are those computed afresh (a copy of the loop before the memo is the oracle)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pipette_cp.experiments.solving.time_limits import skeleton
from pipette_cp.io.instance_file import load_instance
from pipette_cp.solvers.placement.build import build_placement_data
from pipette_cp.solvers.placement.families.hops import hop_cost
from pipette_cp.solvers.placement.kelley import (
    RING_BOUND_PLACES,
    class_costs,
    lower_x,
    ring_bound,
    worst_x,
)

INSTANCES = (
    "llama-2-7b-g3-32",
    "gpt3-760m-g5-3n-slownic",
    "gpt3-6.7b-g1-128",
    "llama-2-13b-g4-128",
)


def _fresh_costs(d) -> list[tuple[int, np.ndarray, int, int]]:
    xi, pp = d.xi, d.plan.pp
    out = []
    for s in range(d.hops):
        out += [(int(xi.hf[s]), d.latency + d.act_bytes * d.inv_bw, s, (s + 1) % pp),
                (int(xi.hb[s]), d.latency + d.act_bytes * d.inv_bw.T, s, (s + 1) % pp)]  # fmt: skip
    if d.plan.replicas > 1:
        for s in range(pp):
            ring = d.ring_bytes[s] * d.inv_bw if d.ring_bytes[s] else np.zeros_like(d.inv_bw)
            out.append((int(xi.ring[s]), ring, s, s))
    if xi.emb.size:
        both = d.emb_bytes * np.maximum(d.inv_bw, d.inv_bw.T) + 2.0 * d.latency
        out.append((int(xi.emb[0]), both, 0, pp - 1))
    return out


def _fresh_lower(d, upper=None) -> np.ndarray:
    dp = d.plan.replicas
    x = np.zeros(d.xi.size)
    for i, cost, a, b in _fresh_costs(d):
        rows, cols = np.flatnonzero(d.allowed[a]), np.flatnonzero(d.allowed[b])
        c = cost[np.ix_(rows, cols)].copy()
        c[(rows[:, None] == cols[None, :]) & (d.capacity[rows] < 2)[:, None]] = np.inf
        if upper is not None:
            c[c > upper[i]] = np.inf
        for mins, places in ((c.min(axis=1), rows), (c.min(axis=0), cols)):
            ranked = np.sort(np.repeat(mins, d.capacity[places]))
            value = float(ranked[min(dp, len(ranked)) - 1])
            x[i] = max(x[i], value if np.isfinite(value) else 0.0)
        if a == b and len(rows) <= RING_BOUND_PLACES:
            x[i] = max(x[i], ring_bound(c, d.capacity[rows], dp))
    if dp > 1:
        x[d.xi.cross] = 0.0 if d.multi else 1.0
    return x


@pytest.fixture(scope="module", params=[(name, masked) for name in INSTANCES
                                        for masked in (False, True)])  # fmt: skip
def data(request):
    name, masked = request.param
    instance = load_instance(name)
    built = build_placement_data(instance, skeleton(instance))
    if not masked:
        return built
    # stages held to different places (as memory or GPU types do): bounds keyed by mask
    allowed = np.random.default_rng(1).random(built.allowed.shape) < 0.6
    allowed[:, 0] = True
    return replace(built, allowed=allowed)


@pytest.mark.slow
def test_the_cost_matrices_are_the_fresh_ones_and_read_only(data) -> None:
    fresh = _fresh_costs(data)
    kept = class_costs(data)
    assert [(i, a, b) for i, _, a, b in fresh] == [(i, a, b) for i, _, a, b, _ in kept]
    for (_, want, *_), (_, got, *_) in zip(fresh, kept, strict=True):
        np.testing.assert_array_equal(got, want)
        assert not got.flags.writeable
    assert class_costs(data)[0][1] is kept[0][1]  # computed once


def test_lower_bounds_are_the_fresh_ones_with_and_without_caps(data) -> None:
    np.testing.assert_array_equal(lower_x(data), _fresh_lower(data))
    rng = np.random.default_rng(0)
    worst, low = worst_x(data), _fresh_lower(data)
    for _ in range(4):  # caps between the least and the dearest input, and twice the same
        upper = low + rng.uniform(0.0, 1.0, low.shape) * (worst - low)
        for _ in range(2):
            np.testing.assert_array_equal(lower_x(data, upper), _fresh_lower(data, upper))


def test_each_problem_has_its_own_memo() -> None:
    instance = load_instance("llama-2-7b-g3-32")
    plan = skeleton(instance)
    other = plan.model_copy(update={"micro_batch_size": 2 * plan.micro_batch_size})
    first, second = build_placement_data(instance, plan), build_placement_data(instance, other)
    assert first.act_bytes != second.act_bytes
    np.testing.assert_array_equal(
        hop_cost(second), second.latency + second.act_bytes * second.inv_bw
    )
    assert hop_cost(first) is not hop_cost(second)
