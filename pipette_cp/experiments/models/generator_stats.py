"""Measured statistics of every cluster generator next to its targets
(docs/design.md, section 5).

Run ``python -m pipette_cp.experiments.models.generator_stats [--nodes 32] [--seeds 5]``:
for each generator it builds ``--seeds`` clusters (G6: 12-snapshot timelines),
averages every statistic over the seeds and prints it beside the target range,
with the worst seed's value when any seed misses.
"""

from __future__ import annotations

import argparse

import numpy as np
from rich.console import Console
from rich.table import Table

from pipette_cp.clusters.generators.registry import GENERATORS, generate, generate_timeline
from pipette_cp.clusters.generators.targets import measure, measure_timeline

SNAPSHOTS = 12


def measure_kind(kind: str, nodes: int, seeds: int) -> tuple[dict[str, list[float]], dict]:
    """Every seed's statistics and the kind's target ranges."""
    info = GENERATORS[kind]
    values: dict[str, list[float]] = {}
    for seed in range(seeds):
        if kind == "failslow":
            stats = measure_timeline(
                generate_timeline(kind, nodes=nodes, seed=seed, snapshots=SNAPSHOTS)
            )
        else:
            stats = measure(generate(kind, nodes=nodes, seed=seed))
        for name, value in stats.items():
            if value is not None:
                values.setdefault(name, []).append(float(value))
    return values, info.targets().ranges()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args(argv)
    console = Console()
    for kind, info in GENERATORS.items():
        values, ranges = measure_kind(kind, args.nodes, args.seeds)
        table = Table(
            title=f"{info.alias.upper()} {kind}: {args.nodes} nodes, {args.seeds} seeds",
            title_justify="left",
        )
        for col in ("statistic", "mean", "min", "max", "target", "met"):
            table.add_column(col, justify="left" if col in ("statistic", "target") else "right")
        for name, series in values.items():
            low, high = ranges.get(name, (None, None))
            ok = (
                "-"
                if low is None
                else ("yes" if all(low - 1e-12 <= v <= high + 1e-12 for v in series) else "NO")
            )
            target = "-" if low is None else f"[{low:g}, {high:g}]"
            table.add_row(
                name,
                f"{np.mean(series):.4f}",
                f"{min(series):.4f}",
                f"{max(series):.4f}",
                target,
                ok,
            )
        console.print(table)


if __name__ == "__main__":
    main()
