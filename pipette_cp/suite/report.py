"""The benchmark report: each method's iteration time per instance, the speed-up of
the best exact-solver plan over Megatron's default and over Pipette, and geometric
means per instance family.  Formatting only; the CLI prints.

Which rows: the newest row of each (instance, method, seed, time limit), at the
largest time limit stored for the instance (or the one asked for); a method's
time is the mean over seeds of its fitting plans' iteration times.
"""

from __future__ import annotations

import csv
import io
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from pipette_cp.specs import BestKnown
from pipette_cp.suite.best_known import Flag, all_flags
from pipette_cp.suite.jobs import BenchRow
from pipette_cp.suite.runner import DEFAULT_METHODS

#: Exact solvers whose best plan is compared with the baselines.
SOLVERS = ("cpsat", "milp")
#: Baselines the speed-up is measured against.
BASELINES = ("megatron-default", "pipette-sa")

_SHORT = {
    "beats-best-known": "beats best_known",
    "optimal-above-best-known": "optimal > best_known",
}


@dataclass(frozen=True)
class InstanceLine:
    """One instance: per-method time (None: no fitting plan; ``outcomes`` says why)."""

    instance: str
    family: str
    num_gpus: int
    time_limit_s: float
    times: dict[str, float | None]
    outcomes: dict[str, str]
    best_solver: str | None
    speedups: dict[str, float | None]
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class GeoMean:
    """Geometric mean speed-ups over the instances of ``group`` (a family, or 'all')."""

    group: str
    speedups: dict[str, float | None]
    counts: dict[str, int]


@dataclass
class BenchReport:
    methods: list[str]
    lines: list[InstanceLine]
    geomeans: list[GeoMean]
    flags: list[Flag] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def latest_rows(rows: Iterable[BenchRow]) -> list[BenchRow]:
    """The newest row of each (instance, method, seed, time limit) over package versions."""
    newest: dict[tuple, BenchRow] = {}
    for row in rows:
        key = (row.instance, row.method, row.seed, row.time_limit_s)
        if key not in newest or (row.timestamp, row.version) > (
            newest[key].timestamp,
            newest[key].version,
        ):
            newest[key] = row
    return list(newest.values())


def geometric_mean(values: Sequence[float]) -> float | None:
    """exp(mean(log v)); None for no values.

    >>> round(geometric_mean([1.0, 4.0]), 6)
    2.0
    """
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _method_order(methods: Iterable[str]) -> list[str]:
    present = set(methods)
    return [m for m in DEFAULT_METHODS if m in present] + sorted(present - set(DEFAULT_METHODS))


def _line(
    instance: str, rows: list[BenchRow], methods: list[str], flags: list[Flag]
) -> InstanceLine:
    times: dict[str, float | None] = {}
    outcomes: dict[str, str] = {}
    for method in methods:
        mine = [r for r in rows if r.method == method]
        solved = [r.iteration_time_s for r in mine if r.solved and r.iteration_time_s is not None]
        times[method] = sum(solved) / len(solved) if solved else None
        if mine and not solved:
            outcomes[method] = Counter(r.status for r in mine).most_common(1)[0][0]
    solver_times = {m: t for m in SOLVERS if (t := times.get(m)) is not None}
    best = min(solver_times, key=lambda m: solver_times[m]) if solver_times else None
    speedups: dict[str, float | None] = {}
    for base in BASELINES:
        base_time = times.get(base)
        speedups[base] = base_time / solver_times[best] if best and base_time else None
    mine_flags = sorted({f"{_SHORT[f.kind]}: {f.row.method}" for f in flags})
    first = rows[0]
    return InstanceLine(
        instance, first.family, first.num_gpus, first.time_limit_s,
        times, outcomes, best, speedups, tuple(mine_flags),
    )  # fmt: skip


def build_report(
    rows: Iterable[BenchRow],
    best_known: Mapping[str, BestKnown | None],
    time_limit_s: float | None = None,
) -> BenchReport:
    """The report of the stored ``rows`` (see the module docstring)."""
    latest = latest_rows(rows)
    flags = all_flags(latest, best_known)
    by_instance: dict[str, list[BenchRow]] = defaultdict(list)
    for row in latest:
        by_instance[row.instance].append(row)
    methods = _method_order(r.method for r in latest)
    lines, notes = [], []
    for name in sorted(by_instance):
        limits = sorted({r.time_limit_s for r in by_instance[name]})
        chosen = limits[-1] if time_limit_s is None else time_limit_s
        if chosen not in limits:
            notes.append(f"{name}: no rows at time limit {chosen:g} s (stored: {limits})")
            continue
        at_limit = [r for r in by_instance[name] if r.time_limit_s == chosen]
        lines.append(_line(name, at_limit, methods, [f for f in flags if f.row.instance == name]))
    for method in (*SOLVERS, *BASELINES):
        if method not in methods:
            notes.append(f"no {method} rows in the store")
    missing = sorted(  # a what-if variant has none, by design
        n for n, held in by_instance.items() if best_known.get(n) is None and not held[0].variant
    )
    if missing:
        notes.append(f"no best_known for {len(missing)} instance(s): {', '.join(missing)}")
    return BenchReport(methods, lines, _geomeans(lines), flags, notes)


def _geomeans(lines: list[InstanceLine]) -> list[GeoMean]:
    groups: dict[str, list[InstanceLine]] = defaultdict(list)
    for line in lines:
        groups[line.family or "(none)"].append(line)
    result = []
    for group, members in [*sorted(groups.items()), ("all", lines)]:
        speedups: dict[str, float | None] = {}
        counts: dict[str, int] = {}
        for base in BASELINES:
            values = [s for line in members if (s := line.speedups.get(base)) is not None]
            speedups[base], counts[base] = geometric_mean(values), len(values)
        result.append(GeoMean(group, speedups, counts))
    return result


def _time(line: InstanceLine, method: str) -> str:
    value = line.times.get(method)
    return f"{value:.5g}" if value is not None else line.outcomes.get(method, "")


def _x(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}x"


def to_markdown(report: BenchReport) -> str:
    """Markdown: per-instance table (iteration time, s), geometric means, flags, notes."""
    head = ["instance", "family", "GPUs", "limit s", *report.methods, "best solver"]
    head += [f"vs {b}" for b in BASELINES] + ["flags"]
    out = [_md_row(head), _md_row(["---"] * len(head))]
    for line in report.lines:
        cells = [line.instance, line.family, str(line.num_gpus), f"{line.time_limit_s:g}"]
        cells += [_time(line, m) for m in report.methods] + [line.best_solver or ""]
        cells += [_x(line.speedups.get(b)) for b in BASELINES] + ["; ".join(line.flags)]
        out.append(_md_row(cells))
    out += ["", "Speed-up of the best solver plan (cpsat/milp), geometric mean:", ""]
    head = ["family", *(f"vs {b} (n)" for b in BASELINES)]
    out += [_md_row(head), _md_row(["---"] * len(head))]
    for g in report.geomeans:
        out.append(_md_row([g.group, *(f"{_x(g.speedups[b])} ({g.counts[b]})" for b in BASELINES)]))
    if report.flags:
        out += ["", "Flags:", *(f"- {f.message()}" for f in report.flags)]
    if report.notes:
        out += ["", *(f"Note: {n}" for n in report.notes)]
    return "\n".join(out) + "\n"


def _md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def to_csv(report: BenchReport) -> str:
    """CSV: one line per instance, then one ``geomean`` line per family and 'all'."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    speed = [f"speedup_vs_{b}" for b in BASELINES]
    writer.writerow(
        ["instance", "family", "num_gpus", "time_limit_s"]
        + [f"{m}_iteration_time_s" for m in report.methods]
        + ["best_solver", *speed, "flags"]
    )
    for line in report.lines:
        writer.writerow(
            [line.instance, line.family, line.num_gpus, line.time_limit_s]
            + [_csv(line.times.get(m)) or line.outcomes.get(m, "") for m in report.methods]
            + [line.best_solver or ""]
            + [_csv(line.speedups.get(b)) for b in BASELINES]
            + ["; ".join(line.flags)]
        )
    for g in report.geomeans:
        writer.writerow(
            ["geomean", g.group, "", ""]
            + [""] * len(report.methods)
            + [""]
            + [_csv(g.speedups[b]) for b in BASELINES]
            + [""]
        )
    return buffer.getvalue()


def _csv(value: float | None) -> str:
    return "" if value is None else repr(value)
