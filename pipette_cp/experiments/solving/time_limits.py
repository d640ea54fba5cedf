"""Does every method honour its time limit, and what does it report when it runs out?

``python -m pipette_cp.experiments.solving.time_limits [--limits 1,5] [--instances ...]``
runs every method on one skeleton per instance (the layout with the smallest time
lower bound that fits in memory) at each time limit and prints the wall time, the
overrun (wall - limit), the status and the gap.  Target: overrun <= 10 %
of the limit or 1 s, whichever is larger; a timed-out exact solve says
``feasible`` and gives its gap (``-`` where no valid bound exists, e.g. a
two-level all-reduce outside the master).
"""

from __future__ import annotations

import argparse
import time

from pipette_cp.errors import PipetteError
from pipette_cp.io.instance_file import load_instance
from pipette_cp.search.bounds import memory_check, time_lower_bound
from pipette_cp.search.space import enumerate_layouts
from pipette_cp.solvers import SolveOptions, get_method
from pipette_cp.specs import Instance, Plan
from pipette_cp.specs.layouts import make_plan

INSTANCES = ("llama-2-7b-g3-32", "llama-3-8b-real01-80", "gpt-sc21-18b-g3-256", "gpt3-175b-g1-1024")
METHODS = ("cpsat", "milp", "pipette-sa", "amp", "greedy", "megatron-default")


def skeleton(instance: Instance) -> Plan:
    """The fitting layout with the smallest lower bound that uses pipelining and
    data parallelism (so split and placement both matter)."""
    best: tuple[float, Plan] | None = None
    for plan in enumerate_layouts(instance):
        if (
            plan.pp < 2
            or plan.replicas < 2
            or plan.vpp > 1
            or not memory_check(instance, plan).feasible
        ):
            continue
        bound = time_lower_bound(instance, plan)
        if best is None or bound < best[0]:
            best = (bound, plan)
    if best is None:
        return make_plan(num_layers=instance.model.num_layers, dp=1, pp=1, tp=1,
                         micro_batch_size=1)  # fmt: skip
    return best[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--instances", nargs="*", default=list(INSTANCES))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--limits", default="1,5")
    args = parser.parse_args(argv)
    limits = [float(x) for x in args.limits.split(",")]
    print(f"{'instance':24s} {'layout':26s} {'method':17s} {'limit':>6s} {'wall':>7s} "
          f"{'over':>6s}  status    gap     within")  # fmt: skip
    worst = 0.0
    for name in args.instances:
        instance = load_instance(name)
        plan = skeleton(instance)
        for method in args.methods.split(","):
            for limit in limits:
                start = time.perf_counter()
                try:
                    result = get_method(method)(instance, plan, SolveOptions(time_limit_s=limit))
                    info = result.solve_info
                    status = info.status if info else "?"
                    gap = "-" if info is None or info.gap is None else f"{100 * info.gap:.2f}%"
                except PipetteError as exc:
                    status, gap = type(exc).__name__, "-"
                wall = time.perf_counter() - start
                over = wall - limit
                ok = over <= max(0.1 * limit, 1.0)
                worst = max(worst, over / limit)
                print(
                    f"{name:24s} {plan.layout():26s} {method:17s} {limit:6.1f} {wall:7.2f} "
                    f"{over:6.2f}  {status:9s} {gap:7s} {'yes' if ok else 'NO'}",
                    flush=True,
                )
    print(f"largest overrun: {100 * worst:.1f} % of the limit")


if __name__ == "__main__":
    main()
