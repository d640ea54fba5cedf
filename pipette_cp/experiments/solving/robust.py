"""Robust planning on G6 fail-slow timelines: a plan for one snapshot vs one for a window.

``python -m pipette_cp.experiments.solving.robust [--timelines 10] [--horizon 3] [--nodes 8]
[--time-limit S] [--quantile Q] [--window W] [--global-batch B] [--set KEY=VALUE]``

For each of ``--timelines`` seeds, a G6 timeline of ``W + k`` snapshots
(:func:`~pipette_cp.clusters.generators.registry.generate_timeline`, ``k = --horizon``,
``W = --window``, default ``k + 1``, so ``1 + k + k`` snapshots) is generated and
the plan is made at ``t = W - 1``, knowing only the snapshots measured up to then:

- **single**: the plain search on snapshot ``t`` (its best plan);
- **robust**: :func:`~pipette_cp.search.robust.robust_search` over the window
  ``t - W + 1 .. t`` (quantile ``q``), with the single search's plans as extra
  candidates (so on the window it is never worse than single).

Both are scored on the future snapshots ``t + 1 .. t + k`` they never saw, with the
same evaluator (the simulator, as the search's final ranking).  **Regret** of a
plan P on a future snapshot s is ``T(P, s) / T*(s) - 1``, where ``T*(s)`` is the
best time known on s: the minimum of a clairvoyant plain search on s (same budget)
and of every plan scored there (single, robust and the robust candidates), so
regrets are >= 0.  Per timeline: the mean and the worst over the k future
snapshots.  **Cost of robustness**: ``T(robust, t) / T(single, t) - 1`` on the
planning snapshot t.  The searches run under a wall-clock budget, so numbers move
a little from run to run and with the machine's load.

The model and training come from ``--instance`` (default: the bundled G6 instance
``llama-2-7b-g6-64-t0``, Llama-2 7B, sequence 4096) with ``--global-batch``
(default 128: at 256-512 on 8 nodes the best layouts are pp=1 with DP rings over
every node, whose time no placement changes, so both regrets are ~0; at 128, pp=2
layouts with cross-node hops and rings win and placement matters); the search space
is the instance's with FlashAttention fixed on (halves the layouts to bound;
FlashAttention is faster whenever available).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import yaml

from pipette_cp.clusters.generators.registry import generate_timeline
from pipette_cp.errors import InfeasibleError
from pipette_cp.io.instance_file import load_instance
from pipette_cp.search.loop import search
from pipette_cp.search.options import SearchOptions
from pipette_cp.search.robust import robust_search, snapshot_times, with_cluster
from pipette_cp.specs import Instance, Plan, SearchSpace, TrainingSpec, validate_spec

DEFAULT_INSTANCE = "llama-2-7b-g6-64-t0"


@dataclass
class TimelineResult:
    """One timeline: the two plans and their times (s) on the planning snapshot t and
    on the future snapshots, with the best time known on each future snapshot."""

    seed: int
    single: Plan
    robust: Plan
    single_now_s: float
    robust_now_s: float
    single_future_s: list[float]
    robust_future_s: list[float]
    best_future_s: list[float]
    candidates: int
    wall_s: float

    @property
    def same_plan(self) -> bool:
        return (self.single.layout(), self.single.layer_split, self.single.placement) == (
            self.robust.layout(),
            self.robust.layer_split,
            self.robust.placement,
        )

    def regrets(self, which: str) -> list[float]:
        """Regret on each future snapshot of ``which`` ('single' or 'robust')."""
        future = self.single_future_s if which == "single" else self.robust_future_s
        return [t / b - 1.0 for t, b in zip(future, self.best_future_s, strict=True)]

    @property
    def cost_of_robustness(self) -> float:
        return self.robust_now_s / self.single_now_s - 1.0


def benchmark_instance(name: str, global_batch: int | None) -> Instance:
    """The instance with the global batch replaced and FlashAttention fixed on."""
    inst = load_instance(name)
    update: dict[str, Any] = {}
    if global_batch is not None:
        data = {**inst.training.model_dump(), "global_batch_size": global_batch}
        update["training"] = validate_spec(TrainingSpec, data, "training")
    space = {**inst.search_space.model_dump(), "flash_attention": (True,)}
    update["search_space"] = validate_spec(SearchSpace, space, "search_space")
    return validate_spec(Instance, {**dict(inst), **update}, "instance")


def _best(instance: Instance, options: SearchOptions) -> list[Plan]:
    """The search's plans; none if it found nothing within its budget."""
    try:
        return search(instance, options).plans
    except InfeasibleError:
        return []


def run_timeline(
    instance: Instance,
    seed: int,
    *,
    nodes: int,
    horizon: int,
    window: int,
    quantile: float,
    time_limit_s: float,
    method: str,
    params: dict[str, Any],
) -> TimelineResult:
    """Plan at t = window - 1 (single and robust), score on t+1 .. t+horizon."""
    start = time.perf_counter()
    snaps = generate_timeline(
        "failslow", nodes=nodes, seed=seed, snapshots=window + horizon, **params
    )
    t = window - 1
    past, future = snaps[:window], snaps[window:]
    options = SearchOptions(method=method, time_limit_s=time_limit_s, seed=0)
    now = with_cluster(instance, snaps[t])
    single_plans = (
        _best(now, replace(options, top_k=10))
        or search(now, replace(options, top_k=10, time_limit_s=2 * time_limit_s)).plans
    )  # a loaded machine can spend a short budget before the first solve
    robust = robust_search(
        instance, past, options, quantile=quantile, reference=None, extra_plans=single_plans
    )
    single, chosen = single_plans[0], robust.plans[0]
    times = snapshot_times(instance, [snaps[t], *future], [single, *robust.plans])
    best = [min(col) for col in zip(*(row[1:] for row in times), strict=True)]
    for j, snap in enumerate(future):  # the clairvoyant plan for each future snapshot
        oracle = _best(with_cluster(instance, snap), replace(options, top_k=1))
        if oracle:
            best[j] = min(best[j], snapshot_times(instance, [snap], oracle[:1])[0][0])
    return TimelineResult(
        seed=seed,
        single=single,
        robust=chosen,
        single_now_s=times[0][0],
        robust_now_s=times[1][0],
        single_future_s=times[0][1:],
        robust_future_s=times[1][1:],
        best_future_s=best,
        candidates=robust.candidates,
        wall_s=time.perf_counter() - start,
    )


def _pct(x: float) -> str:
    return f"{100 * x:.2f} %" if math.isfinite(x) else "inf"


def markdown(results: Sequence[TimelineResult], title: str) -> str:
    """Per-timeline table, then the aggregate."""
    lines = [
        f"### {title}",
        "",
        "| seed | single plan | robust plan | same | single worst future s | robust worst "
        "future s | single regret mean / worst | robust regret mean / worst | cost of "
        "robustness | wall s |",
        "|---:|---|---|:-:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        s, b = r.regrets("single"), r.regrets("robust")
        lines.append(
            f"| {r.seed} | {r.single.layout()} | {r.robust.layout()} | "
            f"{'yes' if r.same_plan else 'no'} | {max(r.single_future_s):.3f} | "
            f"{max(r.robust_future_s):.3f} | {_pct(statistics.fmean(s))} / {_pct(max(s))} | "
            f"{_pct(statistics.fmean(b))} / {_pct(max(b))} | {_pct(r.cost_of_robustness)} | "
            f"{r.wall_s:.0f} |"
        )
    lines += ["", "| plan | mean regret | mean worst regret | worst regret | "
              "worst future time vs the other: better / equal / worse |",
              "|---|---:|---:|---:|---:|"]  # fmt: skip
    for which, other in (("single", "robust"), ("robust", "single")):
        regrets = [r.regrets(which) for r in results]
        flat = [x for row in regrets for x in row]
        mine = [max(getattr(r, f"{which}_future_s")) for r in results]
        theirs = [max(getattr(r, f"{other}_future_s")) for r in results]
        better = sum(a < b * (1 - 1e-4) for a, b in zip(mine, theirs, strict=True))
        worse = sum(a > b * (1 + 1e-4) for a, b in zip(mine, theirs, strict=True))
        lines.append(
            f"| {which} | {_pct(statistics.fmean(flat))} | "
            f"{_pct(statistics.fmean(max(row) for row in regrets))} | {_pct(max(flat))} | "
            f"{better} / {len(results) - better - worse} / {worse} |"
        )
    costs = [r.cost_of_robustness for r in results]
    same = sum(r.same_plan for r in results)
    lines += [
        "",
        f"Cost of robustness on the planning snapshot: mean {_pct(statistics.fmean(costs))}, "
        f"max {_pct(max(costs))}; the robust plan is the single plan on {same} of "
        f"{len(results)} timelines.",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timelines", type=int, default=10, help="Timelines (seeds).")
    parser.add_argument("--first-seed", type=int, default=0, help="Seed of the first timeline.")
    parser.add_argument("--horizon", type=int, default=3, help="Future snapshots scored (k).")
    parser.add_argument("--window", type=int, default=None, help="Past snapshots [k + 1].")
    parser.add_argument("--nodes", type=int, default=8, help="Nodes of 8 GPUs.")
    parser.add_argument("--time-limit", type=float, default=6.0, help="Budget per search, s.")
    parser.add_argument("--quantile", type=float, default=1.0, help="Robust quantile q.")
    parser.add_argument("--method", default="cpsat", help="Split/placement method.")
    parser.add_argument("--instance", default=DEFAULT_INSTANCE, help="Model and training.")
    parser.add_argument("--global-batch", type=int, default=128, help="Global batch.")
    parser.add_argument(
        "--set", action="append", default=[], help="G6 parameter KEY=VALUE, e.g. "
        "slow_link_fraction=0.1",
    )  # fmt: skip
    args = parser.parse_args(argv)
    window = args.window if args.window is not None else args.horizon + 1
    params = {}
    for item in args.set:
        key, _, value = item.partition("=")
        params[key.strip().replace("-", "_")] = yaml.safe_load(value)
    instance = benchmark_instance(args.instance, args.global_batch)
    results = []
    for seed in range(args.first_seed, args.first_seed + args.timelines):
        result = run_timeline(
            instance, seed, nodes=args.nodes, horizon=args.horizon, window=window,
            quantile=args.quantile, time_limit_s=args.time_limit, method=args.method,
            params=params,
        )  # fmt: skip
        results.append(result)
        print(f"timeline {seed} done in {results[-1].wall_s:.0f} s", flush=True)
    extra = ", ".join(f"{k}={v}" for k, v in params.items())
    title = (
        f"{instance.model.name}, global batch {instance.training.global_batch_size}, G6 "
        f"{args.nodes} x 8 GPUs{', ' + extra if extra else ''}; window {window}, horizon "
        f"{args.horizon}, q={args.quantile:g}, {args.method} {args.time_limit:g} s per search"
    )
    print(markdown(results, title))


if __name__ == "__main__":
    main()
