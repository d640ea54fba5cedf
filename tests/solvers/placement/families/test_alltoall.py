"""Expert all-to-alls: each stage's slowest all-to-all (NIC sends, NVLink sends in turn,
the NIC shares of the nodes its groups span)."""

from __future__ import annotations

import pytest

from pipette_cp.solvers.placement.families.alltoall import ExpertAllToAll
from tests.solvers.placement.families.harness import verify, verify_group_family
from tests.solvers.placement.test_group_masters import setup


@pytest.mark.parametrize(("layout", "gpus"), [((4, 1, 1, 1, 4, None), 2),
                                              ((2, 1, 2, 1, 4, 1), 4),
                                              ((2, 2, 1, 1, 2, None), 2)])  # fmt: skip
def test_the_master_reads_the_evaluators_alltoall(layout, gpus) -> None:
    verifier, _, plan = verify_group_family(layout, gpus, ExpertAllToAll(), "a2a")
    assert verifier.data.xi.size == plan.pp
    for pinned in verifier.assignments(5):
        pinned.costs()


def test_a_dense_layout_has_no_input() -> None:
    instance, plan = setup((4, 1, 1, 1, 1, None), 2)
    assert verify(instance, plan, ExpertAllToAll()).data.xi.size == 0
