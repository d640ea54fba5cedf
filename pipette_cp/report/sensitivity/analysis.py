"""Which links and nodes a plan depends on: the iteration-time increase when one GPU
pair, one node's NIC or one node's NVLink loses bandwidth.

Every perturbation multiplies some entries of the cluster's bandwidth matrix by
``factor`` (both directions), builds a new :class:`ClusterSpec` and
scores the unchanged plan with a fresh analytic
:class:`~pipette_cp.cost.evaluator.evaluate.Evaluator` (nothing is cached across clusters).
Only the pairs the plan communicates over are perturbed one by one: the
checker's :func:`~pipette_cp.checker.communication_pairs` plus the links of the
two-level (hierarchical) DP all-reduce that the evaluator may pick instead of
the ring; any other pair cannot change the prediction.  Above ``max_pairs``
such pairs the links are grouped by node pair (every GPU pair between two nodes
scaled at once).  A node's NIC is modelled as all inter-node links from and to
its GPUs (the NIC-sharing cap of the cost model is one cluster-wide constant),
its NVLink as all links inside it.

The links a plan uses and the scaled clusters live in
:mod:`pipette_cp.report.sensitivity.links`; rendering (tables, JSON, figure) in
:mod:`pipette_cp.report.sensitivity.view`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.errors import SpecError
from pipette_cp.report.sensitivity.links import node_masks, pair_mask, plan_links, scaled_instance
from pipette_cp.specs import ClusterSpec, Evaluation, Instance, Plan
from pipette_cp.specs.knobs import plan_key

__all__ = [
    "MATTERS_PCT",
    "Headroom",
    "Impact",
    "LinkSensitivity",
    "NodeSensitivity",
    "SensitivityReport",
    "plan_links",
    "scaled_instance",
    "sensitivity",
]

#: An increase above this share of the iteration time "matters", %.
MATTERS_PCT = 1.0
#: Relative increase below which a link or node counts as not depended on.
_ZERO_REL = 1e-9
#: Bisection steps of the headroom search (factor resolution 2**-30).
_BISECT_STEPS = 30

Granularity = Literal["gpu", "node"]


@dataclass(frozen=True)
class Impact:
    """The plan's predicted iteration time with a perturbed cluster, and what grew."""

    time_s: float
    increase_s: float
    increase_pct: float
    cause: str  # the TimeBreakdown cause that grows most; "" when nothing grows

    @property
    def is_zero(self) -> bool:
        return self.increase_s <= _ZERO_REL * max(self.time_s - self.increase_s, 1e-30)


@dataclass(frozen=True)
class LinkSensitivity:
    """One GPU pair (``gpus``, ``a < b``) or, grouped by node, one node pair
    (``gpus`` None), scaled in both directions."""

    nodes: tuple[int, int]
    gpus: tuple[int, int] | None
    bandwidth_bytes_per_s: float  # a -> b (mean over the healthy GPU pairs for a node pair)
    reverse_bandwidth_bytes_per_s: float  # b -> a
    traffic: tuple[str, ...]  # pp, dp, tp, embedding: what the plan sends over it
    impact: Impact


@dataclass(frozen=True)
class NodeSensitivity:
    """One node of the plan: its NIC (inter-node links) and its NVLink (intra-node) scaled."""

    node: int
    name: str
    nic: Impact
    nvlink: Impact

    @property
    def increase_s(self) -> float:
        return max(self.nic.increase_s, self.nvlink.increase_s)


@dataclass(frozen=True)
class Headroom:
    """For the most critical link: the bandwidth below which another plan is faster."""

    link: LinkSensitivity
    factor: float | None  # bandwidth multiplier at the switch; None: no switch found
    bandwidth_bytes_per_s: float | None  # ``factor`` x the link's bandwidth (a -> b)
    overtaken_by: str  # layout of the plan that becomes faster ("" if none)
    note: str


@dataclass(frozen=True)
class SensitivityReport:
    """Everything :func:`sensitivity` found, sorted by increase (largest first)."""

    instance: str
    layout: str
    node_names: tuple[str, ...]  # of every node of the cluster
    factor: float
    base: Evaluation
    granularity: Granularity
    links: tuple[LinkSensitivity, ...]  # the top links
    nodes: tuple[NodeSensitivity, ...]  # the top nodes
    num_links: int  # communicating GPU pairs (or node pairs) evaluated
    num_links_matter: int  # of which the increase exceeds MATTERS_PCT
    num_links_zero: int  # of which the increase is ~0
    num_nodes: int  # nodes holding a GPU of the plan
    num_nodes_zero: int  # of which neither NIC nor NVLink matters at all
    headroom: Headroom | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)


class _Scorer:
    """The plan's evaluation on perturbed copies of one instance."""

    def __init__(self, instance: Instance, plan: Plan, factor: float) -> None:
        self.instance, self.plan, self.factor = instance, plan, factor
        self.base = Evaluator(instance).evaluate(plan)  # validates the plan (LayoutError)

    def times_with(self, mask: np.ndarray, factor: float, plans: Sequence[Plan]) -> list[float]:
        """Iteration times of ``plans`` with the ``mask`` links at ``factor``."""
        evaluator = Evaluator(scaled_instance(self.instance, mask, factor))
        return [evaluator.iteration_time(p) for p in plans]

    def impact(self, mask: np.ndarray) -> Impact:
        """The plan with the ``mask`` links at :attr:`factor`."""
        base = self.base
        if not mask.any():
            return Impact(base.iteration_time_s, 0.0, 0.0, "")
        ev = Evaluator(scaled_instance(self.instance, mask, self.factor)).evaluate(self.plan)
        increase = ev.iteration_time_s - base.iteration_time_s
        before = dict(base.breakdown_s.items())
        grown = {k: seconds - before[k] for k, seconds in ev.breakdown_s.items()}
        cause = max(grown, key=grown.__getitem__)  # the first of equals, in field order
        pct = 100.0 * increase / base.iteration_time_s
        impact = Impact(ev.iteration_time_s, increase, pct, cause)
        return impact if grown[cause] > 0 and not impact.is_zero else replace(impact, cause="")


# ----------------------------------------------------------------------- the report
def sensitivity(
    instance: Instance,
    plan: Plan,
    *,
    factor: float = 0.5,
    top: int = 10,
    max_pairs: int = 300,
    alternatives: Sequence[Plan] = (),
) -> SensitivityReport:
    """How much ``plan``'s analytic iteration time grows when each link it uses, each
    node's NIC and each node's NVLink keeps only ``factor`` of its bandwidth.

    Parameters
    ----------
    instance, plan
        The plan must be valid on the instance (:class:`~pipette_cp.errors.LayoutError`
        otherwise, e.g. when it needs more GPUs than the cluster has).
    factor
        Bandwidth multiplier in (0, 1); 0.5 = "if it halves".
    top
        Links and nodes kept in the report (the counts cover all of them).
    max_pairs
        Above this many communicating GPU pairs, node pairs are scaled instead.
    alternatives
        Other plans of the same instance: if given, the report's ``headroom`` is
        the bandwidth of the most critical link below which one of them is faster.

    Examples
    --------
    >>> from pipette_cp.io.instance_file import load_instance
    >>> from pipette_cp.specs.layouts import make_plan
    >>> inst = load_instance("gpt3-1.3b-nominal-8")
    >>> plan = make_plan(num_layers=24, dp=4, pp=2, tp=1, micro_batch_size=1)
    >>> report = sensitivity(inst, plan, top=3)
    >>> report.links[0].impact.increase_s >= report.links[-1].impact.increase_s >= 0
    True
    """
    if not 0.0 < factor < 1.0:
        raise SpecError("factor", factor, "a bandwidth multiplier in (0, 1), e.g. 0.5 = halved")
    if top < 1:
        raise SpecError("top", top, "must be at least 1")
    scorer = _Scorer(instance, plan, factor)
    cluster = instance.cluster
    links = plan_links(instance, plan)
    notes: list[str] = []
    granularity: Granularity = "gpu"
    if len(links) > max_pairs:
        granularity = "node"
        notes.append(
            f"{len(links)} communicating GPU pairs > {max_pairs}: every link between two "
            "nodes scaled at once; links inside a node are covered by the NVLink column"
        )
        results = _node_pair_links(scorer, links)
    else:
        results = _gpu_links(scorer, links)
    results.sort(key=lambda r: (-r.impact.increase_s, r.nodes, r.gpus or (0, 0)))
    used_nodes = sorted({cluster.node_of(g) for unit in plan.placement for g in unit})
    nodes = []
    for node in used_nodes:
        nic, nvlink = node_masks(cluster, node)
        nodes.append(
            NodeSensitivity(
                node, cluster.node_names[node], scorer.impact(nic), scorer.impact(nvlink)
            )
        )
    nodes.sort(key=lambda r: (-r.increase_s, r.node))
    notes.append(
        "a node's NIC = every inter-node link from and to its GPUs (the cost model's "
        "NIC-sharing cap is cluster-wide and is not scaled)"
    )
    headroom = _headroom(scorer, results[0], alternatives) if alternatives and results else None
    base_t = scorer.base.iteration_time_s
    return SensitivityReport(
        instance=instance.name,
        layout=plan.layout(),
        node_names=cluster.node_names,
        factor=factor,
        base=scorer.base,
        granularity=granularity,
        links=tuple(results[:top]),
        nodes=tuple(nodes[:top]),
        num_links=len(results),
        num_links_matter=sum(r.impact.increase_s > MATTERS_PCT / 100 * base_t for r in results),
        num_links_zero=sum(r.impact.is_zero for r in results),
        num_nodes=len(nodes),
        num_nodes_zero=sum(n.nic.is_zero and n.nvlink.is_zero for n in nodes),
        headroom=headroom,
        notes=tuple(notes),
    )


def _gpu_links(
    scorer: _Scorer, links: dict[tuple[int, int], tuple[str, ...]]
) -> list[LinkSensitivity]:
    cluster = scorer.instance.cluster
    bw, n = cluster.matrix, cluster.num_gpus
    return [
        LinkSensitivity(
            nodes=(cluster.node_of(a), cluster.node_of(b)),
            gpus=(a, b),
            bandwidth_bytes_per_s=float(bw[a, b]),
            reverse_bandwidth_bytes_per_s=float(bw[b, a]),
            traffic=kinds,
            impact=scorer.impact(pair_mask(n, [(a, b)])),
        )
        for (a, b), kinds in links.items()
    ]


def _node_pair_links(
    scorer: _Scorer, links: dict[tuple[int, int], tuple[str, ...]]
) -> list[LinkSensitivity]:
    cluster = scorer.instance.cluster
    by_nodes: dict[tuple[int, int], set[str]] = {}
    for (a, b), kinds in links.items():
        na, nb = cluster.node_of(a), cluster.node_of(b)
        if na != nb:
            by_nodes.setdefault((min(na, nb), max(na, nb)), set()).update(kinds)
    node_bw = cluster.node_matrix()
    order = ("pp", "dp", "tp", "embedding")
    out = []
    for (na, nb), found in sorted(by_nodes.items()):
        rows = np.zeros(cluster.num_gpus, dtype=bool)
        cols = np.zeros(cluster.num_gpus, dtype=bool)
        rows[list(cluster.gpus_of_node(na))] = True
        cols[list(cluster.gpus_of_node(nb))] = True
        mask = (rows[:, None] & cols[None, :]) | (cols[:, None] & rows[None, :])
        out.append(
            LinkSensitivity(
                nodes=(na, nb),
                gpus=None,
                bandwidth_bytes_per_s=float(node_bw[na, nb]),
                reverse_bandwidth_bytes_per_s=float(node_bw[nb, na]),
                traffic=tuple(k for k in order if k in found),
                impact=scorer.impact(mask),
            )
        )
    return out


def _link_mask(cluster: ClusterSpec, link: LinkSensitivity) -> np.ndarray:
    """The GPU pairs :func:`sensitivity` scaled for ``link``."""
    if link.gpus is not None:
        return pair_mask(cluster.num_gpus, [link.gpus])
    gpus = np.arange(cluster.num_gpus)
    first, second = (np.isin(gpus, list(cluster.gpus_of_node(k))) for k in link.nodes)
    return (first[:, None] & second[None, :]) | (second[:, None] & first[None, :])


def _headroom(scorer: _Scorer, link: LinkSensitivity, alternatives: Sequence[Plan]) -> Headroom:
    """Bisect the largest bandwidth multiplier of ``link`` at which an alternative plan is
    faster than the plan (every plan scored on the same scaled cluster)."""
    mask = _link_mask(scorer.instance.cluster, link)
    mine = plan_key(scorer.plan)  # the same plan, whatever its evaluation or provenance
    others = [p for p in alternatives if plan_key(p) != mine]
    if not others:
        return Headroom(link, None, None, "", "no other plan given")

    def overtaken(f: float) -> tuple[bool, str]:
        own, *times = scorer.times_with(mask, f, [scorer.plan, *others])
        best = min(range(len(others)), key=lambda i: (times[i], i))
        return times[best] < own, others[best].layout()

    lost, name = overtaken(1.0)
    if lost:
        return Headroom(link, None, None, name, f"{name} is faster already")
    floor = 1e-3
    lost, name = overtaken(floor)
    if not lost:
        note = f"still the fastest of {len(others) + 1} plans at {floor:g}x the bandwidth"
        return Headroom(link, None, None, "", note)
    hi, lo = 1.0, floor  # the plan is the fastest at hi, overtaken at lo
    for _ in range(_BISECT_STEPS):
        mid = (hi + lo) / 2
        lost, found = overtaken(mid)
        if lost:
            lo, name = mid, found
        else:
            hi = mid
    bandwidth = lo * link.bandwidth_bytes_per_s
    return Headroom(link, lo, bandwidth, name, f"below {lo:.3g}x the bandwidth {name} is faster")
