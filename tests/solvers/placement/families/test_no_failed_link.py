"""``no_failed_link``: no flow of any family over a failed pair (hops both ways)."""

from __future__ import annotations

import numpy as np
import pytest

from pipette_cp.checker import CHECKS
from pipette_cp.errors import InfeasibleError
from pipette_cp.solvers.placement.families.hard.no_failed_link import NoFailedLink
from pipette_cp.solvers.placement.families.hops import PipelineHops
from pipette_cp.specs.layouts import make_plan
from tests.conftest import small_instance
from tests.solvers.placement.families.harness import verify

#: three one-GPU nodes; the link between nodes 0 and 1 has failed
MATRIX = np.full((3, 3), 20e9)
MATRIX[0, 1] = MATRIX[1, 0] = 0.0
INSTANCE = small_instance(nodes=3, gpus_per_node=1, node_bandwidth=MATRIX)
PLAN = make_plan(num_layers=8, dp=1, pp=2, tp=1, micro_batch_size=1)


@pytest.mark.parametrize("assign", [[0, 1], [1, 0]])
def test_a_hop_over_the_failed_pair_is_infeasible(assign) -> None:
    pinned = verify(INSTANCE, PLAN, NoFailedLink(), PipelineHops()).given(assign)
    pinned.is_infeasible()
    with pytest.raises(InfeasibleError):
        pinned.reads()
    placed = PLAN.model_copy(update={"placement": tuple((p,) for p in assign)})
    assert CHECKS[NoFailedLink.check](INSTANCE, placed)


@pytest.mark.parametrize("assign", [[0, 2], [2, 1]])
def test_hops_around_it_are_feasible(assign) -> None:
    verify(INSTANCE, PLAN, NoFailedLink(), PipelineHops()).given(assign).costs()
