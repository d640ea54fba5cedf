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

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from pipette_cp.checker import check_plan
from pipette_cp.cost.evaluate import Evaluator
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


def sweep(
    instance: Instance,
    evaluator: Evaluator,
    candidates: list[Candidate],
    options: SolveOptions,
    until: float,
    weight: Callable[[Plan], float] = lambda plan: 1.0,
) -> tuple[list[Plan], list[Candidate]]:
    """Greedy plans for skeletons in order until ``until`` (perf_counter time), and
    the candidates re-ordered: swept ones scored by their greedy plan's time (x
    ``weight``, the objective), with its placement; the others as they were."""
    greedy = get_method("greedy")
    pool: list[Plan] = []
    out: list[Candidate] = []
    for i, cand in enumerate(candidates):
        if time.perf_counter() > until:
            out.extend(candidates[i:])
            break
        try:
            plan = greedy(instance, cand.plan, replace(options, time_limit_s=1.0))
            evaluation = evaluator.evaluate(plan)
        except PipetteError:
            out.append(cand)
            continue
        if (
            not evaluation.fits
            or check_plan(instance, plan)
            or family_violations(options.constraints, instance, plan)
        ):
            out.append(cand)
            continue
        info = SolveInfo(method="greedy (sweep)", status="heuristic")
        pool.append(plan.model_copy(update={"evaluation": evaluation, "solve_info": info}))
        out.append(Candidate(evaluation.iteration_time_s * weight(plan), cand.bound_s, plan))
    return pool, sorted(out)
