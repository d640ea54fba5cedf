"""Choosing the GPUs: what leaving nodes idle buys, and the solver against the baselines.

Three measurements::

    python -m pipette_cp.experiments.solving.gpu_selection [--build] [--quick]

1. The 17-node H100 cluster (measured nccl-tests logs, Llama-3.1-8B, global batch
   1024 x 8192): the default search (whole nodes may stay idle) against the search
   restricted to every GPU, the only space an earlier release searched.
2. Instances with a slow or failed node, a prime node count and V100 cube-mesh
   nodes: the best plan of every method at the same budget, and the speed-up of
   the default method over Megatron's default rank order on all GPUs.
3. How many of the plans the default search returns on clusters of <= 16 nodes
   carry a valid gap (``SolveInfo.gap`` not None), and of the layouts it solves.
4. Every ``optimal`` claim and every bound of both exact placement methods against
   the brute-force oracle on tiny degraded clusters, many leaving GPUs idle.
5. The exact methods against greedy on the same layouts of degraded 160-GPU
   clusters with failed pairs.

``--build`` (re)writes the generated instances of (2) first: each cluster comes
from a seeded generator with one node's links changed, as its ``source`` says.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass

import numpy as np

from pipette_cp.clusters.expand import cluster_from_node_matrix
from pipette_cp.clusters.generators.registry import generate
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.errors import PipetteError
from pipette_cp.io.cluster_file import write_cluster_file
from pipette_cp.io.instance_file import load_instance
from pipette_cp.io.model_file import load_model
from pipette_cp.io.paths import INSTANCES_DIR
from pipette_cp.search.loop import SearchResult, default_time_limit_s, search
from pipette_cp.search.options import SearchOptions
from pipette_cp.search.selection import idle_nodes
from pipette_cp.solvers import SolveOptions, get_method
from pipette_cp.solvers.methods import exact_placement
from pipette_cp.solvers.placement.oracle import brute_force_placement
from pipette_cp.specs import (
    ClusterSpec,
    Instance,
    ModelSpec,
    Plan,
    SearchSpace,
    TrainingSpec,
    resolve_gpu,
)
from pipette_cp.specs.layouts import make_plan

#: The 17-node case.
SEVENTEEN = "llama-3.1-8b-real00-136"


@dataclass(frozen=True)
class Built:
    """A generated instance: cluster generator, the node changed and how."""

    name: str
    model: str
    kind: str
    nodes: int
    seed: int
    node: int
    factor: float  # every inter-node link of ``node`` times this (0: half of them failed)
    batch: int
    seq: int
    precision: str = "bf16"


BUILT = (
    Built("gpt3-6.7b-g1-13n-slownic", "gpt3-6.7b", "g1", 13, 3, 5, 0.25, 512, 2048),
    Built("llama-2-7b-g3-11n-failednode", "llama-2-7b", "g3", 11, 4, 3, 0.0, 256, 4096),
    Built("gpt3-760m-g5-3n-slownic", "gpt3-760m", "g5", 3, 2, 1, 0.3, 128, 2048, "fp16"),
)
#: Bundled instances of (2) besides the built ones.
BUNDLED = (SEVENTEEN, "gpt-sc21-18b-real01-80", "gpt3-1.3b-g5-16")
#: Methods compared in (2); the default first.
METHODS = ("cpsat", "milp", "greedy", "pipette-sa", "amp", "megatron-default", "random")
#: Bundled instances of (3): clusters of at most 16 nodes.
GAP_INSTANCES = (
    "gpt3-1.3b-nominal-8", "gpt3-1.3b-g5-16", "llama-2-7b-g3-32", "gpt3-2.7b-g1-64",
    "llama-3-8b-g2-64", "mistral-7b-g4-64", "gpt3-6.7b-g1-128", "gpt3-13b-g3-128",
)  # fmt: skip


def _changed(cluster: ClusterSpec, built: Built) -> ClusterSpec:
    g, node = cluster.gpus_per_node, built.node
    matrix = cluster.matrix.copy()
    mine = np.zeros(cluster.num_gpus, dtype=bool)
    mine[node * g : (node + 1) * g] = True
    cross = np.outer(mine, ~mine) | np.outer(~mine, mine)
    if built.factor > 0:
        matrix[cross] *= built.factor
        how = f"every inter-node link of node {node} x {built.factor:g} (a slow NIC)"
    else:
        rng = np.random.default_rng(built.seed)
        matrix[cross & (rng.random(matrix.shape) < 0.5)] = 0.0
        how = f"half of the inter-node GPU pairs of node {node} failed"
    source = f"generator {built.kind}, {built.nodes} nodes, seed {built.seed}; {how}"
    return cluster.model_copy(
        update={"bandwidth_bytes_per_s": matrix, "name": built.name, "source": source}
    )


def build_instances() -> None:
    """Write the clusters and instance files of :data:`BUILT`."""
    for built in BUILT:
        cluster = _changed(generate(built.kind, nodes=built.nodes, seed=built.seed), built)
        path = INSTANCES_DIR / "clusters" / f"{built.name}.yaml"
        write_cluster_file(cluster, path)
        flash = "" if built.kind != "g5" else "  flash_attention_available: false\n"
        (INSTANCES_DIR / f"{built.name}.yaml").write_text(
            f"name: {built.name}\nfamily: selection\n"
            f"description: '{built.model} on {cluster.source} (built by "
            "python -m pipette_cp.experiments.solving.gpu_selection --build).'\n"
            f"model: {built.model}\ncluster:\n  file: clusters/{built.name}.yaml\n"
            f"training:\n  global_batch_size: {built.batch}\n  seq_length: {built.seq}\n"
            f"  precision: {built.precision}\n{flash}",
            encoding="utf-8",
        )


def _best(instance: Instance, method: str, limit: float, **space: object) -> SearchResult | None:
    """The search's result with ``space`` fields replaced; None if it finds nothing."""
    inst = instance.model_copy(
        update={"search_space": instance.search_space.model_copy(update=space)}
    )
    try:
        return search(inst, SearchOptions(method=method, top_k=1, time_limit_s=limit, seed=0))
    except PipetteError:  # a method that finds nothing: reported as inf, not fatal
        return None


def _time(result: SearchResult | None) -> float:
    if result is None:
        return math.inf
    evaluation = result.plans[0].evaluation
    assert evaluation is not None
    return evaluation.iteration_time_s


def seventeen_nodes() -> None:
    instance = load_instance(SEVENTEEN)
    limit = default_time_limit_s(instance)
    all_gpus = _time(_best(instance, "cpsat", limit, use_all_gpus=True))
    started = time.perf_counter()
    result = _best(instance, "cpsat", limit)
    wall = time.perf_counter() - started
    assert result is not None
    chosen, best = _time(result), result.plans[0]
    idle = idle_nodes(instance, best, result.stats.best_by_gpus, result.stats.bound_by_gpus)
    print(f"## 1. {SEVENTEEN}, budget {limit:.1f} s")
    print(f"all GPUs (earlier release's space): {all_gpus:.3f} s")
    print(f"default (nodes may idle): {chosen:.3f} s, {best.layout()} on {best.num_gpus} GPUs, "
          f"wall {wall:.1f} s; speed-up {all_gpus / chosen:.2f}x")  # fmt: skip
    print(idle.describe(chosen))


def baselines(names: list[str]) -> None:
    print("\n## 2. best plan per method at the default budget (s)")
    print(
        f"{'instance':32s} " + " ".join(f"{m:>10s}" for m in METHODS) + "  mega-all   speed-up  ok"
    )
    for name in names:
        instance = load_instance(name)
        limit = default_time_limit_s(instance)
        times = [_time(_best(instance, m, limit)) for m in METHODS]
        mega_all = _time(_best(instance, "megatron-default", limit, use_all_gpus=True))
        ok = times[0] <= min(times[1:]) * (1 + 1e-9)
        print(f"{name:32s} " + " ".join(f"{t:10.3f}" for t in times)
              + f"  {mega_all:8.3f}  {mega_all / times[0]:8.2f}x  {'yes' if ok else 'NO'}")  # fmt: skip


def gaps() -> None:
    print("\n## 3. plans of the default search with a valid gap (clusters <= 16 nodes)")
    total = with_gap = layouts = layouts_gap = 0
    for name in GAP_INSTANCES:
        instance = load_instance(name)
        limit = default_time_limit_s(instance)
        result = search(instance, SearchOptions(top_k=5, time_limit_s=limit, seed=0))
        infos = [p.solve_info for p in result.plans if p.solve_info is not None]
        solved = [i for i in infos if i.status != "heuristic"]
        gapped = [i.gap for i in solved if i.gap is not None]
        total, with_gap = total + len(solved), with_gap + len(gapped)
        layouts, layouts_gap = layouts + result.stats.solved, layouts_gap + result.stats.with_gap
        shown = ", ".join(f"{gap:.1%}" for gap in gapped)
        print(f"{name:28s} returned: {len(gapped)}/{len(solved)} with a gap ({shown}); "
              f"every solved layout: {result.stats.with_gap}/{result.stats.solved}")  # fmt: skip
    print(f"returned plans: {with_gap}/{total} = {with_gap / max(total, 1):.0%}; "
          f"solved layouts: {layouts_gap}/{layouts} = {layouts_gap / max(layouts, 1):.0%}")  # fmt: skip


#: Tiny oracle cases: (nodes, GPUs per node, dp, pp, tp); fewer units than blocks
#: makes the placement choose which nodes (and blocks) stay idle.
ORACLE_SHAPES = (
    (2, 4, 2, 2, 1), (2, 4, 1, 4, 1), (2, 4, 4, 1, 1), (2, 4, 2, 1, 2), (2, 4, 1, 2, 2),
    (3, 2, 1, 2, 1), (3, 2, 2, 2, 1), (3, 2, 1, 4, 1), (3, 4, 1, 2, 2), (3, 4, 2, 2, 1),
    (2, 2, 2, 2, 1), (2, 2, 1, 4, 1), (2, 4, 2, 2, 2), (2, 4, 1, 2, 4), (3, 2, 3, 2, 1),
)  # fmt: skip


@dataclass
class _Claims:
    """Both exact placements' claims and bounds against one oracle optimum per layout."""

    cases: int = 0
    claims: int = 0
    matched: int = 0
    bounds: int = 0
    valid: int = 0
    faster: int = 0  # solves faster than the best aligned placement

    def check(self, instance: Instance, plan: Plan, best: float, aligned: float) -> None:
        self.cases += 1
        for backend in ("cpsat", "milp"):
            info = exact_placement(instance, plan, SolveOptions(time_limit_s=10),
                                   backend=backend).solve_info  # fmt: skip
            assert info is not None and info.objective is not None
            self.faster += info.objective < aligned * (1 - 1e-9)
            if info.status == "optimal":
                self.claims += 1
                self.matched += abs(info.objective - best) <= 1e-6 * best
            if info.bound is not None:
                self.bounds += 1
                self.valid += info.bound <= best * (1 + 1e-9)

    def text(self) -> str:
        return (f"x 2 methods: optimal claims matching the oracle {self.matched}/{self.claims}; "
                f"bounds below it {self.valid}/{self.bounds}")  # fmt: skip


def oracle_claims(seeds: int = 4) -> None:
    """Every claim of both exact methods against brute force over every placement."""
    print("\n## 4. claims against the brute-force oracle (tiny degraded clusters)")
    tally, subsets = _Claims(), 0
    for nodes, gpus, dp, pp, tp in ORACLE_SHAPES:
        for seed in range(seeds):
            instance = _tiny(nodes, gpus, seed)
            plan = make_plan(num_layers=8, dp=dp, pp=pp, tp=tp, micro_batch_size=1)
            try:
                _, best = brute_force_placement(instance, plan)
            except PipetteError:
                continue  # every placement crosses a failed link
            subsets += dp * pp * tp < nodes * gpus
            tally.check(instance, plan, best, best)
    print(f"{tally.cases} layouts ({subsets} leave GPUs idle) {tally.text()}")
    _unaligned_claims()


#: Unaligned-group cases: (model, dp, pp, tp) on 2 V100 cube-mesh nodes, and the tiny
#: uniform clusters again with the oracle over any tp GPUs of a node.
UNALIGNED = (("gpt3-350m", 1, 2, 2), ("gpt3-350m", 2, 1, 2), ("gpt3-350m", 1, 2, 4),
             ("gpt3-350m", 1, 3, 2), ("gpt3-760m", 1, 2, 2), ("gpt3-760m", 2, 1, 4))  # fmt: skip


def _unaligned_claims() -> None:
    """Claims and bounds against the oracle over any tensor groups (not only aligned)."""
    cube = generate("v100-cube", nodes=2, seed=0)
    training = TrainingSpec(global_batch_size=64, seq_length=2048, precision="fp16",
                            flash_attention_available=False)  # fmt: skip
    runs: list[tuple[Instance, Plan]] = []
    for name, dp, pp, tp in UNALIGNED:
        model = load_model(name)
        instance = Instance(name="cube", model=model, cluster=cube, training=training)
        runs.append((instance, make_plan(num_layers=model.num_layers, dp=dp, pp=pp, tp=tp,
                                         micro_batch_size=1)))  # fmt: skip
    for nodes, gpus, dp, pp, tp in ORACLE_SHAPES[:6]:
        runs.append((_tiny(nodes, gpus, 0), make_plan(num_layers=8, dp=dp, pp=pp, tp=tp,
                                                      micro_batch_size=1)))  # fmt: skip
    tally = _Claims()
    for instance, plan in runs:
        try:
            _, best = brute_force_placement(instance, plan, groups="any")
            _, aligned = brute_force_placement(instance, plan)
        except PipetteError:
            continue
        tally.check(instance, plan, best, aligned)
    print(
        f"{tally.cases} layouts, oracle over any tensor groups, {tally.text()}; "
        f"{tally.faster} solves beat the best aligned placement"
    )


def _tiny(nodes: int, gpus: int, seed: int) -> Instance:
    """A small GPT on ``nodes`` x ``gpus`` A100s: lognormal links, some at 0.6 x, some
    failed (a node kept reachable), every total allowed."""
    rng = np.random.default_rng(seed)
    while True:
        m = 20e9 * rng.lognormal(0.0, 0.1, (nodes, nodes))
        m[rng.random((nodes, nodes)) < 0.3] *= 0.6
        m[rng.random((nodes, nodes)) < 0.15] = 0.0
        np.fill_diagonal(m, 0.0)
        if ((m > 0).sum(axis=0) > 0).all() and ((m > 0).sum(axis=1) > 0).all():
            break
    cluster = cluster_from_node_matrix(
        node_bandwidth=m, intra_node=150e9, gpus_per_node=gpus, gpu=resolve_gpu("a100"),
        nics_per_node=gpus, nic_bandwidth_bytes_per_s=25e9, name=f"tiny-{nodes}x{gpus}-{seed}",
    )  # fmt: skip
    model = ModelSpec(name="small-gpt", num_layers=8, hidden_size=1024, num_attention_heads=16,
                      ffn_hidden_size=4096, vocab_size=32000, max_seq_length=1024)  # fmt: skip
    training = TrainingSpec(global_batch_size=48, seq_length=1024)  # dp 1, 2, 3 or 4
    return Instance(name="tiny", model=model, cluster=cluster, training=training,
                    search_space=SearchSpace(use_all_gpus=False))  # fmt: skip


#: Layouts of the degraded 160-GPU check: (dp, pp, tp).
DEGRADED_LAYOUTS = ((20, 4, 2), (10, 4, 4), (40, 2, 2), (5, 4, 8))


def exact_vs_greedy(limit_s: float = 10.0) -> None:
    """The exact methods against greedy on the same skeleton, scored by one Evaluator:
    the exact ones start from the greedy plan among their hints, so never worse."""
    print(f"\n## 5. per layout on degraded 20-node (160-GPU) clusters, {limit_s:g} s each")
    model = load_model("llama-2-7b")
    worst = 0.0
    for seed in (0, 1):
        cluster = generate("g3", nodes=20, seed=seed)
        instance = Instance(name="g3-160", model=model, cluster=cluster,
                            training=TrainingSpec(global_batch_size=640, seq_length=4096),
                            search_space=SearchSpace())  # fmt: skip
        evaluator = Evaluator(instance)
        for dp, pp, tp in DEGRADED_LAYOUTS:
            plan = make_plan(num_layers=model.num_layers, dp=dp, pp=pp, tp=tp,
                             micro_batch_size=1, distributed_optimizer=True)  # fmt: skip
            times = {}
            for method in ("greedy", "cpsat", "milp"):
                solved = get_method(method)(instance, plan, SolveOptions(time_limit_s=limit_s))
                times[method] = evaluator.iteration_time(solved)
            worst = max(worst, times["cpsat"] / times["greedy"], times["milp"] / times["greedy"])
            print(
                f"seed {seed} dp{dp}-pp{pp}-tp{tp}: "
                + ", ".join(f"{m} {t:.4f} s" for m, t in times.items())
            )
    print(f"worst exact / greedy: {worst:.4f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipette_cp.experiments.solving.gpu_selection")
    parser.add_argument("--build", action="store_true", help="rewrite the generated instances")
    parser.add_argument("--quick", action="store_true", help="the 17-node case only")
    parser.add_argument("--part", type=int, choices=(1, 2, 3, 4, 5), help="one measurement only")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.build:
        build_instances()
    if args.part in (None, 1):
        seventeen_nodes()
    if args.quick:
        return 0
    if args.part in (None, 2):
        baselines([*BUNDLED, *(b.name for b in BUILT)])
    if args.part in (None, 3):
        gaps()
    if args.part in (None, 4):
        oracle_claims()
    if args.part in (None, 5):
        exact_vs_greedy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
