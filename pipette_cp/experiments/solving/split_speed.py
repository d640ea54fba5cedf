"""Speed of the exact layer split (CP-SAT and MILP) on 128 layers x 32 stages.

``python -m pipette_cp.experiments.solving.split_speed`` solves the split of:

- a 128-layer GPT-like model (h = 8192, 64 heads, ffn 4h, sequence 4096) on
  32 nodes x 8 H100 with lognormal link noise, tp = 8, pp = 32, dp = 1, 512
  micro-batches, once with a GPT-2 vocabulary (50,257: the even split is
  optimal) and once with a 256,000-token vocabulary (the LM head makes the
  last stage the bottleneck: the optimum is uneven);
- the same model interleaved, pp = 16 x vpp = 2 (32 model chunks);
- a bundled instance, GPT-3 175B on 1024 A100 (``gpt3-175b-g1-1024``), tp = 8,
  pp = 32, dp = 4.

and prints, per case and backend, the wall time (set-up included), status, gap,
cutting-plane iterations, the iteration time of the best and of the even split,
and the Megatron arguments of the result.  Target: optimal within 1 s
for 128 layers and 32 stages.  Every figure is the best of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse

from pipette_cp.experiments.solving.speed import noisy_cluster
from pipette_cp.io.instance_file import load_instance
from pipette_cp.solvers.options import SolveOptions
from pipette_cp.solvers.split import SplitResult, megatron_split_args, solve_split
from pipette_cp.specs import Instance, ModelSpec, Plan, TrainingSpec
from pipette_cp.specs.layouts import make_plan


def gpt_128(vocab_size: int = 50257, num_nodes: int = 32, seed: int = 0) -> Instance:
    """A 128-layer GPT-like model on ``num_nodes`` x 8 H100, noisy 20 GB/s links."""
    model = ModelSpec(
        name=f"gpt-128l-v{vocab_size}",
        num_layers=128,
        hidden_size=8192,
        num_attention_heads=64,
        ffn_hidden_size=4 * 8192,
        vocab_size=vocab_size,
        max_seq_length=4096,
    )
    cluster = noisy_cluster(num_nodes, "h100", 20.0, 0.05, seed)
    training = TrainingSpec(global_batch_size=512, seq_length=4096)
    return Instance(name=model.name, model=model, cluster=cluster, training=training)


def cases() -> list[tuple[str, Instance, Plan]]:
    """(label, instance, plan) of every benchmark case."""
    out = []
    for vocab in (50257, 256000):
        inst = gpt_128(vocab)
        plan = make_plan(num_layers=128, dp=1, pp=32, tp=8, micro_batch_size=1)
        out.append((f"128 layers, pp=32, vocab {vocab}", inst, plan))
    inst = gpt_128(50257)
    plan = make_plan(
        num_layers=128, dp=1, pp=16, tp=8, micro_batch_size=1, vpp=2, sequence_parallel=True
    )
    out.append(("128 layers, pp=16 x vpp=2, sequence parallel", inst, plan))
    inst = load_instance("gpt3-175b-g1-1024")
    plan = make_plan(num_layers=inst.model.num_layers, dp=4, pp=32, tp=8, micro_batch_size=1)
    out.append(("gpt3-175b-g1-1024, dp=4 pp=32 tp=8", inst, plan))
    return out


def run(instance: Instance, plan: Plan, backend: str, limit_s: float, repeats: int) -> SplitResult:
    """The fastest of ``repeats`` solves (same result each time: the seed is fixed)."""
    runs = [
        solve_split(instance, plan, SolveOptions(time_limit_s=limit_s), backend)  # type: ignore[arg-type]
        for _ in range(repeats)
    ]
    return min(runs, key=lambda r: r.wall_time_s)


def main(argv: list[str] | None = None) -> None:
    """Print the split-solver figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure (best kept)")
    parser.add_argument("--time-limit", type=float, default=30.0, help="per solve, s")
    args = parser.parse_args(argv)
    for label, instance, plan in cases():
        print(f"{label}  ({instance.cluster.describe()}, {instance.model.name})")
        for backend in ("cpsat", "milp"):
            r = run(instance, plan, backend, args.time_limit, args.repeats)
            gap = "-" if r.gap is None else f"{r.gap:.1e}"
            flags = " ".join(megatron_split_args(plan.model_copy(update={"layer_split": r.split}),
                                                 instance.model.num_layers)) or "(none)"  # fmt: skip
            print(
                f"  {backend:5s}: {r.wall_time_s:6.3f} s  {r.status:8s} gap {gap:7s} "
                f"iterations {r.iterations:3d}  T {r.objective_s:.4f} s "
                f"(even {r.start_s:.4f} s, {100 * (1 - r.objective_s / r.start_s):.2f} % faster)"
            )
            print(f"         megatron: {flags[:110]}{'...' if len(flags) > 110 else ''}")


if __name__ == "__main__":
    main()
