"""Context-parallel rings: each stage's K/V ring step at its slowest link and NIC share."""

from __future__ import annotations

import pytest

from pipette_cp.solvers.placement.families.context_rings import ContextParallelRings
from pipette_cp.solvers.placement.families.group_tables import group_tables
from tests.solvers.placement.families.harness import verify
from tests.solvers.placement.test_group_masters import setup, uneven


@pytest.mark.parametrize(("layout", "gpus"), [((2, 1, 1, 2, 1, None), 2),
                                              ((1, 2, 1, 4, 1, None), 2),
                                              ((2, 1, 2, 2, 1, None), 4)])  # fmt: skip
def test_the_master_reads_the_evaluators_ring_step(layout, gpus) -> None:
    instance, plan = setup(layout, gpus, uneven(4, gpus))
    verifier = verify(instance, plan, ContextParallelRings())
    tables = group_tables(verifier.data)
    assert tables is not None and "cp" in tables.priced
    assert verifier.data.xi.size == plan.pp
    for pinned in verifier.assignments(5):
        pinned.costs()
