"""Greedy placement: registry, structure, seeds, failed links, model objective."""

from __future__ import annotations

import numpy as np
import pytest

from pipette_cp.checker.checks import CHECKS
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.errors import LayoutError
from pipette_cp.solvers import METHODS, SolveOptions
from pipette_cp.solvers.baselines.greedy import node_costs, walk
from pipette_cp.solvers.placement.build import build_placement_data
from pipette_cp.specs.layouts import make_plan
from tests.conftest import small_instance

FAMILIES = ("split_covers_layers", "split_contiguous", "placement_bijection", "tp_within_node",
            "no_failed_link")  # fmt: skip


def test_registered() -> None:
    assert "greedy" in METHODS


def test_walk_follows_the_fast_links() -> None:
    # a slow 0-1 pair: the walk from 0 goes to 2 first
    m = np.full((3, 3), 20e9)
    m[0, 1] = m[1, 0] = 5e9
    instance = small_instance(nodes=3, gpus_per_node=4, node_bandwidth=m)
    plan = make_plan(num_layers=8, dp=1, pp=3, tp=4, micro_batch_size=1)
    data = build_placement_data(instance, plan)
    assert walk(node_costs(data), 0, np.random.default_rng(0)) == [0, 2, 1]


@pytest.mark.parametrize("dp, pp, tp", [(2, 2, 4), (4, 2, 2), (2, 4, 1), (8, 1, 1)])
def test_valid_seeded_and_scored_by_the_model(dp, pp, tp) -> None:
    rng = np.random.default_rng(4)
    m = 20e9 * rng.lognormal(0, 0.1, (4, 4))
    m[0, 3] = m[3, 0] = 0.0  # one failed node pair
    np.fill_diagonal(m, 0)
    instance = small_instance(nodes=4, gpus_per_node=4, node_bandwidth=m)
    instance = instance.model_copy(
        update={"search_space": instance.search_space.model_copy(update={"use_all_gpus": False})}
    )
    plan = make_plan(num_layers=8, dp=dp, pp=pp, tp=tp, micro_batch_size=1)
    a = METHODS["greedy"](instance, plan, SolveOptions(seed=3))
    b = METHODS["greedy"](instance, plan, SolveOptions(seed=3))
    assert a.placement == b.placement
    assert [v for f in FAMILIES for v in CHECKS[f](instance, a)] == []
    assert a.solve_info is not None and a.solve_info.status == "heuristic"
    ring = Evaluator(instance, dp_algorithm="ring").iteration_time(a)
    best = Evaluator(instance).iteration_time(a)  # a node permutation of Megatron's order won
    assert a.solve_info.objective in (pytest.approx(ring, rel=1e-12), pytest.approx(best))


@pytest.mark.parametrize("dp, pp, tp", [(4, 2, 2), (8, 2, 1), (16, 1, 1)])
def test_never_worse_than_megatrons_order_when_that_runs(dp, pp, tp) -> None:
    """The walk models ring all-reduce only; the whole-node permutations of Megatron's
    order it is compared with keep the two-level all-reduce's advantage."""
    instance = small_instance(nodes=4, gpus_per_node=4)
    plan = make_plan(num_layers=8, dp=dp, pp=pp, tp=tp, micro_batch_size=1)
    ev = Evaluator(instance)
    assert ev.iteration_time(METHODS["greedy"](instance, plan, SolveOptions())) <= (
        ev.iteration_time(plan) * (1 + 1e-12)
    )


def test_refuses_tp_across_nodes() -> None:
    instance = small_instance(nodes=2, gpus_per_node=4)
    plan = make_plan(num_layers=8, dp=1, pp=1, tp=8, micro_batch_size=1)
    with pytest.raises(LayoutError):
        METHODS["greedy"](instance, plan, SolveOptions())
