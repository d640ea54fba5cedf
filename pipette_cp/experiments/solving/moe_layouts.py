"""Expert and context parallelism: predict speed, and the search on a degraded H100 cluster.

``python -m pipette_cp.experiments.solving.moe_layouts [--part 1|2|3|4|5]``

1. ``predict`` time per layout of mixture-of-experts layouts (Qwen3-235B-A22B, ep up
   to 64, with and without cp) on generated H100 (G2) clusters of 256 and 1,024 GPUs: the
   mean of :meth:`~pipette_cp.cost.evaluator.evaluate.Evaluator.iteration_time` over repeated
   calls after a warm-up (the search's hot path; the first call of a layout also
   builds its cached tables, reported apart).
2. The default search (cpsat, default budget) on the bundled
   ``qwen3-235b-a22b-g3h100-256`` instance; the returned plan against Megatron's
   default rank order of the same layout and split (on the hostfile order, and the
   fastest of 64 seeded whole-node permutations that avoids the failed pairs), with
   the slowest expert all-to-all flow of each (why one is faster), and the search's
   pruning counts.
3. The same comparison on fixed layouts whose expert groups span four nodes
   (:data:`SPANNING`, two and four nodes), cpsat with a 30 s limit each.
4. cpsat and milp against the brute-force oracle (every placement, scored by the
   evaluator) on a tiny cluster where Megatron's order puts the groups on slow pairs.
5. The placement masters alone (Kelley's loop from no start, ring all-reduce) against the
   brute-force oracle on tiny clusters whose node pairs differ (5, 12 or 20 GB/s, every
   GPU pair of two nodes alike, so the expert and context-parallel families are priced):
   status, time and bound over the oracle's, and Megatron's order over the oracle's.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from pipette_cp.clusters.expand import cluster_from_node_matrix
from pipette_cp.clusters.generators.registry import generate
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.cost.network.collectives import shared_nic_flows
from pipette_cp.cost.network.parallel_groups import group_flows
from pipette_cp.errors import PipetteError
from pipette_cp.io.instance_file import load_instance
from pipette_cp.io.model_file import load_model
from pipette_cp.search import search
from pipette_cp.solvers import get_method
from pipette_cp.solvers.options import SolveOptions
from pipette_cp.solvers.placement.oracle import brute_force_placement
from pipette_cp.specs import Instance, ModelSpec, Plan, TrainingSpec, resolve_gpu
from pipette_cp.specs.layouts import make_plan, megatron_placement

INSTANCE = Path(__file__).resolve().parents[2] / "instances" / "qwen3-235b-a22b-g3h100-256.yaml"

#: (GPUs, dp, pp, tp, cp, ep, etp) of part 1
SPEED_LAYOUTS = (
    (256, 4, 16, 4, 1, 8, 1), (256, 8, 8, 2, 2, 16, 1), (256, 32, 8, 1, 1, 32, None),
    (1024, 16, 16, 4, 1, 16, 1), (1024, 32, 8, 2, 2, 64, 1), (1024, 64, 16, 1, 1, 64, None),
)  # fmt: skip


def predict_speed(repeat: int = 200) -> list[tuple[str, int, float, float]]:
    """(layout, GPUs, first call ms, mean ms per call) of every :data:`SPEED_LAYOUTS`."""
    model = load_model("qwen3-235b-a22b")
    out = []
    for gpus, dp, pp, tp, cp, ep, etp in SPEED_LAYOUTS:
        cluster = generate("h100-multileaf", nodes=gpus // 8, seed=1)
        training = TrainingSpec(global_batch_size=2048, seq_length=8192 if cp > 1 else 4096)
        inst = Instance(name="speed", model=model, cluster=cluster, training=training)
        plan = make_plan(num_layers=model.num_layers, dp=dp, pp=pp, tp=tp, cp=cp, ep=ep,
                         etp=etp, micro_batch_size=1, sequence_parallel=tp > 1)  # fmt: skip
        ev = Evaluator(inst)
        t0 = time.perf_counter()
        ev.iteration_time(plan)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(repeat):
            ev.iteration_time(plan)
        out.append((plan.layout(), gpus, first * 1e3, (time.perf_counter() - t0) / repeat * 1e3))
    return out


def slowest_expert_link(inst: Instance, plan: Plan) -> tuple[float, int]:
    """(bandwidth of the slowest all-to-all flow with NIC shares, GB/s; number of flows
    that leave their node) of ``plan``'s expert groups."""
    ev = Evaluator(inst)
    flat = np.array([g for unit in plan.placement for g in unit], dtype=np.int64)
    f = group_flows(plan)
    src, dst = flat[f.ep_src.ravel()], flat[f.ep_dst.ravel()]
    bw, _ = shared_nic_flows(ev.fabric, src, dst)
    cross = int((ev.fabric.node_of[src] != ev.fabric.node_of[dst]).sum())
    return float(bw.min()) / 1e9, cross


def node_permuted_orders(
    inst: Instance, plan: Plan, tries: int = 64, seed: int = 0
) -> tuple[Plan | None, float, int]:
    """Megatron's rank order of ``plan`` on the hostfile order and on ``tries`` random
    whole-node permutations of it (what a user does to dodge failed nodes): the fastest
    that runs, its time, and how many hit a failed pair."""
    ev = Evaluator(inst)
    g, nodes = inst.cluster.gpus_per_node, inst.cluster.num_nodes
    base = np.array(megatron_placement(plan.replicas, plan.pp, plan.tp))
    rng = np.random.default_rng(seed)
    best, best_t, failed = None, float("inf"), 0
    for i in range(tries + 1):
        order = np.arange(nodes) if i == 0 else rng.permutation(nodes)
        gpus = order[base // g] * g + base % g
        candidate = plan.model_copy(update={"placement": tuple(map(tuple, gpus.tolist()))})
        try:
            t = ev.iteration_time(candidate)
        except PipetteError:
            failed += 1
            continue
        if t < best_t:
            best, best_t = candidate, t
    return best, best_t, failed


def search_part() -> None:
    inst = load_instance(INSTANCE)
    t0 = time.perf_counter()
    result = search(inst)
    wall = time.perf_counter() - t0
    best = result.plans[0]
    ev = Evaluator(inst)
    ours = ev.evaluate(best)
    s = result.stats
    print(f"search: {wall:.1f} s, {s.layouts} layouts, {s.pruned_memory} never fit, "
          f"{s.skipped_budget} over budget, {s.solved} solved")  # fmt: skip
    print(f"best: {best.layout()}  {ours.iteration_time_s:.3f} s  fits={ours.fits} "
          f"memory {ours.memory_bytes_max / 2**30:.1f} GiB")  # fmt: skip
    default, t_default, failed = node_permuted_orders(inst, best)
    print(f"Megatron's order, same layout and split, hostfile order and 64 node permutations: "
          f"{failed} of 65 cross a failed pair")  # fmt: skip
    rows = [("cpsat", best, ours)]
    if default is not None:
        theirs = ev.evaluate(default)
        rows.append(("megatron", default, theirs))
        print(f"  fastest that runs: {t_default:.3f} s; cpsat is "
              f"{t_default / ours.iteration_time_s:.3f}x faster")  # fmt: skip
    for name, plan, e in rows:
        low, cross = slowest_expert_link(inst, plan) if plan.ep > 1 else (float("nan"), 0)
        parts = ", ".join(f"{k} {v:.3f}" for k, v in e.breakdown_s.items() if v > 1e-4)
        print(f"  {name}: slowest expert flow {low:.1f} GB/s, {cross} cross-node flows; {parts}")


#: (dp, pp, tp, ep, etp) of part 3: expert groups of 16 and 32 GPUs (2 and 4 nodes)
SPANNING = ((4, 16, 4, 16, 1), (8, 8, 4, 32, 1))


def spanning_part(time_limit_s: float = 30.0) -> None:
    """cpsat's placement (master + regrouping) of layouts whose expert groups span
    nodes, against the fastest runnable Megatron order (hostfile, 64 permutations)."""
    inst = load_instance(INSTANCE)
    model = inst.model
    solve = get_method("cpsat")
    for dp, pp, tp, ep, etp in SPANNING:
        skeleton = make_plan(num_layers=model.num_layers, dp=dp, pp=pp, tp=tp, ep=ep, etp=etp,
                             micro_batch_size=1, sequence_parallel=tp > 1,
                             distributed_optimizer=True)  # fmt: skip
        plan = solve(inst, skeleton, SolveOptions(time_limit_s=time_limit_s))
        ev = Evaluator(inst)
        ours = ev.evaluate(plan)
        default, t_default, failed = node_permuted_orders(inst, plan)
        low, cross = slowest_expert_link(inst, plan)
        line = (f"  {plan.layout():32s} cpsat {ours.iteration_time_s:.3f} s (fits={ours.fits}, "
                f"ep_comm {ours.breakdown_s.ep_comm:.3f} s, slowest expert flow {low:.1f} "
                f"GB/s, {cross} cross-node flows)")  # fmt: skip
        if default is None:
            print(line + "; Megatron: all 65 orders cross a failed pair")
            continue
        theirs = ev.evaluate(default)
        low_m, cross_m = slowest_expert_link(inst, default)
        print(line + f"; Megatron best of {65 - failed} runnable {t_default:.3f} s (ep_comm "
              f"{theirs.breakdown_s.ep_comm:.3f} s, slowest {low_m:.1f} GB/s, {cross_m} "
              f"cross-node): {t_default / ours.iteration_time_s:.3f}x")  # fmt: skip


def oracle_part(time_limit_s: float = 4.0) -> None:
    """cpsat and milp (master + regrouping) against the brute-force oracle on a 2 x 3
    GPU cluster whose Megatron-order NVLink pairs (0, 1) and (3, 4) are slow (2 GB/s)."""
    gpu = resolve_gpu("h100")
    cluster = cluster_from_node_matrix(
        node_bandwidth=np.full((2, 2), 12e9), intra_node=200e9, gpus_per_node=3, gpu=gpu,
        nics_per_node=1, nic_bandwidth_bytes_per_s=25e9,
    )  # fmt: skip
    bw = cluster.matrix.copy()
    for a, b in ((0, 1), (3, 4)):
        bw[a, b] = bw[b, a] = 2e9
    cluster = cluster.model_copy(update={"bandwidth_bytes_per_s": bw})
    model = ModelSpec(name="tiny-moe", num_layers=4, hidden_size=256, num_attention_heads=8,
                      ffn_hidden_size=1024, vocab_size=1000, max_seq_length=2048, num_experts=8,
                      moe_top_k=2, moe_ffn_hidden_size=512)  # fmt: skip
    inst = Instance(name="oracle", model=model, cluster=cluster,
                    training=TrainingSpec(global_batch_size=12, seq_length=2048))  # fmt: skip
    ev = Evaluator(inst)
    for dp, cp, ep in ((6, 1, 2), (3, 2, 1), (3, 2, 2)):
        skeleton = make_plan(num_layers=4, dp=dp, pp=1, tp=1, cp=cp, ep=ep, micro_batch_size=1)
        _, best = brute_force_placement(inst, skeleton)
        line = f"  {skeleton.layout():24s} Megatron {ev.iteration_time(skeleton) / best:.4f}"
        for method in ("cpsat", "milp"):
            plan = get_method(method)(inst, skeleton, SolveOptions(time_limit_s=time_limit_s))
            line += f"  {method} {ev.iteration_time(plan) / best:.4f}"
        print(line + "  (x the oracle's time)")


#: (dp, pp, tp, cp, ep, etp, GPUs per node) of part 5
MASTER_LAYOUTS = (
    (4, 1, 1, 1, 2, None, 2), (2, 1, 1, 2, 2, None, 2), (2, 1, 2, 1, 4, 1, 2),
    (3, 1, 1, 2, 2, None, 3), (6, 1, 1, 1, 2, None, 3), (1, 2, 2, 2, 2, None, 2),
    (2, 1, 2, 2, 2, None, 4),
)  # fmt: skip


def masters_part(limit_s: float = 60.0) -> None:
    """Part 5 (module docstring)."""
    from pipette_cp.solvers.placement import BACKENDS
    from pipette_cp.solvers.placement.build import build_placement_data
    from pipette_cp.solvers.placement.kelley import CutPool, kelley, lower_x, worst_x

    model = ModelSpec(name="small-moe", num_layers=4, hidden_size=2048, num_attention_heads=16,
                      ffn_hidden_size=8192, vocab_size=1000, max_seq_length=4096, num_experts=8,
                      moe_top_k=2, moe_ffn_hidden_size=4096)  # fmt: skip
    rng = np.random.default_rng(3)
    for dp, pp, tp, cp, ep, etp, gpus in MASTER_LAYOUTS:
        nodes = dp * pp * tp * cp // gpus
        pairs = rng.choice([5e9, 12e9, 20e9], size=(nodes, nodes))
        cluster = cluster_from_node_matrix(
            node_bandwidth=np.minimum(pairs, pairs.T), intra_node=200e9, gpus_per_node=gpus,
            gpu=resolve_gpu("h100"), nics_per_node=1, nic_bandwidth_bytes_per_s=25e9,
        )  # fmt: skip
        inst = Instance(name="masters", model=model, cluster=cluster,
                        training=TrainingSpec(global_batch_size=12 * cp, seq_length=4096))  # fmt: skip
        plan = make_plan(num_layers=4, dp=dp, pp=pp, tp=tp, cp=cp, ep=ep, etp=etp,
                         micro_batch_size=1, sequence_parallel=tp > 1)  # fmt: skip
        _, best = brute_force_placement(inst, plan, "ring")
        megatron = Evaluator(inst, dp_algorithm="ring").iteration_time(plan) / best
        data = build_placement_data(inst, plan)
        line = f"  {plan.layout():28s} {nodes} x {gpus} GPUs  Megatron {megatron:.4f}"
        for backend in ("cpsat", "milp"):
            pool = CutPool(data, upper_s=2 * data.total_time_s(worst_x(data)))
            pool.add_at(lower_x(data))
            doms = [np.flatnonzero(data.allowed[data.stage_of(u)]) for u in range(data.num_units)]
            res = kelley(data, BACKENDS[backend], domains=doms, start=None, pool=pool,
                         deadline=time.perf_counter() + limit_s)  # fmt: skip
            line += (f"  {backend} {res.status} {res.value_s / best:.6f} (bound "
                     f"{res.bound_s / best:.6f}, {res.wall_time_s:.2f} s)")  # fmt: skip
        print(line + "  (x the oracle's time)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", type=int, choices=(1, 2, 3, 4, 5))
    args = parser.parse_args(argv)
    if args.part in (None, 1):
        print("part 1: predict time per MoE layout")
        for layout, gpus, first, mean in predict_speed():
            print(f"  {gpus:5d} GPUs  {layout:36s} first {first:7.2f} ms  then {mean:6.3f} ms")
    if args.part in (None, 2):
        print("part 2: default search on", INSTANCE.stem)
        search_part()
    if args.part in (None, 3):
        print("part 3: layouts whose expert groups span nodes (cpsat, 30 s each)")
        spanning_part()
    if args.part in (None, 4):
        print("part 4: against the brute-force oracle (tiny cluster with slow NVLink pairs)")
        oracle_part()
    if args.part in (None, 5):
        print("part 5: the masters alone against the brute-force oracle (uneven node pairs)")
        masters_part()


if __name__ == "__main__":
    main()
