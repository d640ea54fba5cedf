"""The last step of the search: the simulator re-ranks the best layouts of the analytic
model (:func:`rerank`), each by the fastest of a few variants of its plans."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from pipette_cp.checker import check_plan
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.errors import PipetteError
from pipette_cp.specs import Plan, SolveInfo
from pipette_cp.specs.layouts import even_split

#: Layouts the simulator re-ranks (at least): the analytic order of close layouts
#: may differ from the simulator's, which has the last word.
RERANKED = 8


def _heuristic(plan: Plan) -> bool:
    """Tie-break: a solver's plan (with its status and gap) before a tied heuristic one."""
    return plan.solve_info is None or plan.solve_info.status == "heuristic"


def plan_time(plan: Plan) -> float:
    assert plan.evaluation is not None  # every plan of the search carries one
    return plan.evaluation.iteration_time_s


def rerank(
    evaluator: Evaluator,
    plans: list[Plan],
    top_k: int,
    notify: Callable[[str, int, int], None],
    until: float = math.inf,
    weight: Callable[[Plan], float] = lambda plan: 1.0,
) -> list[Plan]:
    """The ``top_k`` best by the simulator among the best ``max(top_k, RERANKED)``
    layouts by the analytic model, each represented by the plan the simulator finds
    fastest among its best analytic plan, its best plan with an even split, and the
    even split on the best plan's placement.

    The solvers minimise the analytic critical path, which flatters unequal chunks
    under interleaving (docs/design.md; 8.9 % in the agreement benchmark); the simulator,
    which plays the schedule, has the last word.  ``weight``: the objective's cost of
    one second of a plan (1: time; GPUs: GPU-seconds)."""

    def cost(plan: Plan) -> float:
        return plan_time(plan) * weight(plan)

    by_layout: dict[str, list[Plan]] = {}
    for plan in sorted(plans, key=lambda p: (cost(p), _heuristic(p))):
        by_layout.setdefault(plan.layout(), []).append(plan)
    layouts = list(by_layout.values())[: max(top_k, RERANKED)]
    ranked = []
    for i, group in enumerate(layouts):
        notify("rerank", i + 1, len(layouts))
        # past ``until`` (the search's budget) the rest keep their analytic best
        late = i > 0 and time.perf_counter() >= until
        ranked.append(group[0] if late else _simulated_best(evaluator, group))
    return sorted(ranked, key=cost)[: max(top_k, 1)]


def _simulated_best(evaluator: Evaluator, group: list[Plan]) -> Plan:
    first = group[0]
    even = even_split(evaluator.instance.model.num_layers, first.pp, first.vpp)
    variants = [first]
    variants += [p for p in group[1:] if p.layer_split == even][:1]
    if first.layer_split != even:  # the solver's bound does not cover this variant
        how = first.solve_info.method if first.solve_info else "search"
        info = SolveInfo(method=f"{how} + even split", status="heuristic")
        variants.append(first.model_copy(update={"layer_split": even, "solve_info": info}))
    best: Plan | None = None
    for plan in variants:
        try:
            evaluation = evaluator.evaluate(plan, "simulator")
        except PipetteError:
            continue
        if not evaluation.fits or check_plan(evaluator.instance, plan):
            continue
        if best is None or evaluation.iteration_time_s < plan_time(best):
            best = plan.model_copy(update={"evaluation": evaluation})
    return best if best is not None else first
