"""The search at 1k to 100k GPUs: wall time, peak memory and plan quality by size.

``python -m pipette_cp.experiments.solving.scaling [--sizes 1024,4096,16384,100000] [--jobs 2]
[--budget default|S] [--out DIR]`` solves one model (Llama 3.1 405B, 6,144 sequences
of 8,192 tokens, BF16) on generated H100 fat trees of each size
(:func:`~pipette_cp.clusters.generators.fat_tree.fat_tree_cluster`: 2 % of the node pairs
degraded to half their level, 1 % of the nodes with NICs at half speed), each in a
fresh process whose peak memory (the proportional set size of the process and its
workers, sampled every 0.1 s; and their resident sizes summed, an upper bound that
counts shared pages once per process) is measured from outside.  Per size: the wall time, the
peak memory, the best plan, the lower bound no layout beats (placement-free, valid), the
gap to it, and the same layout on Megatron's rank order (what the placement gained).
Budgets are the targets' (60 s at 4,096 GPUs and below, 120 s at 16,384, 600 s above)
unless ``--budget`` is given.  At 100,000 GPUs no layout uses every GPU (the batch
does not divide), so a layout may leave up to 5 % of the GPUs idle there.  ``--out``
writes ``scaling.json`` and ``scaling.png`` (time, memory and plan against size).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TARGETS = {4096: (60.0, None), 16384: (120.0, 2e9), 100_000: (600.0, 4e9)}


def budget_for(gpus: int) -> float:
    """The target's wall time for ``gpus`` (60 s up to 4,096 GPUs, 120 s up to 16,384)."""
    return 60.0 if gpus <= 4096 else 120.0 if gpus <= 16384 else 600.0


def build(gpus: int, seed: int = 0) -> Any:
    """The instance of one size (see the module docstring)."""
    from pipette_cp.clusters.generators.fat_tree import fat_tree_cluster
    from pipette_cp.io.model_file import load_model
    from pipette_cp.specs import Instance, SearchSpace, TrainingSpec

    tree = {"leaf_nodes": 25, "pod_leaves": 20} if gpus % (8 * 32) else {}
    space = SearchSpace() if gpus % (8 * 32) == 0 else \
        SearchSpace(use_all_gpus=False, min_gpus=math.ceil(0.95 * gpus))  # fmt: skip
    return Instance(
        name=f"llama-3.1-405b-fat-tree-{gpus}",
        model=load_model("llama-3.1-405b"),
        cluster=fat_tree_cluster(gpus, seed, **tree),
        training=TrainingSpec(global_batch_size=6144, seq_length=8192, precision="bf16"),
        search_space=space,
    )


def solve_one(gpus: int, budget: float, jobs: int) -> dict[str, Any]:
    """Run the search on one size in this process; the row of the report."""
    from pipette_cp.cost.evaluator.evaluate import Evaluator
    from pipette_cp.search import SearchOptions, search
    from pipette_cp.specs.layouts import megatron_placement

    start = time.perf_counter()
    instance = build(gpus)
    built = time.perf_counter() - start
    result = search(instance, SearchOptions(time_limit_s=budget, jobs=jobs))
    wall = time.perf_counter() - start
    best = result.plans[0]
    assert best.evaluation is not None
    stats = result.stats
    bounds = [b for n, b in stats.bound_by_gpus.items() if n == best.num_gpus]
    bound = stats.lower_bound if stats.lower_bound is not None else min(bounds, default=None)
    order = best.model_copy(update={"evaluation": None, "placement": megatron_placement(
        best.replicas, best.pp, best.tp)})  # fmt: skip
    try:
        megatron = Evaluator(instance, validate=False).iteration_time(order)
    except Exception:  # Megatron's order crosses a failed pair
        megatron = math.inf
    time_s = best.evaluation.iteration_time_s
    return {
        "gpus": gpus, "budget_s": budget, "jobs": jobs, "wall_s": wall, "build_s": built,
        "iteration_time_s": time_s, "layout": best.layout(), "gpus_used": best.num_gpus,
        "method": best.solve_info.method if best.solve_info else "",
        "lower_bound_s": bound, "gap": None if bound is None else (time_s - bound) / time_s,
        "megatron_order_s": megatron, "layouts": stats.layouts, "solved": stats.solved,
        "fabric_bytes": instance.cluster.fabric.memory_bytes(),
    }  # fmt: skip


def _tree_memory(pid: int) -> tuple[int, int]:
    """Proportional and resident set sizes summed over ``pid`` and its descendants,
    bytes (the resident sum counts pages the workers share with it once per process:
    an upper bound)."""
    pss, rss, todo = 0, 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1]) * 1024
                elif line.startswith("Rss:"):
                    rss += int(line.split()[1]) * 1024
            for task in os.listdir(f"/proc/{p}/task"):
                children = Path(f"/proc/{p}/task/{task}/children").read_text().split()
                todo += [int(c) for c in children]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return pss, rss


def measured(gpus: int, budget: float, jobs: int) -> dict[str, Any]:
    """:func:`solve_one` in a child process, with its peak memory sampled from outside."""
    code = (f"import json; from pipette_cp.experiments.solving.scaling import solve_one; "
            f"print(json.dumps(solve_one({gpus}, {budget}, {jobs})))")  # fmt: skip
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    peak, peak_rss = 0, 0
    while child.poll() is None:
        pss, rss = _tree_memory(child.pid)
        peak, peak_rss = max(peak, pss), max(peak_rss, rss)
        time.sleep(0.1)
    out, _ = child.communicate()
    if child.returncode:
        raise SystemExit(f"the {gpus}-GPU run failed (exit {child.returncode})")
    row = json.loads(out.strip().splitlines()[-1])
    row["peak_bytes"], row["peak_rss_bytes"] = peak, peak_rss
    return row


def line(row: dict[str, Any]) -> str:
    """One size's line of the table, with the targets met or missed."""
    wall_target, mem_target = TARGETS.get(row["gpus"], (None, None))
    verdict = []
    if wall_target is not None:
        verdict.append(f"time {'met' if row['wall_s'] <= wall_target else 'MISSED'}")
    if mem_target is not None:
        verdict.append(f"memory {'met' if row['peak_bytes'] <= mem_target else 'MISSED'}")
    gap = "-" if row["gap"] is None else f"{100 * row['gap']:.1f} %"
    gain = row["megatron_order_s"] / row["iteration_time_s"]
    return (f"{row['gpus']:>7d} {row['wall_s']:7.1f} s {row['peak_bytes'] / 1e9:6.2f} GB "
            f"(RSS sum {row['peak_rss_bytes'] / 1e9:5.2f} GB)  "
            f"{row['iteration_time_s']:8.3f} s {row['layout']:34s} bound gap {gap:>7s}  "
            f"Megatron order {gain:.3f}x slower  {row['solved']} solved of {row['layouts']}  "
            + ", ".join(verdict))  # fmt: skip


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Wall time, peak memory and the plan's time (with its bound) against size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gpus = [r["gpus"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    axes[0].plot(gpus, [r["wall_s"] for r in rows], "o-", label="wall time")
    axes[0].plot(gpus, [r["budget_s"] for r in rows], "k--", label="budget (target)")
    axes[0].set_ylabel("s")
    axes[1].plot(gpus, [r["peak_bytes"] / 1e9 for r in rows], "o-", label="peak memory")
    marks = [(g, m / 1e9) for g, (_, m) in TARGETS.items() if m]
    axes[1].plot([g for g, _ in marks], [m for _, m in marks], "k+", markersize=12,
                 label="target")  # fmt: skip
    axes[1].set_ylabel("GB")
    axes[2].plot(gpus, [r["iteration_time_s"] for r in rows], "o-", label="best plan")
    axes[2].plot(gpus, [r["lower_bound_s"] for r in rows], "v:", label="lower bound")
    axes[2].plot(gpus, [r["megatron_order_s"] for r in rows], "x--", label="on Megatron's order")
    axes[2].set_ylabel("iteration time, s")
    axes[2].set_yscale("log")
    for ax, title in zip(axes, ("search wall time", "search peak memory", "plan"), strict=True):
        ax.set_xscale("log")
        ax.set_xlabel("GPUs")
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024,4096,16384,100000")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--budget", default="default", help="seconds, or default (targets')")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = []
    print(f"{'GPUs':>7s} {'wall':>9s} {'peak':>9s}  plan")
    for gpus in (int(s) for s in args.sizes.split(",")):
        budget = budget_for(gpus) if args.budget == "default" else float(args.budget)
        rows.append(measured(gpus, budget, args.jobs))
        print(line(rows[-1]), flush=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "scaling.json").write_text(json.dumps(rows, indent=1) + "\n")
        plot(rows, args.out / "scaling.png")


if __name__ == "__main__":
    main()
