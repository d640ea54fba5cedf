"""Speed-up of the search on worker processes.

``python -m pipette_cp.experiments.solving.parallel_search [INSTANCE ...] [--jobs 2]
[--ratio 0.6] [--executor local|ray]`` runs, per instance, the default search (cpsat,
default budget ``T``) in one process, then with ``--jobs`` workers and a budget of
``--ratio x T``, and prints both plans' iteration times, wall times, solves and whether
the parallel search reached the sequential plan (same or faster) within its shorter
budget; and, as the control, one worker with the shorter budget (whether the plan
needed the workers, or only the first part of the budget).  Target: 2 workers on 2 cores reach the 1-worker plan in <= 0.6 x the wall time
on the 512- to 4,096-GPU instances.  The machine must be otherwise idle: the workers
share its cores with anything else running.
"""

from __future__ import annotations

import argparse
import time

from pipette_cp.io.instance_file import load_instance
from pipette_cp.search import SearchOptions, search
from pipette_cp.search.loop import default_time_limit_s

DEFAULT = ("llama-3-70b-g2-512", "llama-2-70b-g3-512", "gpt3-175b-g1-1024", "gpt-sc21-39b-g3-1024")


def run(name: str, jobs: int, ratio: float, executor: str) -> str:
    """One instance's line of the table."""
    instance = load_instance(name)
    budget = default_time_limit_s(instance)
    rows = []
    for workers, limit in ((1, budget), (jobs, ratio * budget), (1, ratio * budget)):
        start = time.perf_counter()
        result = search(
            instance, SearchOptions(time_limit_s=limit, jobs=workers, executor=executor)
        )
        wall = time.perf_counter() - start
        best = result.plans[0]
        assert best.evaluation is not None
        rows.append((wall, best.evaluation.iteration_time_s, best.layout(), result.stats.solved))
    (w1, t1, l1, s1), (w2, t2, l2, s2), (w3, t3, _, s3) = rows
    reached = t2 <= t1 * (1 + 1e-9)
    control = "reached" if t3 <= t1 * (1 + 1e-9) else f"missed ({t3 / t1 - 1:+.2%})"
    return (f"{name:26s} {instance.cluster.num_gpus:5d} {budget:7.1f}  1 worker {t1:8.4f} s "
            f"{l1:28s} {s1:3d} solves {w1:6.1f} s | {jobs} workers {t2:8.4f} s {l2:28s} "
            f"{s2:3d} solves {w2:6.1f} s ({w2 / w1:.2f}x the wall time)  "
            f"{'reached' if reached else 'missed'}; 1 worker, same short budget: {t3:.4f} s, "
            f"{s3} solves, {w3:.1f} s: {control}")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("instances", nargs="*", default=list(DEFAULT))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--ratio", type=float, default=0.6)
    parser.add_argument("--executor", default="local", choices=("local", "ray"))
    args = parser.parse_args(argv)
    print(f"{'instance':26s} {'GPUs':>5s} {'budget':>7s}")
    for name in args.instances:
        print(run(name, args.jobs, args.ratio, args.executor), flush=True)


if __name__ == "__main__":
    main()
