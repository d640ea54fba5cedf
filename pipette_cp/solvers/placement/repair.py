"""Placement repair: tensor groups moved off degraded and failed links.

For clusters too large for the exact masters, and for heuristic plans that cross a
failed pair.  Start from the plan's own placement (Megatron's rank order on the
preferred nodes), then swap tensor groups between positions (of one stage, or of two)
so that the data-parallel ring links (position ``r`` to ``r + 1``, per tensor rank)
and the pipeline hops (stage ``s`` to ``s + 1`` at one position, and the last stage
to the first with interleaving or tied embeddings) leave the slow pairs: on a
:class:`~pipette_cp.specs.hierarchy.HierarchicalFabric` its degraded or failed node
and GPU pairs, on a dense matrix the pairs well below the median of their kind.  A
link's *excess* is ``1 / bandwidth - 1 / nominal``, its time per byte over what its
switch level gives without exceptions (dense: over the median pair inside a node, or
between two nodes); a failed link counts :data:`FAILED_EXCESS`.  A swap is kept when
it lowers the summed excess of the links it touches.  Memory is O(units) and every
swap reads a handful of links, so a 100,000-GPU plan is repaired in seconds; the
evaluator has the last word (the repaired placement is returned only if it is at
least as fast, or if the start crosses a failed pair and the repair does not).  The
swaps start from the links more than :data:`SLOW_SHARE` below their nominal.  Slow
NICs are not movable by these swaps (a node's links all slow down wherever it sits):
the node preference of the search leaves them idle where a layout does not need
every node.

Scope: tensor groups inside one node (``tp <= gpus_per_node``, one NVLink domain per
node), no context parallelism and no experts (their groups cut across positions);
other plans come back unchanged.
"""

from __future__ import annotations

import numpy as np

from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.cost.evaluator.layout_rules import placement_array
from pipette_cp.errors import PipetteError
from pipette_cp.specs import ClusterSpec, Instance, Plan

#: Excess of a failed link (s/byte): above any degraded one.
FAILED_EXCESS = 1.0

#: A link this share below its nominal (or failed) is one to move off.
SLOW_SHARE = 0.1

#: Swap partners tried per such link, and passes over all of them.
TRIES = 24
PASSES = 3


def repairable(instance: Instance, plan: Plan) -> bool:
    """Whether :func:`repair_placement` can move ``plan``'s tensor groups."""
    c = instance.cluster
    return (plan.tp <= c.gpus_per_node and plan.cp == 1 and not instance.model.is_moe
            and c.nodes_per_nvlink_domain == 1 and plan.replicas > 1)  # fmt: skip


def _typical(cluster: ClusterSpec, samples: int = 4096) -> tuple[float, float]:
    """The median working GPU pair inside a node and between two nodes of a dense
    cluster (from a seeded sample of pairs), bytes/s."""
    rng = np.random.default_rng(0)
    n, g = cluster.num_gpus, cluster.gpus_per_node
    src = rng.integers(0, n, samples)
    out: list[float] = []
    for dst in ((src // g) * g + rng.integers(0, g, samples), rng.integers(0, n, samples)):
        bw = cluster.links[src, dst]
        cross = src // g != dst // g
        keep = (bw > 0) & (src != dst) & (cross if len(out) else ~cross)
        out.append(float(np.median(bw[keep])) if keep.any() else 1.0)
    return out[0], out[1]


class _Links:
    """Excess of unit-to-unit links (the slowest of the ``tp`` rank-to-rank flows) over
    the nominal: a fabric's level bandwidth, or, on a dense matrix, the median pair
    inside a node or between two nodes."""

    def __init__(self, cluster: ClusterSpec) -> None:
        self.cluster, self.fabric = cluster, cluster.fabric
        self.level_bw = self.fabric._tables()["level_bw"] if self.fabric is not None else np.ones(1)
        self.typical = _typical(cluster) if self.fabric is None else (0.0, 0.0)

    def excess(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Per pair of unit GPU arrays ``a[i], b[i]`` (..., tp), the excess, s/byte."""
        return self.measure(a, b)[0]

    def measure(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The excess, and whether the link is worth moving: failed, or more than
        :data:`SLOW_SHARE` below its nominal."""
        f, g = self.fabric, self.cluster.gpus_per_node
        if f is not None:
            bw = f.bandwidth(a, b).min(axis=-1)
            level = f.level_of(a[..., 0], b[..., 0])
            nominal = np.where(level < 0, f.nvlink_bandwidth_bytes_per_s,
                               self.level_bw[np.maximum(level, 0)])  # fmt: skip
        else:
            bw = self.cluster.links[a, b].min(axis=-1)
            nominal = np.where(a[..., 0] // g == b[..., 0] // g, *self.typical)
        with np.errstate(divide="ignore"):
            out = np.where(bw > 0, 1.0 / bw - 1.0 / nominal, FAILED_EXCESS)
        return np.maximum(out, 0.0), bw < (1.0 - SLOW_SHARE) * nominal


def _touched(s: int, r: int, pp: int, dp: int, wrap: bool) -> list[tuple[int, int, int, int]]:
    """The links (stage, position) -> (stage, position) that position ``r`` of stage ``s``
    takes part in: its two ring neighbours and its pipeline hops."""
    out = [(s, (r - 1) % dp, s, r), (s, r, s, (r + 1) % dp)]
    if s > 0 or wrap:
        out.append(((s - 1) % pp, r, s, r))
    if s < pp - 1 or wrap:
        out.append((s, r, (s + 1) % pp, r))
    return out


def _excess_of(links: _Links, units: np.ndarray, touched: list) -> float:
    if not touched:
        return 0.0
    idx = np.array(touched, dtype=np.int64)
    a, b = units[idx[:, 0], idx[:, 1]], units[idx[:, 2], idx[:, 3]]
    # a hop carries activations one way and their gradients back: both directions count
    hop = idx[:, 0] != idx[:, 2]
    there = links.excess(a, b)
    back = links.excess(b, a)
    return float(there.sum() + back[hop].sum())


def all_links(plan: Plan, wrap: bool) -> np.ndarray:
    """Every ring link and hop of ``plan`` as (stage, position, stage, position) rows."""
    pp, dp = plan.pp, plan.replicas
    s, r = np.meshgrid(np.arange(pp), np.arange(dp), indexing="ij")
    ring = np.stack([s, r, s, (r + 1) % dp], axis=-1).reshape(-1, 4)
    last = pp if wrap else pp - 1
    hs, hr = np.meshgrid(np.arange(last), np.arange(dp), indexing="ij")
    hops = np.stack([hs, hr, (hs + 1) % pp, hr], axis=-1).reshape(-1, 4)
    return np.concatenate((ring, hops)) if pp > 1 else ring


def _swap(units: np.ndarray, s: int, r: int, s2: int, r2: int) -> None:
    units[s, r], units[s2, r2] = units[s2, r2].copy(), units[s, r].copy()


def _wraps(instance: Instance, plan: Plan) -> bool:
    """Whether the last stage talks to the first: interleaved chunks hop around, and
    tied embeddings all-reduce their gradient between the two."""
    return plan.pp > 1 and (plan.vpp > 1 or instance.model.tied_embeddings)


def placement_excess(instance: Instance, plan: Plan) -> float:
    """The summed excess of ``plan``'s ring links and hops as it stands (what
    :func:`repair_units` reports as "before")."""
    rows = all_links(plan, _wraps(instance, plan))
    return _excess_of(_Links(instance.cluster), placement_array(plan), rows.tolist())


def repair_units(instance: Instance, plan: Plan, seed: int = 0) -> tuple[np.ndarray, float, float]:
    """The swapped units (pp, replicas, tp) and the summed excess before and after."""
    links = _Links(instance.cluster)
    units = placement_array(plan).copy()
    pp, dp = plan.pp, plan.replicas
    wrap = _wraps(instance, plan)
    rng = np.random.default_rng(seed)
    rows = all_links(plan, wrap)
    homogeneous = instance.cluster.is_homogeneous

    def total() -> tuple[float, np.ndarray]:
        a, b = units[rows[:, 0], rows[:, 1]], units[rows[:, 2], rows[:, 3]]
        (there, slow), (back, slow_back) = links.measure(a, b), links.measure(b, a)
        hop = rows[:, 0] != rows[:, 2]
        e = there + np.where(hop, back, 0.0)
        return float(e.sum()), slow | (hop & slow_back)

    before, flagged = total()
    for _ in range(PASSES):
        bad = rows[flagged]
        if not len(bad):
            break
        moved = False
        for row in bad[rng.permutation(len(bad))]:
            s, r = (int(row[0]), int(row[1])) if rng.random() < 0.5 else (int(row[2]), int(row[3]))
            # across stages only where every GPU is alike (a stage's memory and compute
            # then do not depend on where it sits)
            across = (rng.random(TRIES) >= 0.5) & homogeneous
            stages = np.where(across, rng.integers(0, pp, TRIES), s)
            for s2, r2 in zip(stages.tolist(), rng.integers(0, dp, TRIES).tolist(), strict=True):
                if (s2, r2) == (s, r):
                    continue
                touched = list(dict.fromkeys(_touched(s, r, pp, dp, wrap)
                                             + _touched(s2, r2, pp, dp, wrap)))  # fmt: skip
                old = _excess_of(links, units, touched)
                _swap(units, s, r, s2, r2)
                if _excess_of(links, units, touched) < old - 1e-18:
                    moved = True
                    break
                _swap(units, s, r, s2, r2)  # undo
        _, flagged = total()
        if not moved:
            break
    after, _ = total()
    return units, before, after


def repair_placement(
    instance: Instance, plan: Plan, evaluator: Evaluator | None = None, seed: int = 0
) -> Plan:
    """``plan`` with its tensor groups moved off the fabric's exceptions (see the module
    docstring); ``plan`` itself when nothing moved or the evaluator finds it no faster."""
    if not repairable(instance, plan):
        return plan
    units, before, after = repair_units(instance, plan, seed)
    if after >= before:
        return plan
    placement = tuple(tuple(int(g) for g in unit) for unit in units.reshape(-1, plan.tp))
    moved = plan.model_copy(update={"placement": placement, "evaluation": None})
    ev = evaluator or Evaluator(instance, validate=False)
    try:
        mine = ev.iteration_time(moved)
    except PipetteError:  # still over a failed link
        return plan
    try:
        return moved if mine <= ev.iteration_time(plan) else plan
    except PipetteError:  # the start crossed a failed link: the repair avoids it
        return moved
