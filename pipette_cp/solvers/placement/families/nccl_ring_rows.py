"""Rows of a ring as NCCL builds it from its ranks' order, for the placement masters.

NCCL does not run a data-parallel ring in rank order: it visits the nodes in the order
of their first rank, each node's ranks together, and closes from the last node back to
the first (:mod:`pipette_cp.cost.network.nccl_rings`).  For a ring over units
``u_0 .. u_{D-1}`` (rank order), with ``y[r, n]`` = unit ``u_r`` on node ``n`` (a sum of
place literals), the rows here write that ring exactly:

- ``seen[r, n]`` (0/1): some unit ``u_0 .. u_r`` is on ``n`` (``seen[r] >= seen[r-1]``,
  ``seen[r] >= y[r]``, ``seen[r] <= seen[r-1] + y[r]``);
- ``first[r, n]`` (0/1) = ``seen[r, n] - seen[r-1, n]``: ``n`` first appears at rank ``r``;
- ``latest[r, n]`` (0/1): ``n`` is the node that appeared last among ranks ``0 .. r``
  (``latest[r] >= first[r]``, ``latest[r, n] >= latest[r-1, n] - sum_m first[r, m]``,
  one node per rank);
- the ring's links: ``latest[r-1, n]`` and ``first[r, m]`` join ``n -> m`` (for each
  rank ``r``: ``latest[r-1, n] => T >= sum_m c[n, m] first[r, m]``); the last node to
  appear closes to unit 0's (``latest[D-1, n] => T >= sum_m c[n, m] y[0, m]``); a unit
  whose node appeared before it has a link inside that node
  (``T >= sum_n c[n, n] (y[r, n] - first[r, n])``); a failed node pair forbids its link;
- ``cross``: the ring leaves a node (``cross >= y[0, n] - y[r, n]``);
- NIC shares: a link ``n -> m`` between NVLink domains is a flow per tensor rank out of
  ``n``'s NICs and into ``m``'s (flags ``latest[r-1, n] and first[r, m]``, and the
  closing link's); a ring's input is at least ``bytes tp / NIC capacity x`` the flows
  of its concurrency group through a node where it has one.

The costs ``c[n, m]`` are the places' pair costs, which on node places are the nodes'
(every GPU pair of two nodes alike), as they are where each node holds one place.  On
several tensor-group slots of a node the rows take each node pair's cheapest places: a
bound, not the Evaluator's price (:func:`ring_rows_exact`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipette_cp.solvers.placement.data import MasterView, PlacementData
from pipette_cp.solvers.placement.families.rows import any_of, const, nodes_of

#: A ring: (its input's position in ``x``, its crossing indicator's or None, its units
#: in rank order, its bytes per unit of inverse bandwidth)
Ring = tuple[int, int | None, list[int], float]


def ring_rows_exact(data: PlacementData) -> bool:
    """Whether the rows price a ring as the Evaluator does: on node places, or where each
    node holds one place (a tensor group as wide as the node); on several tensor-group
    slots of a node they bound it."""
    return bool(data.node_level) or len(set(data.place_node.tolist())) == len(data.place_node)


def node_costs(data: PlacementData) -> np.ndarray:
    """Inverse bandwidth of one flow between each node pair: the places' own on node
    places, else the cheapest pair of places (the diagonal: inside the node)."""
    nodes = data.instance.cluster.num_nodes
    out = np.full((nodes, nodes), np.inf)
    inv = np.array(data.inv_bw, dtype=float)
    lone = np.flatnonzero(np.asarray(data.capacity) < 2)
    inv[lone, lone] = np.inf  # one unit on the place: no link inside it
    pn = np.asarray(data.place_node)
    np.minimum.at(out, (pn[:, None], pn[None, :]), inv)
    return out


def nccl_ring_rows(m: MasterView, family: str, rings: list[Ring], group: list[int]) -> None:
    """The rows of every ring (module docstring); ``group[k]``: ring ``k``'s NIC
    concurrency group (rings of one group share the NICs of the nodes they use)."""
    d = m.data
    cost = d.memo.get("nccl node costs")
    if cost is None:
        cost = d.memo["nccl node costs"] = node_costs(d)
    # per ring, per node: literals of its flows out of (into) the node through the NICs
    nics: dict[int, tuple[dict[int, Any], dict[int, Any]]] = {}
    for k, (i, cross, units, coef) in enumerate(rings):
        if len(units) >= 2:
            nics[k] = _one_ring(m, f"{family}_{k}", m.xvar[i], cross, units, coef * cost)
    per_count = d.plan.tp / d.nic_capacity
    for way in (0, 1):
        nodes = {n for flags in nics.values() for n in flags[way]}
        for n in sorted(nodes):
            for k, (i, _, _, coef) in enumerate(rings):
                mine = nics.get(k, ({}, {}))[way].get(n, 0)
                if const(mine) and not mine:
                    continue
                peers = [nics[j][way][n] for j in nics if group[j] == group[k]
                         and not (const(f := nics[j][way].get(n, 0)) and not f)]  # fmt: skip
                if len(peers) < 2:
                    continue  # its flow alone: its share is in the pair costs
                free = [(coef * per_count, f) for f in peers if not const(f)]
                fixed = coef * per_count * sum(int(f) for f in peers if const(f))
                when = None if const(mine) else mine
                m.b.add_time_bound(m.xvar[i], free, fixed, when, f"{family}_nic_{way}_{k}_{n}")


# ------------------------------------------------------------------ internals
def _one_ring(
    m: MasterView, tag: str, var: Any, cross: int | None, units: list[int], cost: np.ndarray
) -> tuple[dict[int, Any], dict[int, Any]]:
    """One ring's rows; returns, per node, 0/1 literals at least its flow out of (into)
    the node through the NICs (to or from another NVLink domain)."""
    b = m.b
    on = [nodes_of(m, u) for u in units]
    nodes = sorted({n for per in on for n in per})
    y = [{n: per.get(n, []) for n in nodes} for per in on]
    dom = m.domain_of_node
    far = {n: [k for k in nodes if dom[k] != dom[n]] for n in nodes}
    out: dict[int, list[Any]] = {n: [] for n in nodes}
    into: dict[int, list[Any]] = {n: [] for n in nodes}

    def links(name: str, before: dict[int, Any], after: dict[int, Any]) -> None:
        """Flags of the link from the node ``before`` marks to the one ``after`` marks."""
        for n in nodes:
            out[n].append(_conj(m, f"{name}_out_{n}", before[n], [after[k] for k in far[n]]))
            into[n].append(_conj(m, f"{name}_in_{n}", after[n], [before[k] for k in far[n]]))

    seen_prev: dict[int, Any] = dict.fromkeys(nodes, 0)
    latest_prev: dict[int, Any] = {}
    for r in range(len(units)):
        seen = {n: _seen(m, f"{tag}_seen_{r}_{n}", seen_prev[n], y[r][n]) for n in nodes}
        first = {n: _first(m, f"{tag}_first_{r}_{n}", seen[n], seen_prev[n]) for n in nodes}
        latest = _latest(m, f"{tag}_latest_{r}", nodes, first, latest_prev)
        if r:
            links(f"{tag}_nic_{r}", latest_prev, first)
            for n in nodes:  # the link into the node first seen at r comes from latest[r-1]
                _link(m, f"{tag}_link_{r}_{n}", var, latest_prev[n],
                      {k: f for k, f in first.items() if k != n}, cost[n])  # fmt: skip
            inner = []  # a unit whose node appeared before: a link inside that node
            for n in nodes:
                for x in _and_not(m, f"{tag}_again_{r}_{n}", y[r][n], first[n]):
                    if np.isfinite(cost[n, n]):
                        inner.append((float(cost[n, n]), x))
                    else:  # the node cannot hold two of the ring's units over a link
                        _forbid(m, f"{tag}_again_failed_{r}_{n}", [x])
            _bound(m, var, inner, None, f"{tag}_inner_{r}")
        seen_prev, latest_prev = seen, latest
    home = {k: _sum(m, f"{tag}_home_{k}", y[0][k]) for k in nodes}
    links(f"{tag}_nic_close", latest_prev, home)
    for n in nodes:  # the last node to appear closes the ring to unit 0's node
        to = {k: lit for k, lit in home.items() if k != n}
        _link(m, f"{tag}_close_{n}", var, latest_prev[n], to, cost[n])
    if cross is not None:
        for r in range(1, len(units)):
            for n in nodes:  # unit r off unit 0's node: the ring leaves a node
                terms = [(1, m.xvar[cross])] + [(-1, x) for x in y[0][n] if not const(x)]
                terms += [(1, x) for x in y[r][n] if not const(x)]
                rhs = sum(1 for x in y[0][n] if const(x)) - sum(1 for x in y[r][n] if const(x))
                if len(terms) > 1 or rhs > 0:
                    b.add_linear(terms, ">=", rhs, f"{tag}_cross_{r}_{n}")
    return (
        {n: any_of(m, out[n], f"{tag}_out_{n}") for n in nodes},
        {n: any_of(m, into[n], f"{tag}_in_{n}") for n in nodes},
    )


def _conj(m: MasterView, name: str, a: Any, lits: list[Any]) -> Any:
    """0/1 at least ``a`` and one of ``lits`` (at most one of which holds)."""
    lits = [x for x in lits if not (const(x) and not x)]
    if (const(a) and not a) or not lits:
        return 0
    fixed = int(const(a)) + sum(1 for x in lits if const(x))
    if fixed >= 2:
        return 1
    z = m.b.new_bool(name)
    terms = [(1, z)] + [(-1, x) for x in [a, *lits] if not const(x)]
    m.b.add_linear(terms, ">=", fixed - 1, name)
    return z


def _sum(m: MasterView, name: str, lits: list[Any]) -> Any:
    """A 0/1 equal to a sum of place literals of one unit (at most one holds)."""
    if not lits:
        return 0
    if len(lits) == 1:
        return lits[0]
    if any(const(x) and x for x in lits):
        return 1
    out = m.b.new_bool(name)
    m.b.add_linear([(1, out)] + [(-1, x) for x in lits if not const(x)], "==", 0, name)
    return out


def _seen(m: MasterView, name: str, before: Any, here: list[Any]) -> Any:
    now = _sum(m, f"{name}_y", here)
    if const(before) and before:
        return 1
    if const(now):
        return 1 if now else before
    if const(before):  # not seen before: seen now exactly when here
        return now
    out = m.b.new_bool(name)
    m.b.add_linear([(1, out), (-1, before)], ">=", 0, f"{name}_a")
    m.b.add_linear([(1, out), (-1, now)], ">=", 0, f"{name}_b")
    m.b.add_linear([(1, out), (-1, before), (-1, now)], "<=", 0, f"{name}_c")
    return out


def _first(m: MasterView, name: str, seen: Any, before: Any) -> Any:
    """0/1 = seen - before (seen >= before)."""
    if const(before):
        return 0 if before else seen
    if const(seen):
        if not seen:
            return 0
        out = m.b.new_bool(name)
        m.b.add_linear([(1, out), (1, before)], "==", 1, name)
        return out
    out = m.b.new_bool(name)
    m.b.add_linear([(1, out), (-1, seen), (1, before)], "==", 0, name)
    return out


def _latest(
    m: MasterView, name: str, nodes: list[int], first: dict[int, Any], before: dict[int, Any]
) -> dict[int, Any]:
    """Per node, 0/1: the node that appeared last up to this rank."""
    new = [f for f in first.values() if not const(f)]
    fixed_new = [n for n, f in first.items() if const(f) and f]
    if fixed_new:  # this rank's node is known to be new
        return {n: int(n == fixed_new[0]) for n in nodes}
    if not new:
        return dict(before)
    out = {n: m.b.new_bool(f"{name}_{n}") for n in nodes}
    m.b.add_linear([(1, x) for x in out.values()], "==", 1, f"{name}_one")
    for n in nodes:
        if not const(first[n]):
            m.b.add_linear([(1, out[n]), (-1, first[n])], ">=", 0, f"{name}_new_{n}")
        prev = before.get(n, 0)
        if const(prev) and not prev:
            continue
        terms = [(1, out[n])] + [(1, f) for f in new]
        if const(prev):
            m.b.add_linear(terms, ">=", 1, f"{name}_keep_{n}")
        else:
            m.b.add_linear([*terms, (-1, prev)], ">=", 0, f"{name}_keep_{n}")
    return out


def _and_not(m: MasterView, name: str, here: list[Any], first: Any) -> list[Any]:
    """Literals whose sum is ``y - first`` for one node (unit here, node seen before)."""
    if const(first):
        return [] if first else here
    if not here:
        return []
    again = m.b.new_bool(name)
    y = [x for x in here if not const(x)]
    fixed = sum(1 for x in here if const(x))
    # again = y - first (first <= y)
    m.b.add_linear([(1, again), (1, first)] + [(-1, x) for x in y], "==", fixed, name)
    return [again]


def _link(
    m: MasterView, name: str, var: Any, when: Any, to: dict[int, Any], costs: np.ndarray
) -> None:
    """``when => var >= sum_k costs[k] to[k]``; a failed pair (inf) forbids ``when`` with it."""
    if const(when) and not when:
        return
    terms = []
    for k, lit in to.items():
        if const(lit) and not lit:
            continue
        if not np.isfinite(costs[k]):
            _forbid(m, f"{name}_failed_{k}", [when, lit])
            continue
        terms.append((float(costs[k]), lit))
    _bound(m, var, terms, None if const(when) else when, name)


def _bound(m: MasterView, var: Any, terms: list[tuple[float, Any]], when: Any, name: str) -> None:
    free = [(c, x) for c, x in terms if not const(x) and c]
    fixed = sum(c * int(x) for c, x in terms if const(x))
    if free or fixed:
        m.b.add_time_bound(var, free, fixed, when, name)


def _forbid(m: MasterView, name: str, lits: list[Any]) -> None:
    """Not all of ``lits`` at once."""
    free = [(1, x) for x in lits if not const(x)]
    fixed = sum(int(x) for x in lits if const(x))
    if not free:
        if fixed == len(lits):  # fixed units on a failed pair: no placement
            never = m.b.new_bool(name)
            m.b.add_linear([(1, never)], ">=", 1, f"{name}_a")
            m.b.add_linear([(1, never)], "<=", 0, f"{name}_b")
        return
    m.b.add_linear(free, "<=", len(lits) - 1 - fixed, name)


def _both(m: MasterView, a: Any, b: Any, name: str) -> Any:
    """0/1 >= a and b."""
    if const(a):
        return b if a else 0
    if const(b):
        return a if b else 0
    out = m.b.new_bool(name)
    m.b.add_linear([(1, out), (-1, a), (-1, b)], ">=", -1, name)
    return out
