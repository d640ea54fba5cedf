"""The ranked plans of a search as a rich table or JSON."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table

from pipette_cp.report.plan_file import plan_document
from pipette_cp.specs import Plan
from pipette_cp.units import GB


def _split(plan: Plan) -> str:
    split = plan.layer_split
    if len(set(split)) == 1:
        return f"{len(split)} x {split[0]}"
    text = " ".join(map(str, split))
    return text if len(text) <= 24 else text[:21] + "..."


#: Narrower than this, the table leaves out the GPU count, the split and the memory
#: columns (the summary under it gives them) rather than cut any number.
WIDE_TABLE = 110


def plans_table(plans: list[Plan], title: str = "Top plans", width: int | None = None) -> Table:
    """Rank, layout, split, iteration time, tokens/s, MFU, memory and solver gap; below
    ``width`` :data:`WIDE_TABLE` columns, without the GPUs, split and memory columns.
    No cell is ever cut short (a long layout wraps)."""
    narrow = width is not None and width < WIDE_TABLE
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    wide = ("GPUs", "split", "mem GB")
    columns = [
        ("#", "right"), ("layout", "left"), ("GPUs", "right"), ("split", "left"), ("iter s", "right"),
        ("tokens/s", "right"), ("MFU", "right"), ("mem GB", "right"), ("margin", "right"),
        ("proof", "right"),
    ]  # fmt: skip
    keep = [not (narrow and name in wide) for name, _ in columns]
    for (col, justify), kept in zip(columns, keep, strict=True):
        if kept:  # numbers never wrap nor shrink; the layout folds if it must
            table.add_column(col, justify=justify, no_wrap=col != "layout",  # type: ignore[arg-type]
                             overflow="fold", min_width=len(col))  # fmt: skip
    for rank, plan in enumerate(plans, 1):
        ev = plan.evaluation
        assert ev is not None
        cells = (
            str(rank),
            plan.layout(),
            str(plan.num_gpus),
            _split(plan),
            f"{ev.iteration_time_s:.3f}",
            f"{ev.tokens_per_s / 1e3:,.0f}k",
            f"{ev.mfu:.1%}",
            f"{ev.memory_bytes_max / GB:.1f}/{ev.memory_limit_bytes / GB:.0f}",
            f"{ev.memory_margin_bytes / GB:+.1f}",
            _gap(plan),
        )
        table.add_row(*(c for c, kept in zip(cells, keep, strict=True) if kept))
    return table


def _gap(plan: Plan) -> str:
    """Solver status in one cell: 'opt', the gap of a timed-out solve, or 'heur'."""
    info = plan.solve_info
    if info is None or info.status == "heuristic":
        return "heur"
    if info.status == "optimal":
        return "opt"
    return "-" if info.gap is None else f"{info.gap:.1%}"


#: What the proof column says (printed under the table).
GAP_LEGEND = (
    "proof (of the placement, for its layout and layer split, under the analytic model): "
    "opt = proven optimal; x % = proven within x % of the best placement; - = no valid "
    "bound (the two-level all-reduce or mixed GPU types lie outside the master model); "
    "heur = a heuristic plan"
)


def search_gap_text(plan: Plan, unbounded: int) -> str:
    """The best plan's search gap in words (the same words as the progress lines):
    against the lower bound over every layout, or why there is none, and whether more
    time may help."""
    gap = plan.solve_info.search_gap if plan.solve_info else None
    if gap is None:
        why = (f"{unbounded} layouts were not bounded in time" if unbounded
               else "the plan comes from no search's bound")  # fmt: skip
        return f"search gap unknown: {why} (a longer --time-limit bounds them)"
    hint = "; a longer --time-limit may find a faster plan" if gap > 0.05 else ""
    return f"search gap {gap:.1%}: the best plan over the lower bound of every layout{hint}"


def plans_json(plans: list[Plan]) -> list[dict[str, Any]]:
    """Each plan as the plan file holds it (:func:`~pipette_cp.report.plan_file.plan_document`)."""
    return [plan_document(plan) for plan in plans]
