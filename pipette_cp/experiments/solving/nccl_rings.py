"""Launch truth: the rings a plan is charged for are the rings NCCL builds at launch.

``python -m pipette_cp.experiments.solving.nccl_rings [--time-limit S] [--instances A,B]``

For every bundled instance (or those named), the best plan of the default search
within ``--time-limit`` seconds (default 10) is exported as Megatron-LM launch files;
its ``rank_map.csv`` is read back and every data-parallel and expert data-parallel
group's ring is rebuilt from it by NCCL's rule alone (the group's ranks in order, the
hosts in the order of their first rank, each host's GPUs together) with code that shares
nothing with the cost model.  The rebuilt rings are compared with the ones the
Evaluator charges (:func:`pipette_cp.report.rings.charged_rings`), and every charged
ring (tensor-parallel ones too) is checked for failed GPU pairs.

One line per instance: GPUs, the plan, its rings, how many differ from the launch's, how
many charged links cross a failed pair; then the totals.  Exit status 1 if any ring
differs or crosses a failed pair.
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path

from pipette_cp.api import solve
from pipette_cp.cost.evaluator.expert_groups import expert_rings_apart
from pipette_cp.errors import PipetteError
from pipette_cp.io.instance_file import list_instances, load_instance
from pipette_cp.report.launch import write_launch_files
from pipette_cp.report.rings import charged_rings, failed_ring_links
from pipette_cp.specs import Instance, Plan


def launched_rings(instance: Instance, plan: Plan, rank_map: Path) -> dict[tuple, tuple[int, ...]]:
    """Every DP and expert-DP group's ring as NCCL builds it from ``rank_map.csv``,
    keyed ``(kind, stage, index)`` as :class:`~pipette_cp.report.rings.ChargedRing`."""
    rows = list(csv.DictReader(rank_map.read_text().splitlines()))
    names = instance.cluster.node_names
    g = instance.cluster.gpus_per_node
    gpu = {int(r["rank"]): names.index(r["host"]) * g + int(r["local_gpu"]) for r in rows}
    host = {rank: r["host"] for rank, r in zip(gpu, rows, strict=True)}
    per_stage = plan.replicas * plan.tp
    apart = instance.model.is_moe and expert_rings_apart(plan)  # experts' own rings
    groups: dict[tuple, list[int]] = {}
    for rank in sorted(gpu):
        stage, local = divmod(rank, per_stage)
        if plan.replicas > 1:  # Megatron: local rank t + tp x replica
            groups.setdefault(("dp", stage, local % plan.tp), []).append(rank)
        if apart and plan.expert_dp > 1:  # local rank e_t + etp (e + ep e_d): e_d varies
            etp, ep = plan.expert_tp, plan.ep  # ring index: e_t ep + e
            index = (local % etp) * ep + (local // etp) % ep
            groups.setdefault(("expert-dp", stage, index), []).append(rank)
    out: dict[tuple, tuple[int, ...]] = {}
    for key, ranks in groups.items():
        hosts: dict[str, list[int]] = {}  # in the order of each host's first rank
        for rank in ranks:
            hosts.setdefault(host[rank], []).append(gpu[rank])
        out[key] = tuple(x for members in hosts.values() for x in members)
    return out


def check_instance(name: str, time_limit_s: float) -> tuple[str, int, int, int]:
    """One instance's line, and its rings, differing rings and failed links."""
    instance = load_instance(name)
    try:
        plan = solve(instance, time_limit_s=time_limit_s, top_k=1)[0]
    except PipetteError as exc:
        return f"{name:36s} no plan: {exc}", 0, 0, 0
    rings = charged_rings(instance, plan)
    charged = {(r.kind, r.stage, r.index): r.gpus for r in rings if r.kind != "tp"}
    with tempfile.TemporaryDirectory() as folder:
        # only the rank map matters here: no Megatron-LM flags (some models have none)
        write_launch_files(instance, plan, Path(folder), megatron_args=[])
        launched = launched_rings(instance, plan, Path(folder) / "rank_map.csv")
    keys = {k for k in launched if len(launched[k]) > 1} | set(charged)
    # both start at the group's first rank: NCCL's ring starts at its node
    differ = sum(1 for k in keys if charged.get(k) != launched.get(k))
    failed = len(failed_ring_links(instance, rings))
    line = (f"{name:36s} {instance.cluster.num_gpus:5d} GPUs  {plan.layout():34s} "
            f"{len(rings):5d} rings  {differ:3d} differ  {failed:3d} failed links")  # fmt: skip
    return line, len(rings), differ, failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--instances", default="", help="comma-separated names (default: all)")
    args = parser.parse_args(argv)
    names = [n for n in args.instances.split(",") if n] or list_instances()
    totals = [0, 0, 0]
    for name in names:
        line, rings, differ, failed = check_instance(name, args.time_limit)
        print(line, flush=True)
        totals = [totals[0] + rings, totals[1] + differ, totals[2] + failed]
    print(f"{len(names)} instances: {totals[0]} rings, {totals[1]} differ from the launch's, "
          f"{totals[2]} charged links over failed pairs")  # fmt: skip
    return 1 if totals[1] or totals[2] else 0


if __name__ == "__main__":
    sys.exit(main())
