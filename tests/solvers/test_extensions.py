"""User constraint families (pipette_cp.solvers.extensions) bind in CP-SAT and MILP."""

from __future__ import annotations

import numpy as np
import pytest

from pipette_cp.api import solve
from pipette_cp.checker.checks import check_plan
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.errors import InfeasibleError
from pipette_cp.solvers import get_method
from pipette_cp.solvers.extensions import (
    ConstraintFamily,
    PlacementContext,
    SplitContext,
    family_violations,
)
from pipette_cp.solvers.options import SolveOptions
from pipette_cp.solvers.split import solve_split
from pipette_cp.specs import Instance, Plan
from pipette_cp.specs.layouts import make_plan
from tests.conftest import small_instance


class StageOffNodes(ConstraintFamily):
    """Keep one pipeline stage off some nodes (e.g. the ones with a degraded NIC)."""

    name = "stage_off_nodes"

    def __init__(self, stage: int, nodes: set[int]) -> None:
        self.stage, self.nodes = stage, nodes

    def placement(self, ctx: PlacementContext) -> None:
        for u in ctx.units_of_stage(self.stage):
            for n in self.nodes:
                for p in ctx.places_on_node(n):
                    ctx.forbid(u, p)

    def violations(self, instance: Instance, plan: Plan) -> list[str]:
        g = instance.cluster.gpus_per_node
        units = plan.placement[self.stage * plan.dp : (self.stage + 1) * plan.dp]
        return [f"GPU {gpu} of stage {self.stage}" for unit in units for gpu in unit
                if gpu // g in self.nodes]  # fmt: skip


class LastStageCap(ConstraintFamily):
    """The last pipeline stage holds at most ``cap`` layers (memory headroom for logits)."""

    name = "last_stage_cap"

    def __init__(self, cap: int) -> None:
        self.cap = cap

    def split(self, ctx: SplitContext) -> None:
        pp = ctx.plan.pp
        last = [ctx.layers[c * pp + pp - 1] for c in range(ctx.plan.vpp)]
        ctx.add_linear([(1, x) for x in last], "<=", self.cap, "last_stage_cap")

    def violations(self, instance: Instance, plan: Plan) -> list[str]:
        pp = plan.pp
        total = sum(plan.layer_split[c * pp + pp - 1] for c in range(plan.vpp))
        return [f"last stage holds {total} > {self.cap} layers"] if total > self.cap else []


def _skewed() -> Instance:
    """Node 0 has by far the fastest links, so an unconstrained plan uses it."""
    m = np.full((4, 4), 5e9)
    m[0, :] = m[:, 0] = 40e9
    np.fill_diagonal(m, 0.0)
    return small_instance(nodes=4, node_bandwidth=m)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["cpsat", "milp"])
def test_placement_family_binds_in_both_solvers(method: str) -> None:
    inst = _skewed()
    skeleton = make_plan(num_layers=8, dp=2, pp=4, tp=2, micro_batch_size=1)
    free = get_method(method)(inst, skeleton, SolveOptions(time_limit_s=20))
    family = StageOffNodes(stage=0, nodes={0})
    assert family.violations(inst, free), "the family must bind: the free plan uses node 0"
    options = SolveOptions(time_limit_s=20, constraints=(family,))
    bound = get_method(method)(inst, skeleton, options)
    assert not family.violations(inst, bound)
    assert not check_plan(inst, bound)
    ev = Evaluator(inst)
    assert ev.iteration_time(bound) >= ev.iteration_time(free) * (1 - 1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["cpsat", "milp"])
def test_split_family_binds_in_both_masters(backend: str) -> None:
    inst = small_instance(nodes=2, layers=16)
    plan = make_plan(num_layers=16, dp=1, pp=4, tp=2, micro_batch_size=1)
    free = solve_split(inst, plan, SolveOptions(time_limit_s=20), backend)
    last = free.split[-1]
    assert last >= 3, f"the unconstrained split {free.split} leaves no room to bind"
    family = LastStageCap(cap=last - 2)
    result = solve_split(inst, plan, SolveOptions(time_limit_s=20, constraints=(family,)), backend)
    assert result.split[-1] <= last - 2 and sum(result.split) == 16
    assert result.objective_s >= free.objective_s * (1 - 1e-9)
    assert result.status == "optimal" and result.bound_s is not None
    assert result.bound_s <= result.objective_s * (1 + 1e-9)


def test_impossible_split_family_is_infeasible_not_a_crash() -> None:
    inst = small_instance(nodes=2, layers=16)
    plan = make_plan(num_layers=16, dp=1, pp=4, tp=2, micro_batch_size=1)
    family = LastStageCap(cap=0)  # every stage needs at least one layer
    with pytest.raises(InfeasibleError, match="user"):
        solve_split(inst, plan, SolveOptions(time_limit_s=10, constraints=(family,)), "cpsat")


@pytest.mark.slow
def test_search_returns_only_plans_that_satisfy_the_families() -> None:
    inst = _skewed()
    family = StageOffNodes(stage=0, nodes={0})
    # a work budget: 17 of the 1,236 layouts solved by CP-SAT with the family, on any machine
    plans = solve(inst, method="cpsat", top_k=3, time_limit_s=5, constraints=[family],
                  deterministic=True)  # fmt: skip
    assert plans and all(p.solve_info.method == "cpsat" for p in plans)
    for plan in plans:
        assert not family_violations([family], inst, plan)
        assert not check_plan(inst, plan)
