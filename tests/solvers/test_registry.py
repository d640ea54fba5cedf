"""Every method of the registry gives plans the checker accepts and the evaluator fits.

Parametrised over :data:`pipette_cp.solvers.METHODS` itself, so a method registered
tomorrow is run here without editing this file.  A method on its own may refuse a layout
it cannot express (a LayoutError naming the field) and may keep a placement-unaware order
(Megatron's, the skeleton's) that crosses a failed pair: the search is what promises that
every returned plan passes the checker, so on the cluster with a failed pair the methods
run through the search.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from pipette_cp.api import solve
from pipette_cp.checker import check_plan
from pipette_cp.cost.evaluator.evaluate import evaluate
from pipette_cp.errors import LayoutError
from pipette_cp.solvers import METHODS, SolveOptions
from pipette_cp.specs import Instance, Plan, SearchSpace
from pipette_cp.specs.layouts import make_plan
from tests.conftest import small_instance


def _healthy() -> tuple[Instance, Plan]:
    """Two nodes of four GPUs, every link nominal; dp2-pp2-tp2."""
    instance = small_instance(nodes=2, gpus_per_node=4, layers=8)
    return instance, make_plan(num_layers=8, dp=2, pp=2, tp=2, micro_batch_size=1)


def _failed_pair() -> tuple[Instance, Plan]:
    """Four nodes of two GPUs, nodes 0 and 1 cannot talk, one slow pair; dp2-pp2-tp2
    interleaved (every method must keep its flows off the failed pair)."""
    bw = np.full((4, 4), 20e9)
    bw[0, 1] = bw[1, 0] = 0.0
    bw[2, 3] = bw[3, 2] = 4e9
    instance = small_instance(nodes=4, gpus_per_node=2, layers=8, node_bandwidth=bw)
    return instance, make_plan(num_layers=8, dp=2, pp=2, tp=2, micro_batch_size=1, vpp=2)


def _uneven_stages() -> tuple[Instance, Plan]:
    """Ten layers over four stages (no even split), dp1-pp4-tp2 with recomputation."""
    instance = small_instance(nodes=2, gpus_per_node=4, layers=10)
    plan = make_plan(num_layers=10, dp=1, pp=4, tp=2, micro_batch_size=2, recompute="full")
    return instance, plan


CASES: dict[str, Callable[[], tuple[Instance, Plan]]] = {
    "healthy": _healthy,
    "uneven-stages": _uneven_stages,
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_registered_method_passes_the_checker(name: str, case: str) -> None:
    instance, skeleton = CASES[case]()
    try:
        plan = METHODS[name](instance, skeleton, SolveOptions(time_limit_s=1.0, seed=0))
    except LayoutError as refusal:  # a layout the method cannot express, said by field
        assert str(refusal).startswith("plan."), refusal
        return
    assert check_plan(instance, plan) == []
    assert (plan.dp, plan.pp, plan.tp, plan.vpp) == (
        skeleton.dp, skeleton.pp, skeleton.tp, skeleton.vpp,
    )  # fmt: skip
    assert plan.solve_info is not None and plan.solve_info.method == name
    assert evaluate(instance, plan).fits


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_registered_method_searches_around_a_failed_pair(name: str) -> None:
    instance = _failed_pair()[0]
    space = SearchSpace(tp=(2,), pp=(2,), micro_batch_size=(1,), vpp=(1, 2))
    plans = solve(instance, method=name, top_k=3, time_limit_s=4.0, space=space)
    assert plans
    for plan in plans:
        assert check_plan(instance, plan) == [], plan.layout()
        assert plan.evaluation is not None and plan.evaluation.fits
