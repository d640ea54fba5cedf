"""``tp_within_node``: a unit's tp ranks share a node, or an NVLink domain when tp
exceeds a node (every place is such a tensor group; the family checks it)."""

from __future__ import annotations

from pipette_cp.checker import CHECKS
from pipette_cp.solvers.placement.families.hard.tensor_group import TensorGroupWithinNode
from tests.solvers.placement.families.harness import verify
from tests.solvers.placement.test_nvlink_domains import layout, on, racks

#: two racks of two 4-GPU trays: tp = 8 spans the two trays of one rack
INSTANCE = on(racks())
PLAN = layout(INSTANCE, dp=2, pp=1, tp=8)


def test_units_wider_than_a_node_stay_in_one_nvlink_domain() -> None:
    verifier = verify(INSTANCE, PLAN, TensorGroupWithinNode())
    pinned = verifier.given([1, 0])
    pinned.is_feasible()
    assert pinned.costs(0.0) == 0.0
    data, cluster = verifier.data, INSTANCE.cluster
    for slots in data.place_slots:
        gpus = data.slot_gpus[slots].ravel()
        assert len({cluster.domain_of(int(g)) for g in gpus}) == 1
        assert len({int(g) // cluster.gpus_per_node for g in gpus}) == 2


def test_the_checker_refuses_a_unit_across_domains() -> None:
    spread = PLAN.model_copy(update={"placement": ((0, 1, 2, 3, 8, 9, 10, 11), tuple(range(4, 8)) + tuple(range(12, 16)))})  # fmt: skip
    assert CHECKS[TensorGroupWithinNode.check](INSTANCE, spread)
    assert not CHECKS[TensorGroupWithinNode.check](INSTANCE, PLAN)
