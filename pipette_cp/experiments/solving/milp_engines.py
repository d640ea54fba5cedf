"""MILP engines on the split and placement masters: HiGHS against CBC, and CP-SAT.

``python -m pipette_cp.experiments.solving.milp_engines [--limits 5,20,60] [--instances a,b]
[--engines highs,cbc,cpsat] [--layout representative|bound] [--method-budget 10]
[--json milp_engines.json]``

For every bundled instance (``instances/*.yaml``), one layout
(:func:`~pipette_cp.experiments.solving.milp_masters.layout_of`, deterministic: by default the
representative one of :func:`~pipette_cp.experiments.solving.placement.representative_plan`) and
its two masters as the last round of Kelley's loop sees them, the one that must prove
the bound (:mod:`pipette_cp.experiments.solving.milp_masters`: after a CP-SAT run of the loop;
no split master with one stage; above
:data:`~pipette_cp.solvers.placement.solve.EXACT_SIZE` terms every backend runs LNS, so
those placement masters are not run).

Each master is solved once per engine and time limit: status, objective, bound, gap,
wall time of the solve (the model's hand-over to the engine included) and overrun
(wall - limit).  A master an engine solved before a shorter limit ran out is not run
again at the longer ones (the engines are deterministic with one thread).  Then, with
``--method-budget S``, the ``milp`` method on each layout with ``milp_solver`` cbc and
highs (wall time, time inside the engine's solves, status, the evaluator's time of its
plan).

Targets: HiGHS never overruns a limit by more than max(10 %, 1 s); on the placement
masters it proves optimality at least as often as CBC and reaches a smaller
geometric-mean gap at 20 s (gaps below 1e-6 count as 1e-6, a master without a bound
as 1); the ``milp`` method on HiGHS is never slower than on CBC.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any
from unittest.mock import patch

from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.errors import PipetteError
from pipette_cp.experiments.solving.milp_masters import (
    PlacementMaster,
    SplitMaster,
    layout_of,
    runnable,
)
from pipette_cp.io.instance_file import list_instances, load_instance
from pipette_cp.solvers import METHODS, SolveOptions
from pipette_cp.solvers.milp_engine import MilpResult, solve_milp
from pipette_cp.solvers.placement import milp as placement_milp
from pipette_cp.solvers.placement.solve import EXACT_SIZE
from pipette_cp.solvers.split import milp as split_milp

#: Engines compared (``cpsat``: OR-Tools CP-SAT on the same master, one worker).
ENGINES_RUN = ("highs", "cbc", "cpsat")


@dataclass
class Row:
    """One master solved by one engine at one limit (times in seconds)."""

    instance: str
    layout: str
    master: str  # split | placement
    size: int  # split: virtual stages x cuts; placement: master_size terms
    engine: str
    limit_s: float
    status: str
    objective_s: float | None = None
    bound_s: float | None = None
    gap: float | None = None
    wall_s: float = 0.0
    overrun_s: float = 0.0
    reused: bool = False
    note: str = ""


@dataclass
class MethodRow:
    """The ``milp`` method on one layout with one engine."""

    instance: str
    layout: str
    engine: str
    budget_s: float
    status: str
    time_s: float | None
    gap: float | None
    wall_s: float
    milp_s: float = 0.0  # inside the engine's solves (split and placement masters)
    solves: int = 0
    note: str = ""


def _gap(objective: float | None, bound: float | None) -> float | None:
    if objective is None or bound is None or objective <= 0:
        return None
    return max(objective - bound, 0.0) / objective


def run_masters(
    name: str, engines: list[str], limits: list[float], layout: str = "representative"
) -> list[Row]:
    """Every engine at every limit on the two masters of ``name``'s layout."""
    instance = load_instance(name)
    plan = layout_of(instance, layout)
    if plan is None:
        return [Row(name, "-", "-", 0, "-", 0.0, "n/a", note="no layout fits")]
    rows: list[Row] = []
    placed: PlacementMaster | None = None
    for kind in ("placement", "split"):
        try:
            master: SplitMaster | PlacementMaster
            if kind == "placement":
                master = placed = PlacementMaster(instance, plan)
            else:
                assert placed is not None
                master = SplitMaster(instance, runnable(instance, plan, placed))
        except PipetteError as exc:
            rows.append(Row(name, plan.layout(), kind, 0, "-", 0.0, "n/a", note=str(exc)[:80]))
            continue
        skip = ""
        if isinstance(master, SplitMaster) and master.cost.num_chunks == 1:
            skip = "one stage: no master"
        if kind == "placement" and master.size > EXACT_SIZE:
            skip = f"{master.size} terms > EXACT_SIZE: LNS"
        if kind == "placement" and not skip and master.best is None:
            skip = "no seed placement"
        if skip:
            rows.append(Row(name, plan.layout(), kind, master.size, "-", 0.0, "skipped", note=skip))
            continue
        for engine in engines:
            done: Row | None = None
            for limit in limits:
                if done is not None:  # finished within a shorter limit: the same answer
                    rows.append(replace(done, limit_s=limit, overrun_s=done.wall_s - limit,
                                        reused=True))  # fmt: skip
                    continue
                try:
                    status, objective, bound, wall = master.solve(engine, limit)
                    note = ""
                except PipetteError as exc:
                    status, objective, bound, wall, note = "error", None, None, 0.0, str(exc)
                row = Row(name, plan.layout(), kind, master.size, engine, limit, status,
                          objective, bound, _gap(objective, bound), wall, wall - limit,
                          note=note[:80])  # fmt: skip
                rows.append(row)
                print(_line(row), flush=True)
                if status in ("optimal", "infeasible") and wall < limit:
                    done = row
    return rows


def run_method(name: str, engine: str, budget_s: float, layout: str) -> MethodRow:
    """The ``milp`` method on ``name``'s layout (:func:`layout_of`) with ``engine``."""
    instance = load_instance(name)
    plan = layout_of(instance, layout)
    if plan is None:
        return MethodRow(name, "-", engine, budget_s, "n/a", None, None, 0.0, note="no layout")
    options = SolveOptions(time_limit_s=budget_s, milp_solver=engine)
    walls: list[float] = []

    def timed(*args: Any, **kwargs: Any) -> MilpResult:
        res = solve_milp(*args, **kwargs)
        walls.append(res.wall_time_s)
        return res

    started = time.perf_counter()
    try:  # the backends' solves timed where they call the engine
        with patch.object(split_milp, "solve_milp", timed), \
                patch.object(placement_milp, "solve_milp", timed):  # fmt: skip
            result = METHODS["milp"](instance, plan, options)
        value: float | None = Evaluator(instance).iteration_time(result)
    except PipetteError as exc:
        wall = time.perf_counter() - started
        return MethodRow(name, plan.layout(), engine, budget_s, "n/a", None, None, wall,
                         sum(walls), len(walls), str(exc)[:80])  # fmt: skip
    wall = time.perf_counter() - started
    info = result.solve_info
    status = info.status if info else "?"
    return MethodRow(name, plan.layout(), engine, budget_s, status, value,
                     info.gap if info else None, wall, sum(walls), len(walls))  # fmt: skip


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _line(r: Row) -> str:
    gap = "-" if r.gap is None else f"{100 * r.gap:.3f}%"
    return (
        f"{r.instance:30s} {r.master:9s} {r.size:7d} {r.engine:6s} {r.limit_s:5.2f} "
        f"{r.status:10s} {_fmt(r.objective_s, '.6g'):>11s} {gap:>9s} {r.wall_s:7.2f} "
        f"{r.overrun_s:+7.2f}{' (again)' if r.reused else ''} {r.note}"
    )


def summary(rows: list[Row], engines: list[str], limits: list[float]) -> list[str]:
    """Per engine and limit: worst overrun, optimal placement masters, geometric-mean gap."""
    lines = []
    for engine in engines:
        for limit in limits:
            mine = [r for r in rows if r.engine == engine and r.limit_s == limit]
            if not mine:
                continue
            worst = max(mine, key=lambda r: r.overrun_s)
            allowed = max(0.1 * limit, 1.0)
            placed = [r for r in mine if r.master == "placement"]
            optimal = sum(r.status in ("optimal", "infeasible") for r in placed)  # cut-off
            gaps = [1.0 if r.gap is None else max(r.gap, 1e-6) for r in placed]
            geo = statistics.geometric_mean(gaps) if gaps else None
            lines.append(
                f"{engine:6s} {limit:5.2f} s: worst overrun {worst.overrun_s:+.2f} s "
                f"({worst.instance} {worst.master}; allowed {allowed:.1f} s: "
                f"{'met' if worst.overrun_s <= allowed else 'MISSED'}); placement masters "
                f"proved {optimal}/{len(placed)}, geometric-mean gap {_fmt(geo, '.2e')}"
            )
    return lines


def method_summary(methods: list[MethodRow]) -> list[str]:
    """HiGHS against CBC in the ``milp`` method: plans, proofs, wall times."""
    pairs = [(c, h) for c in methods for h in methods if c.instance == h.instance
             and (c.engine, h.engine) == ("cbc", "highs") and c.time_s and h.time_s]  # fmt: skip
    if not pairs:
        return []
    worse = [h.instance for c, h in pairs if h.time_s > c.time_s * (1 + 1e-9)]  # type: ignore[operator]
    better = sum(h.time_s < c.time_s * (1 - 1e-9) for c, h in pairs)  # type: ignore[operator]
    both = [(c, h) for c, h in pairs if c.status == h.status == "optimal"]
    slow = max((h.wall_s - c.wall_s for c, h in both), default=0.0)
    rest = [(c, h) for c, h in pairs if (c, h) not in both]
    return [
        f"milp method, highs vs cbc on {len(pairs)} layouts: plan worse on {len(worse)} "
        f"{worse}, better on {better}; proved optimal {sum(h.status == 'optimal' for _, h in pairs)}"
        f" vs {sum(c.status == 'optimal' for c, _ in pairs)}; where both proved it "
        f"({len(both)}), highs at most {slow:+.2f} s slower; elsewhere the largest wall: highs "
        f"{max((h.wall_s for _, h in rest), default=0.0):.2f} s, cbc "
        f"{max((c.wall_s for c, _ in rest), default=0.0):.2f} s"
    ]


def main(argv: list[str] | None = None) -> None:
    """Run the masters (and the method check) and print the table and the summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limits", default="5,20,60", help="time limits, s (comma-separated)")
    parser.add_argument("--instances", default="", help="comma-separated names (default: all)")
    parser.add_argument("--engines", default=",".join(ENGINES_RUN),
                        help="comma-separated; none: the method check alone")  # fmt: skip
    parser.add_argument("--layout", choices=("representative", "bound"),
                        default="representative", help="the layout of each instance")  # fmt: skip
    parser.add_argument("--method-budget", type=float, default=None,
                        help="also run the milp method with this budget, s, on cbc and highs")  # fmt: skip
    parser.add_argument("--json", type=Path, default=Path("milp_engines.json"),
                        help="where the rows are written")  # fmt: skip
    args = parser.parse_args(argv)
    limits = sorted(float(x) for x in args.limits.split(",") if x)
    engines = [e for e in args.engines.split(",") if e]
    names = [n for n in args.instances.split(",") if n] or list_instances()
    print(f"{'instance':30s} {'master':9s} {'size':>7s} {'engine':6s} {'limit':>5s} "
          f"{'status':10s} {'objective':>11s} {'gap':>9s} {'wall':>7s} {'over':>7s}")  # fmt: skip
    rows: list[Row] = []
    methods: list[MethodRow] = []
    for name in names if engines else ():  # no engines: the method check alone
        try:
            rows += run_masters(name, engines, limits, args.layout)
        except Exception as exc:  # a crash must not stop the benchmark; it is reported
            note = f"{type(exc).__name__}: {exc}"[:80]
            rows.append(Row(name, "-", "-", 0, "-", 0.0, "error", note=note))
            print(_line(rows[-1]), flush=True)
        args.json.write_text(json.dumps({"masters": [asdict(r) for r in rows]}, indent=1))
    if args.method_budget is not None:
        for name in names:
            for engine in ("cbc", "highs"):
                m = run_method(name, engine, args.method_budget, args.layout)
                methods.append(m)
                print(f"method {m.instance:30s} {m.layout:28s} {m.engine:6s} {m.status:9s} "
                      f"{_fmt(m.time_s, '.6g'):>10s} gap {_fmt(m.gap, '.2e'):>9s} "
                      f"wall {m.wall_s:6.2f} milp {m.milp_s:6.2f} ({m.solves} solves) "
                      f"{m.note}", flush=True)  # fmt: skip
    for line in summary(rows, engines, limits) + method_summary(methods):
        print(line)
    args.json.write_text(json.dumps({"masters": [asdict(r) for r in rows],
                                     "methods": [asdict(m) for m in methods]}, indent=1))  # fmt: skip
    print(f"rows written to {args.json}")


if __name__ == "__main__":
    main()
