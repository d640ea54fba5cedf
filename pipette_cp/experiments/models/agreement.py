"""Agreement of the analytic pipeline model with the discrete-event simulator.

``python -m pipette_cp.experiments.models.agreement [INSTANCE ...]`` loads every
bundled instance (the 4096-GPU ones included: ~6 s each, ~25 s in all), picks
a default layout (:func:`default_layout`; when it has one stage, also the
smallest pipelined one) and deliberately unbalanced splits of it
(:func:`unbalanced_split`: a quarter of the middle stage's layers moved to the
first or the last stage), evaluates each with ``predictor="analytic"`` and
``predictor="simulator"`` and prints instance, variant, layout, both iteration
times and their difference, with the largest difference of each class at the
bottom.  Target: within 2 % for the default layouts and the
unbalanced splits (1F1B, ``vpp=1``).  The interleaved schedule (``vpp=2``) is
reported separately, with an even split and with unbalanced chunks: with
unequal chunks the analytic model is a lower bound that misses waits the
simulator sees (``tests/experiments/test_agreement.py::test_interleaved_unequal_chunks_explained``).
"""

from __future__ import annotations

import argparse
import contextlib
import time
from dataclasses import dataclass
from itertools import product

import numpy as np

from pipette_cp.cost.evaluator.evaluate import Evaluator, num_micro_batches, placement_array
from pipette_cp.cost.evaluator.layout_rules import flow_template
from pipette_cp.errors import InfeasibleError, LayoutError
from pipette_cp.io.instance_file import list_instances, load_instance
from pipette_cp.specs import Instance, Plan, Recompute
from pipette_cp.specs.layouts import even_split, make_plan
from pipette_cp.specs.selection import gpu_totals

#: Classes of the summary, in print order.
CLASSES = ("default", "unbalanced", "interleaved", "interleaved-unbalanced")

#: Fraction of a middle stage's layers moved to the first or the last stage.
UNBALANCE = 0.25


@dataclass(frozen=True)
class Case:
    """One plan timed by both predictors."""

    instance: str
    variant: (
        str  # default, pipelined, unbalanced-first/-last, interleaved, interleaved-unbalanced-...
    )
    layout: str
    layer_split: tuple[int, ...]
    analytic_s: float
    simulator_s: float

    @property
    def kind(self) -> str:
        """Summary class (:data:`CLASSES`): the variant without the side the layers
        moved to; the pipelined layout counts as a default."""
        kind = self.variant.removesuffix("-first").removesuffix("-last")
        return "default" if kind == "pipelined" else kind

    @property
    def difference(self) -> float:
        """(analytic - simulator) / simulator: negative when the analytic model is low."""
        return (self.analytic_s - self.simulator_s) / self.simulator_s


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def avoid_failed_links(instance: Instance, plan: Plan, seed: int = 0) -> Plan:
    """``plan`` with its nodes relabelled so that no transfer (pipeline hop, including
    the interleaved last -> first one, DP ring link, embedding pair) crosses a failed
    node pair: a seeded local search over node permutations (swap a node of a
    conflicting pair with a random node, keep the swap unless conflicts grow).
    Returns ``plan`` itself when it has no conflict; raises :class:`InfeasibleError`
    when the search gives up.
    """
    cluster, g = instance.cluster, instance.cluster.gpus_per_node
    nodes = cluster.num_nodes
    failed: np.ndarray = np.asarray(cluster.matrix) <= 0
    np.fill_diagonal(failed, False)
    bad = np.asarray(failed.reshape(nodes, g, nodes, g).any(axis=(1, 3)))
    if not bad.any():
        return plan
    bad |= bad.T
    tied = instance.model.tied_embeddings and plan.pp > 1
    flows = flow_template(plan.pp, plan.replicas, plan.tp, 2 if plan.pp > 1 else 1, tied, nodes)
    node = placement_array(plan).ravel() // g
    pairs = np.unique(np.stack((node[flows.src], node[flows.dst]), axis=1), axis=0)
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    rng, perm = np.random.default_rng(seed), np.arange(nodes)
    conflicts = bad[perm[pairs[:, 0]], perm[pairs[:, 1]]]
    if not conflicts.any():
        return plan
    for _ in range(200 * nodes):
        a = pairs[rng.choice(np.flatnonzero(conflicts)), rng.integers(2)]
        b = rng.integers(nodes)
        perm[[a, b]] = perm[[b, a]]
        after = bad[perm[pairs[:, 0]], perm[pairs[:, 1]]]
        if after.sum() > conflicts.sum():
            perm[[a, b]] = perm[[b, a]]  # undo
            continue
        conflicts = after
        if not conflicts.any():
            gpus = placement_array(plan)
            gpus = perm[gpus // g] * g + gpus % g
            placement = tuple(tuple(int(x) for x in unit) for unit in gpus.reshape(-1, plan.tp))
            return plan.model_copy(update={"placement": placement})
    raise InfeasibleError(f"no node order of {plan.layout()} avoids the failed links")


def default_layout(instance: Instance, evaluator: Evaluator | None = None, min_pp: int = 1) -> Plan:
    """A plain Megatron layout that runs and fits in memory.

    ``tp`` is the largest of 8, 4, 2, 1 that divides the attention and key/value
    heads and the GPUs per node; ``pp`` the smallest divisor of ``gpus / tp`` (at
    least ``min_pp``, at most the layer count) whose plan fits in memory; ``dp`` the
    rest; micro-batch 1, no interleaving, an even split and Megatron's placement
    with its nodes relabelled around failed links (:func:`avoid_failed_links`).
    A layout whose ``dp`` does not divide the global batch is skipped; if none
    fits, smaller ``tp``, then selective and full recomputation are tried, then
    (where the search space allows it) layouts that leave whole nodes idle.
    Raises :class:`LayoutError` when nothing works.
    """
    model, cluster = instance.model, instance.cluster
    evaluator = evaluator or Evaluator(instance)
    gbs = instance.training.global_batch_size
    tps = [t for t in (8, 4, 2, 1) if not (model.num_attention_heads % t or model.kv_heads % t)]
    tps = [t for t in tps if cluster.gpus_per_node % t == 0]
    totals = gpu_totals(cluster, instance.search_space)  # every GPU first, then nodes idle
    recomputes: tuple[Recompute, ...] = ("none", "selective", "full")
    for n, recompute, tp in product(totals, recomputes, tps):
        if n % tp == 0:
            for pp in _divisors(n // tp):
                dp = n // (tp * pp)
                if not min_pp <= pp <= model.num_layers or gbs % dp:
                    continue
                # experts: the widest expert parallelism first (ep divides dp with etp = tp)
                eps = [e for e in _divisors(model.num_experts)[::-1] if dp % e == 0]
                for ep in eps if model.is_moe else [1]:
                    plan = make_plan(num_layers=model.num_layers, dp=dp, pp=pp, tp=tp, ep=ep,
                                     micro_batch_size=1, recompute=recompute,
                                     sequence_parallel=model.is_moe and tp > 1)  # fmt: skip
                    try:
                        plan = avoid_failed_links(instance, plan)
                        if evaluator.evaluate(plan).fits:
                            return plan
                    except (LayoutError, InfeasibleError):
                        continue
    raise LayoutError("plan", instance.name, "no default layout fits in memory")


def unbalanced_split(
    split: tuple[int, ...], to: str, fraction: float = UNBALANCE
) -> tuple[int, ...]:
    """``split`` with ``fraction`` of its middle chunk's layers (at least one) moved to
    the first (``to="first"``) or the last (``to="last"``) chunk.

    >>> unbalanced_split((8, 8, 8, 8), "first")
    (10, 8, 6, 8)
    >>> unbalanced_split((8, 8, 8, 8), "last")
    (8, 8, 6, 10)
    """
    out = list(split)
    middle, target = len(out) // 2, 0 if to == "first" else len(out) - 1
    moved = max(1, round(fraction * out[middle]))
    out[middle], out[target] = out[middle] - moved, out[target] + moved
    return tuple(out)


def variants(instance: Instance, plan: Plan) -> dict[str, Plan]:
    """Unbalanced splits and interleaved (``vpp=2``) versions of ``plan``, as far as
    its layout allows them: a middle chunk of >= 2 layers that is not the target;
    ``pp > 1`` dividing the micro-batches and ``2 pp <= layers`` to interleave."""
    layers, pp = instance.model.num_layers, plan.pp
    bases, out = [("", plan)], {}
    if pp > 1 and 2 * pp <= layers and num_micro_batches(instance, plan) % pp == 0:
        split = even_split(layers, pp, 2)
        out["interleaved"] = plan.model_copy(update={"vpp": 2, "layer_split": split})
        bases.append(("interleaved-", out["interleaved"]))
    for prefix, base in bases:
        split = base.layer_split
        for to in ("first", "last"):
            middle, target = len(split) // 2, 0 if to == "first" else len(split) - 1
            if len(split) > 1 and middle != target and split[middle] >= 2:
                update = {"layer_split": unbalanced_split(split, to)}
                out[f"{prefix}unbalanced-{to}"] = base.model_copy(update=update)
    return out


def compare(name: str, instance: Instance | None = None) -> list[Case]:
    """The default layout of ``name`` and its :func:`variants`, timed by both predictors.

    When the default layout has one stage, the variants derive from the smallest
    pipelined one (``"pipelined"``, reported with the defaults).
    """
    instance = instance or load_instance(name)
    evaluator = Evaluator(instance)
    plans = {"default": default_layout(instance, evaluator)}
    base = plans["default"]
    if base.pp == 1:
        with contextlib.suppress(LayoutError):  # no pipelined layout: defaults only
            base = plans["pipelined"] = default_layout(instance, evaluator, min_pp=2)
    plans.update(variants(instance, base))
    cases = []
    for variant, plan in plans.items():
        analytic = evaluator.evaluate(plan).iteration_time_s
        simulated = evaluator.evaluate(plan, "simulator").iteration_time_s
        cases.append(Case(name, variant, plan.layout(), plan.layer_split, analytic, simulated))
    return cases


def format_table(cases: list[Case]) -> str:
    """The table of every case, then the largest |difference| per class."""
    head = f"{'instance':28s} {'variant':28s} {'layout':22s} {'analytic s':>11s} {'simulator s':>11s} {'diff %':>7s}"
    lines = [head, "-" * len(head)]
    for c in cases:
        lines.append(f"{c.instance:28s} {c.variant:28s} {c.layout:22s} {c.analytic_s:11.4f} "
                     f"{c.simulator_s:11.4f} {100 * c.difference:7.3f}")  # fmt: skip
    lines.append("-" * len(head))
    for kind in CLASSES:
        of_kind = [c for c in cases if c.kind == kind]
        if of_kind:
            worst = max(of_kind, key=lambda c: abs(c.difference))
            lines.append(f"max |diff| {kind:24s}: {100 * abs(worst.difference):6.3f} % "
                         f"({worst.instance}, {worst.variant}; {len(of_kind)} cases)")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Print the agreement table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("instances", nargs="*", help="instance names (default: all bundled)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    cases = [case for name in args.instances or list_instances() for case in compare(name)]
    print(format_table(cases))
    print(f"{len(cases)} cases in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
