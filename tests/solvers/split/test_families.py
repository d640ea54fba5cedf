"""The split master's families, one at a time: pin a split, and the master with only
that family (on CP-SAT and the MILP) accepts it exactly when the family admits it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pipette_cp.checker import CHECKS
from pipette_cp.solvers.extensions import ConstraintFamily, SplitContext
from pipette_cp.solvers.split.cost import SplitCost, split_cost
from pipette_cp.solvers.split.cpsat import CpSatSplitBackend
from pipette_cp.solvers.split.families import (
    BUILTIN,
    ChunkBalance,
    SplitContiguous,
    SplitCoversLayers,
    SplitFamily,
    SplitMemoryLimit,
    UserSplitFamily,
)
from pipette_cp.solvers.split.milp import MilpSplitBackend
from pipette_cp.solvers.split.model import SplitModel
from pipette_cp.specs import Instance, Plan
from tests.conftest import small_instance
from tests.solvers.split.test_split import _memory_bound_instance, plan_for


def accepts(cost: SplitCost, families: tuple[SplitFamily, ...], split) -> bool:
    """Whether the master of ``families`` has a solution with the layer counts ``split``,
    on both backends (which must agree)."""
    answers = set()
    for backend in (CpSatSplitBackend(1.0, cost.num_layers), MilpSplitBackend()):
        model = SplitModel(cost, backend, families)
        for k, (n, x) in enumerate(zip(model.n, split, strict=True)):
            model.add_row([(1, n)], "==", int(x), f"pin_{k}")
        answers.add(model.solve(30.0).status)
    assert len(answers) == 1, answers
    return answers.pop() != "infeasible"


def check(cost: SplitCost, family: SplitFamily, split, ok: bool) -> None:
    assert accepts(cost, (family,), split) == ok
    assert family.admits(cost, np.asarray(split)) == ok


def test_covers_layers() -> None:
    instance = small_instance(nodes=1, gpus_per_node=4, layers=12)
    cost = split_cost(instance, plan_for(instance, pp=4))
    check(cost, SplitCoversLayers(), (3, 3, 3, 3), True)
    check(cost, SplitCoversLayers(), (3, 3, 3, 4), False)
    assert accepts(cost, (SplitContiguous(),), (3, 3, 3, 4))  # no row of its own


def test_memory_limit() -> None:
    instance, plan, _ = _memory_bound_instance()
    cost = split_cost(instance, plan)
    check(cost, SplitMemoryLimit(), (2, 4, 4, 2), True)
    check(cost, SplitMemoryLimit(), (3, 3, 3, 3), False)


def test_chunk_balance() -> None:
    instance = small_instance(nodes=1, gpus_per_node=2, layers=8)
    cost = replace(split_cost(instance, plan_for(instance, pp=2, vpp=2)), chunk_spread=1)
    check(cost, ChunkBalance(), (2, 2, 2, 2), True)
    check(cost, ChunkBalance(), (1, 2, 3, 2), False)  # stage 0: chunks of 1 and 3


def test_a_user_family_is_the_same_kind() -> None:
    class LastStageCap(ConstraintFamily):
        name = "last_stage_cap"

        def split(self, ctx: SplitContext) -> None:
            ctx.add_linear([(1, ctx.layers[-1])], "<=", 2, "cap")

        def violations(self, instance: Instance, plan: Plan) -> list[str]:
            return ["too many"] if plan.layer_split[-1] > 2 else []

    instance = small_instance(nodes=1, gpus_per_node=4, layers=12)
    plan = plan_for(instance, pp=4)
    cost = split_cost(instance, plan)
    family = UserSplitFamily(LastStageCap(), instance, plan)
    check(cost, family, (4, 3, 3, 2), True)
    check(cost, family, (3, 3, 3, 3), False)


@pytest.mark.parametrize("family", BUILTIN, ids=lambda f: f.name)
def test_hard_families_name_the_checkers_functions(family: SplitFamily) -> None:
    assert family.check is None or family.check in CHECKS
