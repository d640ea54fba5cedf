"""The layout knobs, each declared once (:class:`~pipette_cp.specs.knobs.base.Knob`), and
what the package derives from them: the cost cache key, the plan-equality key, the
labels, the rules by phase.

:data:`KNOBS` is in enumeration order: a search tries the knobs' values as nested
loops, the first knob outermost (inside the degrees).  Adding a knob: its plan field
(:class:`~pipette_cp.specs.plan.Plan`), its search-space field
(:class:`~pipette_cp.specs.search_space.SearchSpace`), its declaration in one of the modules
here (appended to that module's ``KNOBS``) and its price in the cost model.
"""

from __future__ import annotations

from collections.abc import Iterator
from operator import attrgetter
from typing import Any

from pipette_cp.specs.knobs import batching, kernels, memory, offload, precision
from pipette_cp.specs.knobs.base import Flag, Job, Knob, Phase, PlanFlag, Rule, SpaceFlag

__all__ = [
    "DEGREES",
    "KNOBS",
    "NOT_KNOBS",
    "NOT_SPACE_KNOBS",
    "Flag",
    "Job",
    "Knob",
    "Phase",
    "PlanFlag",
    "Rule",
    "SpaceFlag",
    "knob_labels",
    "knob_rules",
    "knobs_key",
    "plan_key",
]

#: Every knob, in enumeration order.
KNOBS: tuple[Knob[Any], ...] = (
    *batching.KNOBS,
    *memory.KNOBS,
    *kernels.KNOBS,
    *precision.KNOBS,
    *offload.KNOBS,
)
#: The parallel degrees: plan fields and search-space fields of the same names.
DEGREES = ("dp", "pp", "tp", "cp", "ep", "etp")
#: Plan fields that are neither degrees nor knobs.
NOT_KNOBS = ("layer_split", "placement", "instance", "evaluation", "solve_info")
#: Search-space fields that are neither degrees' nor knobs'.
NOT_SPACE_KNOBS = ("use_all_gpus", "min_gpus", "exclude_nodes", "objective")

_COST_KEY = attrgetter(*DEGREES, "layer_split", *(name for k in KNOBS for name in k.cost_key))
_PLAN_KEY = attrgetter(*DEGREES, "layer_split", *(name for k in KNOBS for name in k.cost_key),
                       "placement")  # fmt: skip


def knobs_key(plan: Any) -> tuple[Any, ...]:
    """Everything of a plan but its placement that its costs depend on: the degrees,
    the layer split and every knob's :attr:`~Knob.cost_key` (the cache key of the
    placement-free costs; plans equal in it cost the same on one placement)."""
    return _COST_KEY(plan)  # type: ignore[no-any-return]


def plan_key(plan: Any) -> tuple[Any, ...]:
    """:func:`knobs_key` and the placement: plans equal in it are the same plan
    (whatever their evaluation, provenance or instance name)."""
    return _PLAN_KEY(plan)  # type: ignore[no-any-return]


def knob_labels(plan: Any) -> Iterator[str]:
    """The knobs' parts of a plan's label, in the knobs' order."""
    for knob in KNOBS:
        yield from knob.label(plan)


_RULES = {phase: tuple(r for k in KNOBS for r in k.rules if r.phase == phase) for phase in Phase}


def knob_rules(phase: Phase) -> tuple[Rule[Any], ...]:
    """The knobs' rules of ``phase``, in the knobs' order."""
    return _RULES[phase]
