"""An evaluated plan as a rich table or as the JSON object of `pipette-cp predict --json`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from pipette_cp.cost.memory.peak import MemoryBreakdown
from pipette_cp.specs import Evaluation, Plan
from pipette_cp.specs.knobs import KNOBS
from pipette_cp.units import GB

#: Knob fields reported as they take effect (a plan may leave them None: the default).
EFFECTIVE: dict[str, Callable[[Plan], Any]] = {
    "dp_sharding": attrgetter("sharding"),
    "dp_shard_size": attrgetter("shard_group"),
}


def evaluation_json(
    plan: Plan, evaluation: Evaluation, memory: Sequence[MemoryBreakdown] = ()
) -> dict[str, Any]:
    """The stable JSON contract of ``predict --json`` (GB = 1e9 bytes): the degrees, every
    knob's fields (:data:`~pipette_cp.specs.knobs.KNOBS`; the sharding as it takes effect),
    the split, the evaluation."""
    knobs = {field: EFFECTIVE.get(field, attrgetter(field))(plan)
             for knob in KNOBS for field in knob.fields}  # fmt: skip
    out = {
        "layout": plan.layout(),
        "dp": plan.dp,
        "pp": plan.pp,
        "tp": plan.tp,
        "cp": plan.cp,
        "ep": plan.ep,
        "etp": plan.expert_tp,
        **knobs,
        "layer_split": list(plan.layer_split),
        "iteration_time_s": evaluation.iteration_time_s,
        "tokens_per_s": evaluation.tokens_per_s,
        "model_tflops_per_gpu": evaluation.model_tflops_per_gpu,
        "hardware_tflops_per_gpu": evaluation.hardware_tflops_per_gpu,
        "mfu": evaluation.mfu,
        "hfu": evaluation.hfu,
        "memory_gb_per_gpu_max": evaluation.memory_bytes_max / GB,
        "memory_gb_by_stage": [m / GB for m in evaluation.memory_bytes_by_stage],
        "memory_bound_gb_by_stage": [m / GB for m in evaluation.memory_bound_bytes_by_stage],
        "memory_limit_gb": evaluation.memory_limit_bytes / GB,
        "memory_margin_gb": evaluation.memory_margin_bytes / GB,
        "fits": evaluation.fits,
        "breakdown": dict(evaluation.breakdown_s.items()),
        "predictor": evaluation.model,
    }
    if memory:
        out["memory_breakdown_gb_by_stage"] = [
            {part: value / GB for part, value in stage.as_dict().items()} for stage in memory
        ]
    return out


def evaluation_table(
    plan: Plan, evaluation: Evaluation, memory: Sequence[MemoryBreakdown] = ()
) -> Group:
    """Headline numbers, the time breakdown and memory per stage."""
    fits = "[green]yes[/]" if evaluation.fits else "[bold red]NO (out of memory)[/]"
    head = Table(title=f"Plan {plan.layout()}", show_header=False, title_justify="left", box=None)
    head.add_column(style="bold cyan")
    head.add_column()
    rows = [
        ("layer split", " ".join(map(str, plan.layer_split))),
        ("iteration time", f"{evaluation.iteration_time_s:.3f} s ({evaluation.model})"),
        ("tokens/s", f"{evaluation.tokens_per_s:,.0f}"),
        (
            "model TFLOP/s per GPU",
            f"{evaluation.model_tflops_per_gpu:.1f} (MFU {evaluation.mfu:.1%})",
        ),
        (
            "hardware TFLOP/s per GPU",
            f"{evaluation.hardware_tflops_per_gpu:.1f} (HFU {evaluation.hfu:.1%})",
        ),
        (
            "max memory per GPU",
            f"{evaluation.memory_bytes_max / GB:.1f} GB peak, "
            f"{max(evaluation.memory_bound_bytes_by_stage, default=0.0) / GB:.1f} GB bound",
        ),
        (
            "usable memory",
            f"{evaluation.memory_limit_bytes / GB:.1f} GB, "
            f"margin {evaluation.memory_margin_bytes / GB:+.1f} GB",
        ),
        ("fits", fits),
    ]
    for key, value in rows:
        head.add_row(key, value)
    parts = Table(title="Time breakdown", title_justify="left")
    parts.add_column("part")
    parts.add_column("s", justify="right")
    parts.add_column("share", justify="right")
    total = evaluation.iteration_time_s or 1.0
    for name, seconds in evaluation.breakdown_s.items():
        parts.add_row(name, f"{seconds:.3f}", f"{seconds / total:.1%}")
    return Group(head, Text(""), parts, Text(""), memory_table(evaluation, memory))


_SHORT = {
    "optimizer_state": "optim",
    "activations": "activ",
    "gradients": "grads",
    "temporary": "temp",
}


def memory_table(evaluation: Evaluation, memory: Sequence[MemoryBreakdown] = ()) -> Table:
    """Peak memory of the most loaded GPU of each stage, by part when given, and its upper
    bound (the peak plus the framework's calibrated margin; red when over the usable), GB."""
    table = Table(title="Memory per stage, GB (most loaded GPU)", title_justify="left")
    table.add_column("stage", justify="right")
    names = list(memory[0].as_dict()) if memory else []
    for name in names:
        table.add_column(_SHORT.get(name, name), justify="right")
    table.add_column("peak", justify="right")
    table.add_column("bound", justify="right")
    bounds = evaluation.memory_bound_bytes_by_stage or evaluation.memory_bytes_by_stage
    for stage, (used, bound) in enumerate(
        zip(evaluation.memory_bytes_by_stage, bounds, strict=True)
    ):
        over = bound > evaluation.memory_limit_bytes
        cell = f"[red]{bound / GB:.1f}[/]" if over else f"{bound / GB:.1f}"
        cells = [f"{v / GB:.1f}" for v in memory[stage].as_dict().values()] if memory else []
        table.add_row(str(stage), *cells, f"{used / GB:.1f}", cell)
    return table
