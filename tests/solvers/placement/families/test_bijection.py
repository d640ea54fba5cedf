"""``placement_bijection``: one place per unit, no place over its capacity."""

from __future__ import annotations

import pytest

from pipette_cp.checker import CHECKS
from pipette_cp.errors import InfeasibleError
from pipette_cp.solvers.placement.families.hard.bijection import PlacementBijection
from pipette_cp.specs.layouts import make_plan
from tests.conftest import small_instance
from tests.solvers.placement.families.harness import verify

#: three nodes of two GPUs; tp = 2: a node is a place holding one unit
INSTANCE = small_instance(nodes=3, gpus_per_node=2)
PLAN = make_plan(num_layers=8, dp=2, pp=1, tp=2, micro_batch_size=1)


def test_units_on_distinct_places_are_feasible_and_cost_nothing() -> None:
    pinned = verify(INSTANCE, PLAN).given([0, 2])
    pinned.is_feasible()
    assert pinned.costs(0.0) == 0.0  # a hard family: no inputs


def test_two_units_on_a_one_unit_place_are_infeasible() -> None:
    pinned = verify(INSTANCE, PLAN).given([1, 1])
    pinned.is_infeasible()
    with pytest.raises(InfeasibleError, match="more than its 1 units"):
        pinned.reads()


def test_it_names_the_checkers_function() -> None:
    assert PlacementBijection.check in CHECKS
