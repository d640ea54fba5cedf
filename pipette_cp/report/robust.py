"""A robust search's plans on every snapshot, as a rich table or JSON."""

from __future__ import annotations

import math
from typing import Any

from rich import box
from rich.table import Table

from pipette_cp.report.plans import plans_json
from pipette_cp.search.robust import RobustResult


def _time(seconds: float) -> str:
    return f"{seconds:.3f}" if math.isfinite(seconds) else "fails"


def snapshots_table(result: RobustResult, title: str = "Iteration time per snapshot, s") -> Table:
    """One row per plan (best first), one column per snapshot, then the q-quantile the
    plans are ranked by; each plan's quantile snapshot is bold, ``fails`` marks a
    snapshot where the plan crosses a failed link."""
    table = Table(
        title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
        collapse_padding=True,
    )  # fmt: skip
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("layout", no_wrap=True)
    for j in range(len(result.snapshot_names)):
        table.add_column(f"s{j}", justify="right", no_wrap=True)
    label = "worst" if result.quantile == 1.0 else f"q={result.quantile:g}"
    table.add_column(label, justify="right", no_wrap=True)
    for rank, (plan, times, crit, score) in enumerate(
        zip(result.plans, result.times_s, result.critical, result.scores_s, strict=True), 1
    ):
        cells = [f"[bold]{_time(t)}[/]" if j == crit else _time(t) for j, t in enumerate(times)]
        table.add_row(str(rank), plan.layout(), *cells, _time(score))
    names = "; ".join(f"s{j} = {name}" for j, name in enumerate(result.snapshot_names))
    table.caption, table.caption_justify = names, "left"
    return table


def robust_json(result: RobustResult) -> list[dict[str, Any]]:
    """:func:`~pipette_cp.report.plans.plans_json` (evaluation on each plan's quantile
    snapshot) plus ``snapshot_times_s`` (name -> s, null where the plan crosses a
    failed link), ``robust_time_s``, ``quantile`` and ``critical_snapshot``."""
    out = plans_json(result.plans)
    for entry, times, crit, score in zip(
        out, result.times_s, result.critical, result.scores_s, strict=True
    ):
        entry["snapshot_times_s"] = {
            name: (t if math.isfinite(t) else None)
            for name, t in zip(result.snapshot_names, times, strict=True)
        }
        entry["robust_time_s"] = score
        entry["quantile"] = result.quantile
        entry["critical_snapshot"] = result.snapshot_names[crit]
    return out
