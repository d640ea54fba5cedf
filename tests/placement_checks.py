"""A check shared by the tests of the placement master's inputs."""

from __future__ import annotations

import numpy as np
import pytest

from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.solvers.placement.build import build_placement_data
from pipette_cp.specs import Instance, Plan


def assert_master_prices_as_evaluator(
    instance: Instance, plan: Plan, evaluator: Evaluator, *, seed: int, draws: int
) -> None:
    """The master's inputs for ``plan`` on ``instance`` give ``evaluator``'s iteration time
    (to 1e-12) for ``draws`` random assignments of units to slots (stream ``seed``)."""
    data = build_placement_data(instance, plan)
    rng = np.random.default_rng(seed)
    slots = np.repeat(np.arange(data.num_places), data.capacity)
    for _ in range(draws):
        assign = rng.permutation(slots)[: data.num_units]
        truth = evaluator.iteration_time(
            plan.model_copy(update={"placement": data.placement(assign)})
        )
        assert data.total_time_s(data.x_of(assign)) == pytest.approx(truth, rel=1e-12)
