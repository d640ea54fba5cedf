"""Expert all-to-alls: each stage's slowest all-to-all (NIC sends, NVLink sends in turn,
the NIC shares of the nodes its groups span)."""

from __future__ import annotations

import pytest

from pipette_cp.solvers.placement.families.alltoall import ExpertAllToAll
from pipette_cp.solvers.placement.families.group_tables import group_tables
from tests.solvers.placement.families.harness import verify
from tests.solvers.placement.test_group_masters import setup, uneven


@pytest.mark.parametrize(("layout", "gpus"), [((4, 1, 1, 1, 4, None), 2),
                                              ((2, 1, 2, 1, 4, 1), 4),
                                              ((2, 2, 1, 1, 2, None), 2)])  # fmt: skip
def test_the_master_reads_the_evaluators_alltoall(layout, gpus) -> None:
    instance, plan = setup(layout, gpus, uneven(4, gpus))
    verifier = verify(instance, plan, ExpertAllToAll())
    tables = group_tables(verifier.data)
    assert tables is not None and "a2a" in tables.priced
    assert verifier.data.xi.size == plan.pp
    for pinned in verifier.assignments(5):
        pinned.costs()


def test_a_dense_layout_has_no_input() -> None:
    instance, plan = setup((4, 1, 1, 1, 1, None), 2)
    assert verify(instance, plan, ExpertAllToAll()).data.xi.size == 0
