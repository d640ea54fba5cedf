"""Placement benchmark: exact methods against the baselines on every bundled instance.

``python -m pipette_cp.experiments.solving.placement [--max-nodes N] [--time-limit S]``
runs every bundled instance (:func:`~pipette_cp.io.instance_file.list_instances`)
with at most ``N`` nodes, with one representative layout each
(:func:`representative_plan`), through the methods ``cpsat``, ``milp``,
``greedy``, ``megatron-default``, ``pipette-sa`` (its 10 s budget), ``amp`` and
``random``, and prints, per instance and method: the common evaluator's
iteration time (``Evaluator(instance)``, analytic), the status, bound, gap and
wall time; then the speed-up of ``cpsat`` over ``pipette-sa`` (geometric mean
and max) for the degraded and the oversubscribed families.  A plan that sends
data over a failed link cannot run: its time reads ``fails``.

Targets: placement on <= 16 nodes proven optimal within 10 s; 32-128
nodes: a plan within 60 s never worse than the best baseline, gap reported and
<= 5 % on the generated healthy and degraded clusters; never slower than
pipette-sa; CP-SAT and MILP agree whenever both prove optimality.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.cost.memory.peak import memory_by_stage, usable_memory_bytes
from pipette_cp.errors import PipetteError
from pipette_cp.io.instance_file import list_instances, load_instance
from pipette_cp.solvers import METHODS, SolveOptions
from pipette_cp.specs import Instance, Plan, Recompute
from pipette_cp.specs.layouts import make_plan

#: Methods compared, in table order.
METHODS_RUN = ("cpsat", "milp", "greedy", "megatron-default", "pipette-sa", "amp", "random")
#: Pipette's per-candidate SA budget (docs/design.md, section 2).
PIPETTE_BUDGET_S = 10.0


def _fits(instance: Instance, plan: Plan) -> bool:
    """Every stage within the usable memory of the smallest GPU type (any placement)."""
    limit = min(
        usable_memory_bytes(g, instance.training) for g in instance.cluster.gpu_types.values()
    )
    stages = memory_by_stage(instance.model, instance.training, plan)
    return all(s.bound_bytes <= limit for s in stages)


def representative_plan(instance: Instance) -> Plan | None:
    """Megatron-style layout: the largest tp in (8, 4, 2, 1) dividing the GPUs of a node
    and the heads, then the smallest pp >= 2 (1 on a single node) dividing the layers
    (and the nodes, when every GPU must be used) whose plan fits in memory, with
    micro-batch 1, sequence parallelism, selective (else full) recomputation and the
    distributed optimizer; dp uses the remaining GPUs and divides the global batch.
    If no such pp fits, pp need not divide the layers (uneven split; Pipette cannot
    express it)."""
    model, cluster, training = instance.model, instance.cluster, instance.training
    g, n = cluster.gpus_per_node, cluster.num_nodes
    heads = (model.num_attention_heads, model.kv_heads)
    tp = next(t for t in (8, 4, 2, 1) if g % t == 0 and all(h % t == 0 for h in heads))
    all_gpus = instance.search_space.use_all_gpus
    tries: tuple[tuple[Recompute, bool], ...] = (
        ("selective", True), ("full", True), ("selective", False),
    )  # fmt: skip
    for recompute, even in tries:
        for pp in range(1 if n == 1 else 2, model.num_layers + 1):
            if (even and model.num_layers % pp) or (all_gpus and n % pp):
                continue
            dp = n * g // (tp * pp)
            while dp > 0 and training.global_batch_size % dp:
                dp -= 1
            if dp == 0 or (all_gpus and dp * pp * tp != n * g):
                continue
            plan = make_plan(
                num_layers=model.num_layers, dp=dp, pp=pp, tp=tp, micro_batch_size=1,
                sequence_parallel=tp > 1, recompute=recompute, distributed_optimizer=True,
                flash_attention=training.flash_attention_available,
            )  # fmt: skip
            if _fits(instance, plan):
                return plan
    return None


@dataclass
class Row:
    """One method's outcome on one instance."""

    method: str
    time_s: float | None
    status: str
    bound: float | None
    gap: float | None
    wall_s: float
    note: str = ""


def run_method(
    instance: Instance, plan: Plan, method: str, time_limit_s: float, workers: int
) -> Row:
    """Run ``method`` and score its plan with the common evaluator."""
    limit = PIPETTE_BUDGET_S if method == "pipette-sa" else time_limit_s
    started = time.perf_counter()
    try:
        result = METHODS[method](instance, plan, SolveOptions(time_limit_s=limit, workers=workers))
    except PipetteError as exc:
        return Row(method, None, "n/a", None, None, time.perf_counter() - started, str(exc)[:60])
    except Exception as exc:  # a crash must not stop the benchmark; it is reported
        note = f"{type(exc).__name__}: {exc}"[:60]
        return Row(method, None, "error", None, None, time.perf_counter() - started, note)
    wall = time.perf_counter() - started
    info = result.solve_info
    try:
        value: float | None = Evaluator(instance).iteration_time(result)
    except PipetteError:
        value = None
    status = info.status if info else "?"
    if value is None:
        status = "fails"
    return Row(
        method, value, status, info.bound if info else None, info.gap if info else None, wall
    )


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print the table and the speed-ups."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-nodes", type=int, default=128, help="largest cluster to run")
    parser.add_argument("--time-limit", type=float, default=None,
                        help="time limit of the exact and heuristic methods, s "
                        "(default: 10 s up to 16 nodes, 60 s above)")  # fmt: skip
    parser.add_argument("--workers", type=int, default=1, help="solver workers (threads)")
    parser.add_argument("--methods", default=",".join(METHODS_RUN), help="comma-separated")
    parser.add_argument("--instances", default="", help="comma-separated names (default: all)")
    args = parser.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    names = [s for s in args.instances.split(",") if s] or list_instances()
    speedups: dict[str, list[float]] = {"degraded": [], "oversubscribed": []}
    agree: list[str] = []
    header = f"{'instance':28s} {'method':16s} {'time_s':>10s} {'status':>9s} " \
             f"{'bound_s':>10s} {'gap':>9s} {'wall_s':>7s}"  # fmt: skip
    print(header, flush=True)
    for name in names:
        instance = load_instance(name)
        if instance.cluster.num_nodes > args.max_nodes:
            continue
        plan = representative_plan(instance)
        if plan is None:
            print(f"{name:28s} no fitting layout")
            continue
        n = instance.cluster.num_nodes
        limit = args.time_limit or (10.0 if n <= 16 else 60.0)
        print(f"# {name} ({instance.family}, {n} nodes, {plan.layout()}, limit {limit:g} s)",
              flush=True)  # fmt: skip
        rows = {m: run_method(instance, plan, m, limit, args.workers) for m in methods}
        for row in rows.values():
            print(f"{name:28s} {row.method:16s} {_fmt(row.time_s, '10.5f')} {row.status:>9s} "
                  f"{_fmt(row.bound, '10.5f')} {_fmt(row.gap, '9.2e')} {row.wall_s:7.2f} "
                  f"{row.note}", flush=True)  # fmt: skip
        best, sa = rows.get("cpsat"), rows.get("pipette-sa")
        if best and sa and best.time_s and sa.time_s and instance.family in speedups:
            speedups[instance.family].append(sa.time_s / best.time_s)
        a, b = rows.get("cpsat"), rows.get("milp")
        if a and b and a.status == b.status == "optimal" and a.time_s and b.time_s:
            agree.append(f"{name}: {abs(a.time_s - b.time_s) / a.time_s:.1e}")
    for family, values in speedups.items():
        if values:
            geo = math.exp(sum(math.log(v) for v in values) / len(values))
            print(f"speed-up cpsat vs pipette-sa, {family}: geometric mean {geo:.4f}, "
                  f"max {max(values):.4f} over {len(values)} instances")  # fmt: skip
    print("cpsat vs milp (both optimal), relative difference: " + ("; ".join(agree) or "none"))


if __name__ == "__main__":
    main()
