"""Wall time of the whole search (`pipette-cp solve` with its default budget) per instance.

``python -m pipette_cp.benchmarks.solve_time [INSTANCE ...] [--method cpsat]`` prints,
per instance, the GPU count, the default budget, the measured wall time (loading
included), the best plan and its iteration time.  Issue 5's targets: <= 10 s for 64
GPUs, <= 60 s for 512, <= 120 s for 1024, <= 600 s for 4096.
"""

from __future__ import annotations

import argparse
import time

from pipette_cp.api import solve_with_stats
from pipette_cp.io.instance_file import load_instance
from pipette_cp.search.loop import default_time_limit_s

DEFAULT = ("gpt3-2.7b-g1-64", "llama-3-70b-g2-512", "gpt3-175b-g1-1024", "gpt3-175b-g1-4096")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("instances", nargs="*", default=list(DEFAULT))
    parser.add_argument("--method", default="cpsat")
    args = parser.parse_args(argv)
    print(f"{'instance':28s} {'GPUs':>5s} {'budget s':>9s} {'wall s':>8s}  best plan")
    for name in args.instances:
        start = time.perf_counter()
        instance = load_instance(name)
        result = solve_with_stats(instance, method=args.method, top_k=3)
        wall = time.perf_counter() - start
        best = result.plans[0]
        assert best.evaluation is not None
        print(
            f"{name:28s} {instance.cluster.num_gpus:5d} {default_time_limit_s(instance):9.0f} {wall:8.1f}  "
            f"{best.layout()} {best.evaluation.iteration_time_s:.3f} s "
            f"({result.stats.solved} solved, {result.stats.skipped_budget} over budget)",
            flush=True,
        )


if __name__ == "__main__":
    main()
