"""Plans when the chosen method gives none in time: Megatron's defaults, then greedy.

Every plan returned passes the checker and the user's constraint families and is
marked ``heuristic``.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import replace

from pipette_cp.checker import check_plan
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.errors import PipetteError
from pipette_cp.search.rerank import RERANKED
from pipette_cp.search.sweep import Candidate
from pipette_cp.solvers import SolveOptions, get_method
from pipette_cp.solvers import work_meter as work
from pipette_cp.solvers.extensions import family_violations
from pipette_cp.solvers.placement.repair import repair_placement
from pipette_cp.specs import Instance, Plan, SolveInfo

#: Skeletons the greedy fallback tries when no solve succeeded and no default fits.
FALLBACK_TRIES = 8


def fallback(
    evaluator: Evaluator,
    candidates: list[Candidate],
    options: SolveOptions,
    method: str,
    top_k: int,
    until: float = math.inf,
) -> list[Plan]:
    """A plan whenever a heuristic finds one: the best scored skeletons (even split,
    Megatron's placement, repaired off failed pairs where it crosses one:
    :func:`~pipette_cp.solvers.placement.repair.repair_placement`) that fit, pass the
    checker and the user families; if none
    does, the greedy method on the most promising skeletons (each at most 1 s, within
    ``until`` but at least one try; with ``options.deterministic`` each within a
    reference second of work, whatever the clock).  Marked ``heuristic``."""
    instance = evaluator.instance
    found: list[Plan] = []
    for cand in candidates:
        # as many as the re-ranking sees, so that --top never changes the best plan
        if len(found) >= max(top_k, RERANKED) or not math.isfinite(cand.score_s):
            break
        if usable(instance, cand.plan, options):
            found.append(
                as_fallback(evaluator, cand.plan, f"{method} (fallback: megatron-default)")
            )
            continue
        moved = repair_placement(instance, cand.plan, evaluator)  # off the failed pairs
        if moved is not cand.plan and usable(instance, moved, options):
            found.append(as_fallback(evaluator, moved, f"{method} (fallback: repaired order)"))
    greedy = get_method("greedy")
    for k, cand in enumerate(candidates[:FALLBACK_TRIES] if not found else []):
        left = math.inf if options.deterministic else until - time.perf_counter()
        if k and left <= 0:
            break
        # deterministic: each try metered, within the reference second it is given
        with contextlib.suppress(PipetteError), work.deterministic(options.deterministic, 1.0):
            limit = min(1.0, max(left, 0.2))
            plan = greedy(instance, cand.plan, replace(options, time_limit_s=limit))
            if usable(instance, plan, options):
                found.append(as_fallback(evaluator, plan, f"{method} (fallback: greedy)"))
                break
    return found


def usable(instance: Instance, plan: Plan, options: SolveOptions) -> bool:
    return not check_plan(instance, plan) and not family_violations(
        options.constraints, instance, plan
    )


def as_fallback(evaluator: Evaluator, plan: Plan, how: str) -> Plan:
    info = SolveInfo(method=how, status="heuristic")
    return plan.model_copy(update={"evaluation": evaluator.evaluate(plan), "solve_info": info})
