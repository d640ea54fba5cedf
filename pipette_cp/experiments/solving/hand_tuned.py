"""The search against layouts tuned by hand for published MLPerf Training submissions.

``python -m pipette_cp.experiments.solving.hand_tuned [--time-limit S] [--cases NAMES]``

Two jobs of 8,192 GPUs, each with the degrees its submitters chose:

- ``deepseek-v3-gb200``: DeepSeek-V3 (bundled) on 2,048 GB200 trays in NVL72 racks (16 trays of each, as Slurm segments),
  global batch 16,384 x 4,096 tokens, FP8; tp2-pp4-vpp4-ep32, micro-batch 1;
- ``llama-405b-h100``: Llama-3.1-405B on 1,024 H100 nodes (G2 fabric), global batch
  1,536 x 8,192 tokens, FP8; tp8-pp8-cp2-vpp8, micro-batch 1.

The hand-tuned layout is priced at its best under the tool's own cost model: every
value of the knobs the submission does not state (recomputation, sharding, ...) with
those degrees, on Megatron's rank order, the fastest that fits.  The search runs with
its default space and method within ``--time-limit`` seconds (default 60).  One line
per job: the hand-tuned time, the search's time and their ratio (< 1: the search is
faster), whether the hand-tuned degrees are inside the default space, and the search's
counts.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

from pipette_cp.api import solve_with_stats
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.errors import PipetteError
from pipette_cp.io.instance_file import instance_from_mapping
from pipette_cp.search.space import degrees, enumerate_layouts
from pipette_cp.specs import Instance, Plan, SearchSpace


@dataclass(frozen=True)
class Case:
    """One published job: the instance's fields and the submitters' degrees."""

    name: str
    fields: dict
    sizes: dict[str, int]


CASES = (
    Case("deepseek-v3-gb200", {
        "name": "deepseek-v3-gb200-8192", "model": "deepseek-v3",
        "cluster": {"generator": {"kind": "gb200-nvl72", "gpus": 8192, "seed": 0,
                                  "segment_trays": 16}},
        "training": {"global_batch_size": 16384, "seq_length": 4096, "precision": "fp8"},
    }, {"tp": 2, "pp": 4, "vpp": 4, "ep": 32, "micro_batch_size": 1}),
    Case("llama-405b-h100", {
        "name": "llama-3.1-405b-h100-8192", "model": "llama-3.1-405b",
        "cluster": {"generator": {"kind": "h100-multileaf", "gpus": 8192, "seed": 0}},
        "training": {"global_batch_size": 1536, "seq_length": 8192, "precision": "fp8"},
    }, {"tp": 8, "pp": 8, "cp": 2, "vpp": 8, "micro_batch_size": 1}),
)  # fmt: skip


def hand_tuned(instance: Instance, sizes: dict[str, int]) -> tuple[Plan | None, int]:
    """The fastest fitting layout with the given degrees (any other knob), on Megatron's
    rank order, and how many were priced."""
    space = instance.search_space.model_copy(update={key: (value,) for key, value in sizes.items()})
    evaluator = Evaluator(instance, validate=False)
    best, best_s, count = None, math.inf, 0
    for plan in enumerate_layouts(instance, space):
        try:
            evaluation = evaluator.evaluate(plan)
        except PipetteError:
            continue
        count += 1
        if evaluation.fits and evaluation.iteration_time_s < best_s:
            best_s = evaluation.iteration_time_s
            best = plan.model_copy(update={"evaluation": evaluation})
    return best, count


def inside_default_space(instance: Instance, sizes: dict[str, int]) -> bool:
    """Whether the default space enumerates the submitters' degrees (and vpp)."""
    space: SearchSpace = instance.search_space
    wanted = {k: v for k, v in sizes.items() if k in ("tp", "pp", "cp", "ep")}
    found = any(all(getattr(d, k) == v for k, v in wanted.items()) for d in degrees(instance))
    return found and sizes.get("vpp", 1) in space.vpp


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--cases", default=",".join(c.name for c in CASES))
    args = parser.parse_args(argv)
    for case in (c for c in CASES if c.name in args.cases.split(",")):
        instance = instance_from_mapping(case.fields)
        tuned, priced = hand_tuned(instance, case.sizes)
        tuned_s = tuned.evaluation.iteration_time_s if tuned and tuned.evaluation else math.inf
        start = time.perf_counter()
        result = solve_with_stats(instance, time_limit_s=args.time_limit)
        wall = time.perf_counter() - start
        best = result.plans[0]
        assert best.evaluation is not None
        found_s = best.evaluation.iteration_time_s
        s = result.stats
        print(f"{case.name}: hand-tuned {tuned.layout() if tuned else 'none fits'} "
              f"{tuned_s:.3f} s ({priced} knob settings priced); search {best.layout()} "
              f"{found_s:.3f} s in {wall:.0f} s; ratio {found_s / tuned_s:.3f}; "
              f"in the default space: {inside_default_space(instance, case.sizes)}; "
              f"{s.layouts} layouts, {s.scored} scored, {s.solved} solved, "
              f"{s.skipped_budget} over budget", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
