"""One layout's solve with one CP-SAT worker and with two, at equal wall time.

``python -m pipette_cp.experiments.solving.cpsat_workers [INSTANCE ...] [--time-limit 10]``
solves, per instance, one layout (:func:`~pipette_cp.experiments.solving.time_limits.skeleton`,
or dp32-pp16-tp8-vpp4 on gpt-sc21-530b-g3-4096, its best layout) from the greedy
placement, with ``workers`` 1 and 2 and the same limit, and prints the iteration time,
status and gap of each.  It decides where the search gives a solve a second CP-SAT
worker (:func:`pipette_cp.search.phases.solve_threads`).  Run it on an idle machine.
"""

from __future__ import annotations

import argparse
import time

from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.experiments.solving.time_limits import skeleton
from pipette_cp.io.instance_file import load_instance
from pipette_cp.solvers import SolveOptions, get_method
from pipette_cp.specs import Instance, Plan
from pipette_cp.specs.layouts import make_plan

DEFAULT = ("gpt-sc21-530b-g3-4096", "gpt3-175b-g1-1024", "gpt-sc21-39b-g3-1024",
           "gpt-sc21-18b-g3-256")  # fmt: skip


def layout(instance: Instance) -> Plan:
    """The layout solved for ``instance``, on its greedy placement."""
    if instance.name == "gpt-sc21-530b-g3-4096":
        plan = make_plan(num_layers=instance.model.num_layers, dp=32, pp=16, tp=8, vpp=4,
                         micro_batch_size=1, sequence_parallel=True,
                         distributed_optimizer=True)  # fmt: skip
    else:
        plan = skeleton(instance)
    return get_method("greedy")(instance, plan, SolveOptions(time_limit_s=5))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("instances", nargs="*", default=list(DEFAULT))
    parser.add_argument("--time-limit", type=float, default=10.0)
    args = parser.parse_args(argv)
    for name in args.instances:
        instance = load_instance(name)
        start, evaluator = layout(instance), Evaluator(instance)
        for workers in (1, 2):
            began = time.perf_counter()
            options = SolveOptions(time_limit_s=args.time_limit, workers=workers)
            plan = get_method("cpsat")(instance, start, options)
            info = plan.solve_info
            assert info is not None
            gap = "-" if info.gap is None else f"{100 * info.gap:.2f} %"
            print(f"{name:26s} {start.layout():30s} workers {workers}: "
                  f"{evaluator.iteration_time(plan):.4f} s, {info.status}, gap {gap}, "
                  f"{time.perf_counter() - began:.1f} s", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
