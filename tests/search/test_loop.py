"""The outer search: valid layouts, safe pruning, and no lost optimum on a small instance."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipette_cp.checker import check_plan
from pipette_cp.cost.evaluator.evaluate import Evaluator, validate_layout
from pipette_cp.errors import InfeasibleError, LayoutError
from pipette_cp.search import enumerate_layouts, search
from pipette_cp.search.bounds import memory_check, time_lower_bound
from pipette_cp.search.options import SearchOptions
from pipette_cp.solvers import SolveOptions, get_method
from pipette_cp.specs import SearchSpace
from tests.conftest import small_instance

SPACE = SearchSpace(
    tp=(1, 2), micro_batch_size=(1, 2), vpp=(1,), sequence_parallel=(False,),
    recompute=("none",), distributed_optimizer=(False,), flash_attention=(True,),
)  # fmt: skip


def _instance():
    nodes = np.full((3, 3), 20e9)
    nodes[0, 1] = nodes[1, 0] = 5e9  # one slow node pair: placement matters
    return small_instance(
        nodes=3, gpus_per_node=2, layers=6, node_bandwidth=nodes, global_batch_size=12
    )


def test_every_enumerated_layout_is_valid() -> None:
    instance = _instance()
    layouts = list(enumerate_layouts(instance))
    assert layouts
    for plan in layouts:
        validate_layout(instance, plan)  # raises on an invalid one
    degrees = {(p.dp, p.pp, p.tp) for p in layouts}
    assert (3, 2, 1) in degrees and (1, 3, 2) in degrees and (6, 1, 1) in degrees


@pytest.mark.slow
def test_bounds_never_exceed_the_solved_optimum() -> None:
    instance = _instance()
    evaluator = Evaluator(instance)
    solve = get_method("cpsat")
    for plan in enumerate_layouts(instance, SPACE):
        if not memory_check(instance, plan).feasible:
            continue
        best = solve(instance, plan, SolveOptions(time_limit_s=5))
        assert time_lower_bound(instance, plan) <= evaluator.evaluate(best).iteration_time_s * (
            1 + 1e-9
        )


@pytest.mark.slow
def test_search_finds_the_exhaustive_optimum() -> None:
    """Every layout solved to optimality by cpsat, best by the analytic model, equals the
    search's best (the search must not lose the best plan)."""
    instance = _instance()
    evaluator = Evaluator(instance)
    solve = get_method("cpsat")
    exhaustive = math.inf
    for plan in enumerate_layouts(instance, SPACE):
        try:
            solved = solve(instance, plan, SolveOptions(time_limit_s=5))
        except (InfeasibleError, LayoutError):
            continue
        evaluation = evaluator.evaluate(solved)
        if evaluation.fits:
            exhaustive = min(exhaustive, evaluation.iteration_time_s)
    result = search(instance, SearchOptions(method="cpsat", space=SPACE, time_limit_s=120, top_k=3))
    best = min(evaluator.evaluate(p).iteration_time_s for p in result.plans)
    assert best == pytest.approx(exhaustive, rel=1e-9)
    for plan in result.plans:
        assert plan.evaluation is not None and plan.evaluation.fits
        assert check_plan(instance, plan) == []


def test_nothing_fits_names_the_deficit() -> None:
    instance = small_instance(gpu="v100-16gb", global_batch_size=8)
    big = instance.model.model_copy(
        update={"hidden_size": 8192, "num_attention_heads": 64, "ffn_hidden_size": 32768}
    )
    instance = instance.model_copy(update={"model": big})
    with pytest.raises(InfeasibleError, match=r"needs at least [\d.]+ GB per GPU"):
        search(
            instance,
            SearchOptions(method="megatron-default", space=SPACE.model_copy(update={"tp": (1,)})),
        )


def test_every_plan_reports_its_gap_to_the_searchs_lower_bound() -> None:
    """Once every layout is bounded, each returned plan's solver report carries its gap to
    the least bound of any layout: (time - bound) / time, never negative."""
    inst = small_instance(nodes=2, gpus_per_node=4)
    result = search(inst, SearchOptions(time_limit_s=30, top_k=3, deterministic=True))
    low = result.stats.lower_bound
    assert low is not None and result.plans
    for plan in result.plans:
        time_s = plan.evaluation.iteration_time_s
        assert plan.solve_info.search_gap == pytest.approx(max(time_s - low, 0.0) / time_s)
    assert result.plans[0].solve_info.search_gap <= result.plans[-1].solve_info.search_gap
