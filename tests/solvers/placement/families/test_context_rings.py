"""Context-parallel rings: each stage's K/V ring step at its slowest link and NIC share."""

from __future__ import annotations

import pytest

from pipette_cp.solvers.placement.families.context_rings import ContextParallelRings
from tests.solvers.placement.families.harness import verify_group_family


@pytest.mark.parametrize(("layout", "gpus"), [((2, 1, 1, 2, 1, None), 2),
                                              ((1, 2, 1, 4, 1, None), 2),
                                              ((2, 1, 2, 2, 1, None), 4)])  # fmt: skip
def test_the_master_reads_the_evaluators_ring_step(layout, gpus) -> None:
    verifier, _, plan = verify_group_family(layout, gpus, ContextParallelRings(), "cp")
    assert verifier.data.xi.size == plan.pp
    for pinned in verifier.assignments(5):
        pinned.costs()
