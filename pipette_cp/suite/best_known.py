"""Benchmark rows against the best objective known for each instance.

Two flags: a plan that *beats* ``best_known`` (the instance file can be updated:
``pipette-cp bench update-best-known``), and a solver that claims ``optimal`` with
an objective above ``best_known`` for the same layout (a bug, or an "optimal" that
is only conditional: the exact models are optimal for one layout's placement given
its split).  Times are compared on the same predictor; the analytic model's time
is the common ground when the predictors differ.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from pipette_cp.specs import BestKnown
from pipette_cp.suite.jobs import BenchRow

#: Relative tolerance of both flags (float noise, the solvers' own 1e-6 gap).
RTOL = 1e-4

FlagKind = Literal["beats-best-known", "optimal-above-best-known"]


@dataclass(frozen=True)
class Flag:
    """One row that disagrees with its instance's ``best_known``."""

    kind: FlagKind
    row: BenchRow
    value_s: float
    best_s: float

    def message(self) -> str:
        r = self.row
        where = f"{r.instance}: {r.method} (seed {r.seed}, {r.time_limit_s:g} s)"
        if self.kind == "beats-best-known":
            return (
                f"{where} beats best_known: {self.value_s:.6g} s < {self.best_s:.6g} s "
                f"({r.layout}); run `pipette-cp bench update-best-known`"
            )
        return (
            f"{where} claims optimal with objective {self.value_s:.6g} s above best_known "
            f"{self.best_s:.6g} s for the same layout {r.layout}: a solver bug?"
        )


def comparable_times(row: BenchRow, best: BestKnown) -> tuple[float, float] | None:
    """The row's time and ``best``'s by the same predictor, or None if there is none."""
    if row.iteration_time_s is not None and best.predictor in ("", row.predictor):
        return row.iteration_time_s, best.iteration_time_s
    if row.analytic_time_s is not None and best.analytic_time_s is not None:
        return row.analytic_time_s, best.analytic_time_s
    return None


def beats(row: BenchRow, best: BestKnown | None) -> bool:
    """Whether the row's plan fits and is faster than ``best`` beyond :data:`RTOL`."""
    if not row.solved:
        return False
    if best is None:
        return True
    times = comparable_times(row, best)
    return times is not None and times[0] < times[1] * (1 - RTOL)


def _analytic_best(best: BestKnown) -> float | None:
    if best.analytic_time_s is not None:
        return best.analytic_time_s
    return best.iteration_time_s if best.predictor in ("", "analytic") else None


def flags_for(row: BenchRow, best: BestKnown | None) -> list[Flag]:
    """The flags of one row (none without a ``best_known``)."""
    if best is None or not row.solved:
        return []
    found = []
    if beats(row, best):
        times = comparable_times(row, best)
        assert times is not None  # beats() compared them
        found.append(Flag("beats-best-known", row, *times))
    reference = _analytic_best(best)
    if (
        row.status == "optimal"
        and row.objective is not None
        and reference is not None
        and best.layout in ("", row.layout)
        and row.objective > reference * (1 + RTOL)
    ):
        found.append(Flag("optimal-above-best-known", row, row.objective, reference))
    return found


def all_flags(rows: Iterable[BenchRow], best: Mapping[str, BestKnown | None]) -> list[Flag]:
    """Flags of every row whose instance has a ``best_known``."""
    return [flag for row in rows for flag in flags_for(row, best.get(row.instance))]


def best_known_updates(
    rows: Iterable[BenchRow], current: Mapping[str, BestKnown | None], version: str
) -> dict[str, BestKnown]:
    """New ``best_known`` entries: per instance, the fastest fitting plan among the rows of
    package ``version``, where it beats the current entry (or there is none)."""
    fastest: dict[str, BenchRow] = {}
    for row in rows:
        if row.version != version or not row.solved:
            continue
        assert row.iteration_time_s is not None  # solved rows carry a plan
        held = fastest.get(row.instance)
        if held is None or (row.iteration_time_s, row.timestamp) < (
            held.iteration_time_s or 0.0,
            held.timestamp,
        ):
            fastest[row.instance] = row
    updates = {}
    for name, row in sorted(fastest.items()):
        if beats(row, current.get(name)):
            assert row.iteration_time_s is not None
            updates[name] = BestKnown(
                iteration_time_s=row.iteration_time_s,
                method=row.method,
                layout=row.layout,
                package_version=row.version,
                predictor=row.predictor,
                analytic_time_s=row.analytic_time_s,
                date=row.timestamp[:10],
            )
    return updates
