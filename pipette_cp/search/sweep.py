"""A quick greedy sweep over the scored skeletons before the exact solves.

The exact methods (CP-SAT, MILP) spend a second or more per layout, so within a
budget they reach only the first few skeletons; which ones those are decides
the layout.  The greedy placement takes milliseconds, so a sweep over the
skeletons in score order, within a share of the budget, gives

* real plans (fitting, off failed links, within the user families) for many
  layouts, kept in the pool: the search never returns worse than its own sweep;
* a better order for the exact solves: by the time of the greedy plan rather
  than by Megatron's default placement (which may cross a failed link);
* a warm start: the greedy placement becomes the skeleton's placement, a hint
  the exact placement solvers never do worse than.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from pipette_cp.checker import check_plan
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.errors import PipetteError
from pipette_cp.solvers import SolveOptions, get_method
from pipette_cp.solvers.extensions import family_violations
from pipette_cp.specs import Instance, Plan, SolveInfo

#: Methods whose search starts with a greedy sweep.
SWEPT_METHODS = frozenset({"cpsat", "milp"})


@dataclass(order=True)
class Candidate:
    """A skeleton with its score (estimated time, s) and time lower bound."""

    score_s: float
    bound_s: float = field(compare=False)
    plan: Plan = field(compare=False)


def greedy_plan(
    instance: Instance, evaluator: Evaluator, skeleton: Plan, options: SolveOptions
) -> Plan | None:
    """The sweep's plan of one skeleton: the greedy placement, evaluated, if it fits,
    passes the checker and the user families (else None)."""
    try:
        plan = get_method("greedy")(instance, skeleton, replace(options, time_limit_s=1.0))
        evaluation = evaluator.evaluate(plan)
    except PipetteError:
        return None
    if (
        not evaluation.fits
        or check_plan(instance, plan)
        or family_violations(options.constraints, instance, plan)
    ):
        return None
    info = SolveInfo(method="greedy (sweep)", status="heuristic")
    return plan.model_copy(update={"evaluation": evaluation, "solve_info": info})


def merge_sweep(
    candidates: list[Candidate], plans: list[Plan | None], weight: Callable[[Plan], float]
) -> tuple[list[Plan], list[Candidate]]:
    """The pool of greedy plans (``plans[i]``: the first candidates', None where none)
    and the candidates re-ordered: swept ones scored by their greedy plan's time (x
    ``weight``, the objective), with its placement; the others as they were."""
    pool = [p for p in plans if p is not None]
    out = []
    for cand, plan in zip(candidates, plans, strict=False):
        if plan is None or plan.evaluation is None:
            out.append(cand)
        else:
            score = plan.evaluation.iteration_time_s * weight(plan)
            out.append(Candidate(score, cand.bound_s, plan))
    return pool, sorted(out + candidates[len(plans) :])
