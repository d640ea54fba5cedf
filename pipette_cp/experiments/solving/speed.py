"""Speed of the cost models: analytic plans/s and simulator time.

``python -m pipette_cp.experiments.solving.speed`` builds a 1024-GPU cluster (128 nodes
x 8 A100, a measured-looking node matrix with lognormal noise), GPT-3 175B,
and times:

- the analytic :class:`~pipette_cp.cost.evaluator.evaluate.Evaluator` on many plans that
  differ in layout and placement (as a search produces them: 5 layouts for
  1F1B, 3 for interleaved, each plan a fresh random node placement),
  validation included, for 1F1B and for interleaved plans, through
  :meth:`~pipette_cp.cost.evaluator.evaluate.Evaluator.evaluate` (a full
  :class:`~pipette_cp.specs.plan.Evaluation`) and through the search's fast
  path :meth:`~pipette_cp.cost.evaluator.evaluate.Evaluator.iteration_time` (the time
  only).  The evaluator is warm as in a search: its placement-free caches
  (chunk times, memory, flow templates, schedule index arrays, hop-free
  pipeline terms) hold the few layouts after 10 plans; every plan's
  placement is validated and all its transfers are costed;
- the discrete-event simulator on pp=16 with 256 micro-batches (timeline
  included), for 1F1B and interleaved.

Targets: >= 2,000 analytic plans/s on one core; simulator <= 0.2 s.
Every figure is the best of ``--repeats`` runs (the machine may be shared).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from pipette_cp.clusters.expand import cluster_from_node_matrix
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.cost.schedule.simulator import stage_programs
from pipette_cp.specs import ClusterSpec, Instance, ModelSpec, Plan, TrainingSpec, resolve_gpu
from pipette_cp.specs.layouts import make_plan
from pipette_cp.units import GB

#: GPT-3 175B (Brown et al. 2020, Table 2.1): 96 layers, h = 12288, 96 heads.
GPT3_175B = ModelSpec(
    name="gpt3-175b",
    num_layers=96,
    hidden_size=12288,
    num_attention_heads=96,
    ffn_hidden_size=4 * 12288,
    vocab_size=50257,
    max_seq_length=2048,
    source="Brown et al. 2020, Table 2.1",
)


def noisy_cluster(
    num_nodes: int, gpu: str, nic_gb_per_s: float, sigma: float, seed: int = 0
) -> ClusterSpec:
    """``num_nodes`` x 8 ``gpu`` (240 GB/s NVLink pairs, one NIC per GPU): every node
    pair at ``nic_gb_per_s`` per NIC times lognormal(0, ``sigma``) noise."""
    rng = np.random.default_rng(seed)
    return cluster_from_node_matrix(
        node_bandwidth=nic_gb_per_s * GB * rng.lognormal(0.0, sigma, (num_nodes, num_nodes)),
        intra_node=240 * GB,
        gpus_per_node=8,
        gpu=resolve_gpu(gpu),
        nics_per_node=8,
        nic_bandwidth_bytes_per_s=nic_gb_per_s * GB,
        name=f"bench-{num_nodes}x8",
    )


def make_instance(num_nodes: int = 128, global_batch_size: int = 1536, seed: int = 0) -> Instance:
    """GPT-3 175B on ``num_nodes`` x 8 A100-80GB, HDR-like links with noise."""
    # G1-like (docs/design.md, section 5): 18.8 GB/s per NIC under load, lognormal sigma 0.03
    cluster = noisy_cluster(num_nodes, "a100-80gb", 18.8, 0.03, seed)
    training = TrainingSpec(global_batch_size=global_batch_size, seq_length=2048)
    return Instance(name="speed", model=GPT3_175B, cluster=cluster, training=training)


def _shuffled(plan: Plan, rng: np.random.Generator, gpus_per_node: int) -> Plan:
    """The same layout with its units moved to other nodes (a random placement)."""
    units = np.asarray(plan.placement)
    nodes = units // gpus_per_node
    perm = rng.permutation(int(nodes.max()) + 1)
    placed = perm[nodes] * gpus_per_node + units % gpus_per_node
    return plan.model_copy(update={"placement": tuple(tuple(int(g) for g in u) for u in placed)})


def make_plans(instance: Instance, count: int, vpp: int, seed: int = 0) -> list[Plan]:
    """``count`` plans of a few (dp, pp, tp) layouts with random node placements."""
    rng = np.random.default_rng(seed)
    layers = instance.model.num_layers
    layouts = [(8, 16, 8), (16, 8, 8), (32, 8, 4), (4, 32, 8), (8, 32, 4)]
    base = [
        make_plan(num_layers=layers, dp=dp, pp=pp, tp=tp, micro_batch_size=1, vpp=vpp)
        for dp, pp, tp in layouts
        if layers % (pp * vpp) == 0
    ]
    g = instance.cluster.gpus_per_node
    return [_shuffled(base[i % len(base)], rng, g) for i in range(count)]


def best_time(fn: Callable[[], object], repeats: int) -> float:
    """Fastest wall time of ``repeats`` calls of ``fn``, s."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def analytic_plans_per_s(
    instance: Instance, plans: list[Plan], repeats: int, fast: bool = False
) -> float:
    """Plans evaluated per second by one warm :class:`Evaluator` (validation on):
    :meth:`Evaluator.evaluate`, or with ``fast`` :meth:`Evaluator.iteration_time`."""
    evaluator = Evaluator(instance)
    for plan in plans[:10]:  # warm the placement-free caches, as a search would
        evaluator.evaluate(plan)
    run = evaluator.iteration_time if fast else evaluator.evaluate
    elapsed = best_time(lambda: [run(p) for p in plans], repeats)
    return len(plans) / elapsed


def simulator_seconds(vpp: int, repeats: int, cold: bool) -> float:
    """Time of one simulated iteration (timeline included), pp=16, 256 micro-batches.

    ``cold`` clears the cache of per-stage op programs before each run.
    """
    instance = make_instance(global_batch_size=2048)  # dp=8, mb=1 -> 256 micro-batches
    plan = make_plan(num_layers=96, dp=8, pp=16, tp=8, micro_batch_size=1, vpp=vpp)
    evaluator = Evaluator(instance)
    evaluator.simulate(plan)

    def run() -> None:
        if cold:
            stage_programs.cache_clear()
        evaluator.simulate(plan)

    return best_time(run, repeats)


def main(argv: list[str] | None = None) -> None:
    """Print the speed figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", type=int, default=1000, help="plans per timing run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure (best kept)")
    args = parser.parse_args(argv)
    instance = make_instance()
    print(f"cluster: {instance.cluster.describe()}, model: {instance.model.name}")
    for vpp, label in ((1, "1F1B"), (2, "interleaved vpp=2")):
        plans = make_plans(instance, args.plans, vpp)
        rate = analytic_plans_per_s(instance, plans, args.repeats)
        fast = analytic_plans_per_s(instance, plans, args.repeats, fast=True)
        print(
            f"analytic, {label:18s}: {rate:8.0f} plans/s evaluate(), {fast:8.0f} plans/s "
            "iteration_time()  (target >= 2000)"
        )
    for vpp, label in ((1, "1F1B"), (2, "interleaved vpp=2")):
        cold = simulator_seconds(vpp, args.repeats, cold=True)
        warm = simulator_seconds(vpp, args.repeats, cold=False)
        print(
            f"simulator, pp=16 m=256, {label:18s}: {cold:6.3f} s cold, {warm:6.3f} s with "
            "cached op programs  (target <= 0.2)"
        )


if __name__ == "__main__":
    main()
