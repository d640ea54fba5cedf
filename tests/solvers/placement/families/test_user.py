"""A user's constraint family as a hard family of the master: its rows through the
user's API, its violations as its check (the hard-only case of the protocol)."""

from __future__ import annotations

import numpy as np

from pipette_cp.solvers.extensions import ConstraintFamily, PlacementContext
from pipette_cp.solvers.placement.families.hard.user import UserFamily
from pipette_cp.solvers.placement.families.hops import PipelineHops
from pipette_cp.specs import Instance, Plan
from pipette_cp.specs.layouts import make_plan
from tests.conftest import small_instance
from tests.solvers.placement.families.harness import verify

INSTANCE = small_instance(nodes=3, gpus_per_node=1)
PLAN = make_plan(num_layers=8, dp=1, pp=2, tp=1, micro_batch_size=1)


class LastStageOffNode0(ConstraintFamily):
    name = "last_stage_off_node0"

    def placement(self, ctx: PlacementContext) -> None:
        for u in ctx.units_of_stage(ctx.plan.pp - 1):
            for p in ctx.places_on_node(0):
                ctx.forbid(u, p)

    def violations(self, instance: Instance, plan: Plan) -> list[str]:
        g = instance.cluster.gpus_per_node
        last = plan.placement[(plan.pp - 1) * plan.replicas :]
        return [f"GPU {x} on node 0" for unit in last for x in unit if x // g == 0]


def test_its_rows_bind_and_its_violations_price_the_assignment() -> None:
    family = UserFamily(LastStageOffNode0())
    verifier = verify(INSTANCE, PLAN, PipelineHops(), family)
    assert family.name == "last_stage_off_node0" and not family.symmetric
    verifier.given([1, 0]).is_infeasible()
    assert verifier.data.value(np.array([1, 0])) == float("inf")
    verifier.given([0, 1]).costs()
    assert np.isfinite(verifier.data.value(np.array([0, 1])))
