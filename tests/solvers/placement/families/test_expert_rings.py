"""Expert data-parallel rings: each ring class's gradient sync and whether it leaves a
node."""

from __future__ import annotations

import pytest

from pipette_cp.solvers.placement.families.expert_rings import ExpertRings
from tests.solvers.placement.families.harness import verify, verify_group_family
from tests.solvers.placement.test_group_masters import setup, uneven


@pytest.mark.parametrize(("layout", "gpus"), [((4, 1, 1, 1, 2, None), 2),
                                              ((4, 1, 2, 1, 2, 1), 4),
                                              ((2, 2, 2, 1, 2, 1), 4)])  # fmt: skip
def test_the_master_reads_the_evaluators_expert_rings(layout, gpus) -> None:
    verifier, tables, plan = verify_group_family(layout, gpus, ExpertRings(), "ering")
    assert tables.ering_classes
    assert verifier.data.xi.size == 2 * plan.pp * tables.ering_classes  # time + indicator
    for pinned in verifier.assignments(6):
        pinned.costs()


def test_a_ring_class_inside_a_node_pays_no_inter_node_latency() -> None:
    """ep = 2 over 4 replicas: the expert rings visit replicas {0, 2} and {1, 3}."""
    instance, plan = setup((4, 1, 1, 1, 2, None), 2, uneven(4, 2))
    verifier = verify(instance, plan, ExpertRings())
    ecross = verifier.data.xi.ecross
    inside = verifier.given([0, 1, 0, 1])
    assert inside.reads()[ecross].tolist() == [0.0, 0.0]
    inside.costs()
    across = verifier.given([0, 0, 1, 1])
    assert across.reads()[ecross].tolist() == [1.0, 1.0]
    across.costs()
