"""The plan file (``solve --out``) and the plans of ``--json``: one document, one schema.

A plan document is the JSON object ``predict --json`` has always printed (the degrees,
every knob, the layer split, the evaluation in seconds and GB = 1e9 bytes) plus what
makes it a plan: its ``format``, its ``instance``, the solver's report and the
placement.  ``solve --out`` writes one, ``solve --json`` prints a list of them,
``predict --json`` prints one, and :func:`read_plan_document` reads one back::

    {"format": "pipette-cp-plan/2", "instance": "llama-2-7b-g3-32",
     "layout": "dp2-pp2-tp8-mb1", "dp": 2, "pp": 2, "tp": 8, ..., "layer_split": [16, 16],
     "iteration_time_s": 1.84, ..., "memory_gb_by_stage": [61.2, 58.9], ...,
     "solve_info": {"method": "cpsat", "status": "optimal", ...},
     "placement": [[0, 1, 2, 3, 4, 5, 6, 7], ...]}

The reference page of every key is written from :data:`DOCUMENT_KEYS` and the plan's
own fields.  Files written before this format (a bare dump of the plan, no ``format``
key) are still read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from pipette_cp.cost.memory.peak import MemoryBreakdown
from pipette_cp.errors import SpecError
from pipette_cp.report.evaluation import evaluation_json
from pipette_cp.specs import Evaluation, Plan
from pipette_cp.specs._base import spec_error_from
from pipette_cp.units import GB

FORMAT = "pipette-cp-plan/2"

#: The keys a document holds beyond the plan's own fields: (type, what it means; units
#: in the name: _s seconds, _gb GB = 1e9 bytes).  Read back into the plan's evaluation
#: where one is given; ``layout`` and the per-stage breakdown are reports only.
_REPORT_KEYS: dict[str, tuple[Any, str]] = {
    "format": (Literal["pipette-cp-plan/2"], f"Always {FORMAT}.  The tool writes every key "
               "below; a plan written by hand may leave out the evaluation's (export, plot "
               "and explain evaluate it again)."),
    "layout": (str | None, "The layout in one word (dp, pp, tp, micro-batch and the knobs "
               "that differ from their defaults); a report, not read back."),
    "iteration_time_s": (float, "Predicted seconds per training step."),
    "tokens_per_s": (float, "Tokens per second over the whole job."),
    "model_tflops_per_gpu": (float, "Model FLOP/s per GPU, in TFLOP/s (no recomputation "
                             "counted)."),
    "hardware_tflops_per_gpu": (float, "Executed FLOP/s per GPU, in TFLOP/s (recomputation "
                                "counted)."),
    "mfu": (float, "Model FLOP/s utilisation: model TFLOP/s over the GPU's dense peak (0-1)."),
    "hfu": (float, "Hardware FLOP/s utilisation (0-1)."),
    "memory_gb_per_gpu_max": (float, "Peak memory of the fullest GPU, GB."),
    "memory_gb_by_stage": (list[float], "Peak memory per GPU of each pipeline stage, GB."),
    "memory_bound_gb_by_stage": (list[float], "The memory estimate's upper bound per stage, GB."),
    "memory_limit_gb": (float, "Memory a GPU may use: its capacity less the headroom, GB."),
    "memory_margin_gb": (float, "memory_limit_gb less memory_gb_per_gpu_max, GB (< 0: does "
                         "not fit)."),
    "fits": (bool, "Whether every GPU's peak is within memory_limit_gb."),
    "breakdown": (dict[str, float], "The iteration time's parts, seconds (compute, bubble, "
                  "exposed communication, optimizer step, ...)."),
    "predictor": (str, "Which model gave iteration_time_s: analytic or simulator."),
    "memory_breakdown_gb_by_stage": (list[dict[str, float]] | None, "Optional (predict): "
                                     "each stage's peak by part, GB."),
}  # fmt: skip
#: What each report key means (the reference page's meaning column).
DOCUMENT_KEYS: dict[str, str] = {key: text for key, (_, text) in _REPORT_KEYS.items()}

_EVALUATION_GB = {
    "memory_gb_by_stage": "memory_bytes_by_stage",
    "memory_bound_gb_by_stage": "memory_bound_bytes_by_stage",
    "memory_gb_per_gpu_max": "memory_bytes_max",
    "memory_limit_gb": "memory_limit_bytes",
    "memory_margin_gb": "memory_margin_bytes",
}
_EVALUATION_SAME = ("iteration_time_s", "tokens_per_s", "model_tflops_per_gpu",
                    "hardware_tflops_per_gpu", "mfu", "hfu", "fits")  # fmt: skip
_PLAN_FIELDS = tuple(f for f in Plan.model_fields if f != "evaluation")


def plan_document(
    plan: Plan, evaluation: Evaluation | None = None, memory: Sequence[MemoryBreakdown] = ()
) -> dict[str, Any]:
    """The plan file's object for ``plan`` (its own evaluation unless one is given)."""
    evaluation = evaluation or plan.evaluation
    if evaluation is None:
        raise ValueError("a plan document needs an evaluated plan")
    out: dict[str, Any] = {"format": FORMAT, "instance": plan.instance}
    out |= evaluation_json(plan, evaluation, memory)
    out["solve_info"] = plan.solve_info.model_dump() if plan.solve_info else None
    out["placement"] = [list(unit) for unit in plan.placement]
    return out


def read_plan_document(data: Any, where: str = "plan") -> Plan:
    """The plan of a plan document (or of a file written before the format had a
    name); a :class:`SpecError` naming the key for anything else."""
    if not isinstance(data, dict):
        raise SpecError(where, type(data).__name__, "expected a JSON object (a plan file)")
    try:
        if "format" not in data:  # a plan dumped as it is (older files)
            return Plan.model_validate(data)
        if data["format"] != FORMAT:
            raise SpecError(f"{where}.format", data["format"], f"expected {FORMAT}")
        unknown = sorted(set(data) - set(_PLAN_FIELDS) - set(DOCUMENT_KEYS), key=str)
        if unknown:
            raise SpecError(f"{where}.{unknown[0]}", data[unknown[0]], "unknown plan file key")
        fields = {f: data[f] for f in _PLAN_FIELDS if f in data}
        if fields.get("dp_shard_size") is not None and fields["dp_shard_size"] == fields.get("dp"):
            fields["dp_shard_size"] = None  # reported as it takes effect: over all dp ranks
        if "iteration_time_s" in data:
            fields["evaluation"] = _evaluation(data, where)
        return Plan.model_validate(fields)
    except ValidationError as exc:
        raise spec_error_from(exc, where) from None


def _evaluation(data: dict[str, Any], where: str) -> Evaluation:
    missing = [k for k in (*_EVALUATION_SAME, *_EVALUATION_GB, "breakdown") if k not in data]
    if missing:
        raise SpecError(f"{where}.{missing[0]}", None, "missing (the plan's evaluation)")
    values: dict[str, Any] = {k: data[k] for k in _EVALUATION_SAME}
    for key, field in _EVALUATION_GB.items():
        value = data[key]
        values[field] = [_gb(v, f"{where}.{key}") for v in value] if isinstance(value, list) \
            else _gb(value, f"{where}.{key}")  # fmt: skip
    values["breakdown_s"] = data["breakdown"]
    values["model"] = data.get("predictor", "analytic")
    return Evaluation.model_validate(values)


def _gb(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(field, value, "expected a number of GB")
    return float(value) * GB


def plan_file_model() -> type[BaseModel]:
    """A pydantic model of the plan document: the plan's own fields and :data:`DOCUMENT_KEYS`."""
    plan = {name: (info.annotation, info) for name, info in Plan.model_fields.items()}
    # the tool writes every report key; a plan written by hand may leave them out
    report = {key: (kind, Field(... if key == "format" else None, description=text))
              for key, (kind, text) in _REPORT_KEYS.items()}  # fmt: skip
    head = ("format", "instance", "layout")
    tail = ("solve_info", "placement")
    order = [*head, *(f for f in _PLAN_FIELDS if f not in head + tail),
             *(k for k in DOCUMENT_KEYS if k not in head), *tail]  # fmt: skip
    fields = {name: (plan | report)[name] for name in order}
    model = create_model(  # type: ignore[call-overload]
        "PlanFile", __config__=ConfigDict(extra="forbid"), __doc__="A plan: its layout, knobs, "
        "layer split and placement, with the predicted time and memory that chose it.",
        **fields,
    )  # fmt: skip
    return model  # type: ignore[no-any-return]


def plan_file_schema() -> dict[str, Any]:
    """The JSON Schema of a plan document (:func:`plan_file_model`)."""
    return dict(plan_file_model().model_json_schema())
