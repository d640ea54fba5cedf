"""The answer of a search on one 80-column screen, in plain lines that survive a pipe.

:func:`plan_summary` says what the best plan is and what its step is made of, the
memory of each stage against its limit, what its gap is measured against, and the same
layout as Megatron-LM would run it on the same cluster (its default rank order over the
first GPUs and its even layer split): time, whether it fits and runs, how much slower.
Every line is wrapped to ``width`` columns; nothing is cut.
"""

from __future__ import annotations

import textwrap

from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.errors import PipetteError
from pipette_cp.solvers import SolveOptions, get_method
from pipette_cp.specs import Instance, Plan
from pipette_cp.units import GB

#: Stages listed one by one up to this many; beyond, the tightest and the largest.
STAGES_LISTED = 4
#: Label column of the summary.
LABEL = 10


def plan_summary(instance: Instance, plan: Plan, width: int = 80) -> list[str]:
    """The summary's lines (module docstring) of ``plan``, the search's best on ``instance``."""
    ev = plan.evaluation
    assert ev is not None, "a searched plan carries its evaluation"
    nodes = len({g // instance.cluster.gpus_per_node for unit in plan.placement for g in unit})
    split = " + ".join(map(str, plan.layer_split)) if plan.pp <= 8 else f"{plan.pp} stages"
    parts = [(name, s) for name, s in ev.breakdown_s.items() if s >= 0.0005]
    rows = [
        ("best plan", f"{plan.layout()} on {plan.num_gpus} GPUs of {instance.cluster.num_gpus} "
                      f"({nodes} nodes), layers {split}"),
        ("time", f"{ev.iteration_time_s:.3f} s per step, {ev.tokens_per_s / 1e3:,.0f}k tokens/s, "
                 f"MFU {ev.mfu:.1%}; made of "
                 + ", ".join(f"{name.replace('_comm', '')} {s:.3f}" for name, s in parts) + " s"),
        ("memory", _memory(ev.memory_bound_bytes_by_stage, ev.memory_limit_bytes)),
        ("gap", _gap(plan)),
        ("megatron", megatron_comparison(instance, plan)),
        ("assumed", assumed_defaults(instance, plan)),
    ]  # fmt: skip
    out = []
    for label, text in rows:
        out += textwrap.wrap(text, width, initial_indent=f"{label:<{LABEL}}",
                             subsequent_indent=" " * LABEL, break_on_hyphens=False,
                             break_long_words=False)  # fmt: skip
    return out


def megatron_comparison(instance: Instance, plan: Plan) -> str:
    """The same degrees and knobs in Megatron-LM's rank order and even split, scored by the
    same evaluator, against ``plan``."""
    skeleton = plan.model_copy(update={"placement": None, "layer_split": None,
                                       "evaluation": None, "solve_info": None})  # fmt: skip
    what = "same layout in Megatron's rank order on the first GPUs, even split: "
    try:
        default = get_method("megatron-default")(instance, skeleton, SolveOptions())
        ev = Evaluator(instance).evaluate(default)
    except PipetteError as exc:
        return what + f"cannot run ({exc})"
    best = plan.evaluation
    assert best is not None
    slower = ev.iteration_time_s / best.iteration_time_s - 1
    fits = "fits" if ev.fits else (
        f"does not fit ({max(ev.memory_bound_bytes_by_stage) / GB:.1f} GB of "
        f"{ev.memory_limit_bytes / GB:.1f})")  # fmt: skip
    verdict = f"{slower:.1%} slower" if slower > 0.0005 else (
        "as fast" if slower > -0.0005 else f"{-slower:.1%} faster")  # fmt: skip
    return what + f"{ev.iteration_time_s:.3f} s, {fits}; {verdict}"


def assumed_defaults(instance: Instance, plan: Plan) -> str:
    """The defaults the plan's numbers rest on that the user did not set, with what
    the largest change would be where it is cheap to say."""
    t, m = instance.training, instance.model
    said = []
    if t.dropout and "dropout" not in t.model_fields_set:
        quiet = m.attention_dropout_fraction == 0 and m.hidden_dropout_fraction == 0
        off = instance.model_copy(update={"training": t.model_copy(update={"dropout": False})})
        try:
            saved = plan.evaluation.memory_bytes_max - Evaluator(off).evaluate(  # type: ignore[union-attr]
                plan.model_copy(update={"evaluation": None})).memory_bytes_max  # fmt: skip
        except PipetteError:
            saved = 0.0
        said.append(f"dropout masks kept (training.dropout defaults to on; {saved / GB:.1f} GB "
                    "per GPU" + ("; the model has no dropout: set training.dropout: false"
                                 if quiet else "") + ")")  # fmt: skip
    if t.memory_headroom_bytes is None and t.memory_headroom_fraction is None:
        said.append("memory headroom 2 % of each GPU, at least 1 GiB (the default)")
    if "assumed" in instance.cluster.source:
        said.append("some cluster figures are assumed, not measured (its source says which)")
    return "; ".join(said) if said else "nothing beyond the instance"


def _memory(by_stage: tuple[float, ...], limit: float) -> str:
    """Each stage's memory bound against the limit (the extremes of many stages)."""
    text = [f"{b / GB:.1f}" for b in by_stage]
    if len(by_stage) <= STAGES_LISTED:
        listed = ", ".join(f"stage {s} {t}" for s, t in enumerate(text))
    else:
        top = max(range(len(by_stage)), key=lambda s: by_stage[s])
        low = min(range(len(by_stage)), key=lambda s: by_stage[s])
        listed = f"largest stage {top} {text[top]}, smallest stage {low} {text[low]}"
    margin = (limit - max(by_stage)) / GB
    return f"{listed} GB of {limit / GB:.1f} GB usable per GPU; margin {margin:+.1f} GB"


def _gap(plan: Plan) -> str:
    """The search gap (against the lower bound of every layout) and the placement's proof."""
    info = plan.solve_info
    search = "unknown" if info is None or info.search_gap is None else f"{info.search_gap:.1%}"
    if info is None or info.status == "heuristic":
        proof = "a heuristic plan, no placement bound"
    elif info.status == "optimal":
        proof = "proven optimal for its layout and layer split"
    elif info.gap is None:
        proof = "no valid lower bound for this layout"
    else:
        proof = f"within {info.gap:.1%} of the best for its layout and layer split"
    return f"search gap {search} (over the lower bound of every layout); placement {proof}"
