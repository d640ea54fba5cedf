"""The search never returns nothing when a heuristic plan exists, and reports how
each plan was found (statuses), whatever the method does within its budget."""

from __future__ import annotations

import pytest

from pipette_cp.checker.checks import check_plan
from pipette_cp.errors import SolverTimeoutError
from pipette_cp.search.loop import search
from pipette_cp.search.options import SearchOptions
from pipette_cp.solvers import METHODS, SolveOptions
from pipette_cp.specs import Instance, Plan
from tests.conftest import small_instance


@pytest.fixture
def always_times_out():
    def method(instance: Instance, skeleton: Plan, options: SolveOptions) -> Plan:
        raise SolverTimeoutError("no placement found within the time limit")

    METHODS["test-timeout"] = method
    yield "test-timeout"
    del METHODS["test-timeout"]


@pytest.mark.slow
def test_a_method_that_finds_nothing_still_yields_fitting_heuristic_plans(always_times_out):
    inst = small_instance()
    result = search(inst, SearchOptions(method=always_times_out, top_k=3, time_limit_s=5))
    assert result.plans and result.stats.method_failures > 0
    for plan in result.plans:
        assert plan.solve_info is not None and plan.solve_info.status == "heuristic"
        assert "fallback" in plan.solve_info.method
        assert plan.evaluation is not None and plan.evaluation.fits
        assert not check_plan(inst, plan)
    assert any("fallback" in note or "Megatron" in note for note in result.stats.notes)


@pytest.mark.slow
def test_exact_method_plans_report_status_and_consistent_gap() -> None:
    inst = small_instance()
    result = search(inst, SearchOptions(method="cpsat", top_k=3, time_limit_s=10))
    for plan in result.plans:
        info = plan.solve_info
        assert info is not None and info.status in {"optimal", "feasible", "heuristic"}
        if info.gap is not None:
            assert info.bound is not None and info.objective is not None
            assert info.bound <= info.objective * (1 + 1e-9)
            assert info.status != "optimal" or info.gap <= 1e-3
