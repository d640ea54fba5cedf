"""Wall time of the whole search (`pipette-cp solve` with its default budget) per instance.

``python -m pipette_cp.experiments.solving.solve_time [INSTANCE ...] [--method cpsat]
[--time-limit S]`` prints, per instance, the GPU count, the budget, the measured wall
time (loading included) and its overrun of the budget, the peak resident memory of
the process so far (run one instance per call for its own peak), the best plan, its
iteration time and status.  Targets: <= 10 s for 64 GPUs, <= 60 s for 512, <= 120 s
for 1024, <= 600 s for 4096; overrun <= 10 % or 1 s; 4096 GPUs within 24 GB of
memory.
"""

from __future__ import annotations

import argparse
import resource
import time

from pipette_cp.api import solve_with_stats
from pipette_cp.io.instance_file import load_instance
from pipette_cp.search.loop import default_time_limit_s

DEFAULT = ("gpt3-2.7b-g1-64", "llama-3-70b-g2-512", "gpt3-175b-g1-1024", "gpt3-175b-g1-4096")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("instances", nargs="*", default=list(DEFAULT))
    parser.add_argument("--method", default="cpsat")
    parser.add_argument("--time-limit", type=float, default=None, help="default: per instance")
    args = parser.parse_args(argv)
    print(f"{'instance':28s} {'GPUs':>5s} {'budget s':>9s} {'wall s':>8s} {'over s':>7s} "
          f"{'peak RSS GB':>11s}  best plan")  # fmt: skip
    for name in args.instances:
        start = time.perf_counter()
        instance = load_instance(name)
        budget = args.time_limit or default_time_limit_s(instance)
        result = solve_with_stats(instance, method=args.method, top_k=3, time_limit_s=budget)
        wall = time.perf_counter() - start
        rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # KiB on Linux
        best = result.plans[0]
        assert best.evaluation is not None and best.solve_info is not None
        info = best.solve_info
        gap = "-" if info.gap is None else f"{100 * info.gap:.2f}%"
        print(
            f"{name:28s} {instance.cluster.num_gpus:5d} {budget:9.0f} {wall:8.1f} "
            f"{wall - budget:7.1f} {rss_gb:11.2f}  {best.layout()} "
            f"{best.evaluation.iteration_time_s:.3f} s, {info.status}, gap {gap} "
            f"({result.stats.solved} solved, {result.stats.skipped_budget} over budget)",
            flush=True,
        )


if __name__ == "__main__":
    main()
