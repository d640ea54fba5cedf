"""Rows several families write, over what a family sees of the master
(:class:`~pipette_cp.solvers.placement.family.Master`).

``place[u][p]`` is a 0/1 variable or, for a unit fixed to its place, the constant 1;
every helper folds constants into the right-hand side, so a row over fixed units only
is dropped when it holds and kept (infeasible) when it does not.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipette_cp.solvers.placement.data import MasterView


def const(v: Any) -> bool:
    """Whether ``v`` is a fixed literal (an int 0 or 1), not a solver variable."""
    return isinstance(v, int | np.integer)


def nodes_of(m: MasterView, u: int) -> dict[int, list[Any]]:
    """Indicators of unit ``u`` being on each node, as lists of place literals."""
    out: dict[int, list[Any]] = {}
    for p, lit in m.place[u].items():
        out.setdefault(int(m.data.place_node[p]), []).append(lit)
    return out


def shared_nodes(m: MasterView) -> list[int]:
    """Nodes that can hold two or more units (their NIC shares depend on the placement)."""
    d = m.data
    nodes = d.instance.cluster.num_nodes
    per_node = np.bincount(d.place_node, weights=d.capacity, minlength=nodes)
    return [n for n in range(nodes) if per_node[n] >= 2]


def max_over_pairs(m: MasterView, i: int, cost: np.ndarray, u: int, v: int, name: str) -> None:
    """``x[i] >= cost[p, q]`` whenever u is on p and v on q (failed pairs skipped);
    pairs dearer than the input's upper bound (``objective_bound`` family: no
    placement as fast as the incumbent uses them) are forbidden outright."""
    var, cap = m.xvar[i], m.upper_x[i] * (1 + 1e-12)
    pu, pv = m.place[u], m.place[v]
    for first, second, mat, tag in ((pu, pv, cost, "a"), (pv, pu, cost.T, "b")):
        for p, lit in first.items():
            row = {q: float(mat[p, q]) for q in second if np.isfinite(mat[p, q])}
            dear = [second[q] for q, c in row.items() if c > cap]
            if dear and tag == "a":
                clique = [(1, x) for x in [lit, *dear] if not const(x)]
                rhs = 1 - sum(1 for x in [lit, *dear] if const(x))
                m.b.add_linear(clique, "<=", rhs, f"objective_bound_{name}_{p}")
            if tag == "b" and (len(pu) == 1 or len(pv) == 1):
                break  # the mirror adds nothing when one side is fixed
            ok = {q: c for q, c in row.items() if c <= cap}
            if not ok:
                continue
            floor = min(ok.values())  # sum of second's places is 1 when lit holds
            shifted = [(c - floor, second[q]) for q, c in ok.items() if c > floor]
            fixed = floor + sum(c for c, x in shifted if const(x))
            terms = [(c, x) for c, x in shifted if not const(x)]
            enforce = None if const(lit) else lit
            m.b.add_time_bound(var, terms, fixed, enforce, f"{name}_{tag}{p}")


def crossing(m: MasterView, u: int, v: int, n: int, name: str, domain: bool = False) -> Any:
    """0/1 (literal or constant) >= [u on node n and v not] (``domain``: and v not
    on any node of n's NVLink domain)."""
    on_u, of_v = nodes_of(m, u).get(n, []), nodes_of(m, v)
    near = np.flatnonzero(m.domain_of_node == m.domain_of_node[n]) if domain else [n]
    on_v = [x for k in near for x in of_v.get(int(k), [])]
    fixed = sum(1 for x in on_u if const(x)) - sum(1 for x in on_v if const(x))
    terms = [(1, x) for x in on_u if not const(x)] + [(-1, x) for x in on_v if not const(x)]
    if not terms:
        return max(fixed, 0)
    flag = m.b.new_bool(name)
    m.b.add_linear([(1, flag)] + [(-c, x) for c, x in terms], ">=", fixed, f"def_{name}")
    return flag


def at_least(m: MasterView, big: Any, small: Any, name: str) -> None:
    """``big >= small`` (0/1 variables, or ``small`` a constant)."""
    if const(small):
        if small:
            m.b.add_linear([(1, big)], ">=", 1, name)
    else:
        m.b.add_linear([(1, big), (-1, small)], ">=", 0, name)


def bound(m: MasterView, var: Any, terms: list, fixed: float, lit: Any, name: str) -> None:
    """``lit => var >= fixed + terms``, with constant literals folded in."""
    base = fixed + sum(c * int(x) for c, x in terms if const(x))
    free = [(c, x) for c, x in terms if not const(x) and c]
    if const(lit):
        if lit:
            m.b.add_time_bound(var, free, base, None, name)
        return
    m.b.add_time_bound(var, free, base, lit, name)


def any_of(m: MasterView, flags: list[Any], name: str) -> Any:
    """A 0/1 at least every flag (a constant 1 if one is)."""
    if any(const(f) and f for f in flags):
        return 1
    free = [f for f in flags if not const(f)]
    if not free:
        return 0
    out = m.b.new_bool(name)
    for k, f in enumerate(free):
        m.b.add_linear([(1, out), (-1, f)], ">=", 0, f"{name}_{k}")
    return out


def count(m: MasterView, var: Any, flags: list, coef: float, lat: float, enforce: Any,
          name: str) -> None:  # fmt: skip
    """``enforce => var >= lat + coef x (flags set)`` (``flags``: (weight, flag))."""
    terms = [(coef * w, f) for w, f in flags if not (const(f) and not f)]
    if terms and not (const(enforce) and not enforce):
        bound(m, var, terms, lat, enforce, name)


def ring_rows(
    m: MasterView, family: str, edges: list[tuple[int, int, int]], index: np.ndarray,
    coef: np.ndarray, cross: np.ndarray | None,
) -> None:  # fmt: skip
    """Ring links ``(k, u, v)``: input ``index[k] >= coef[k] / B`` per link, the NIC
    shares at both ends, and (``cross``) the ring-leaves-a-node indicators."""
    d = m.data
    wide = d.instance.cluster.nodes_per_nvlink_domain > 1
    for k, u, v in edges:
        max_over_pairs(m, int(index[k]), coef[k] * d.inv_bw, u, v, f"{family}_pair_{k}_{u}")
    shared = shared_nodes(m)
    per_count = d.plan.tp / d.nic_capacity
    for n in shared:
        for way in ("out", "in"):
            flags: list[tuple[int, Any]] = []
            for e, (k, u, v) in enumerate(edges):
                a, c = (u, v) if way == "out" else (v, u)
                name = f"{family}_cross_{way}_{e}_{n}"
                flag = crossing(m, a, c, n, name, domain=wide)
                flags.append((k, flag))
                if cross is not None and way == "out":
                    node = crossing(m, a, c, n, f"node_{name}") if wide else flag
                    if not (const(node) and not node):
                        at_least(m, m.xvar[int(cross[k])], node, f"{family}_leaves_{e}_{n}")
            for k in sorted({k for k, _ in flags}):
                enforce = any_of(m, [f for j, f in flags if j == k], f"{family}_any_{way}_{k}_{n}")
                weighted = [(1.0, f) for _, f in flags]
                count(m, m.xvar[int(index[k])], weighted, coef[k] * per_count, 0.0, enforce,
                      f"{family}_nic_{way}_{k}_{n}")  # fmt: skip
    if cross is None:
        return
    for k, u, _ in edges:  # a unit alone on its node: its ring link leaves the node
        lone = [x for p, x in m.place[u].items() if int(d.place_node[p]) not in shared]
        if lone:
            fixed = sum(1 for x in lone if const(x))
            terms = [(1, m.xvar[int(cross[k])])] + [(-1, x) for x in lone if not const(x)]
            m.b.add_linear(terms, ">=", fixed, f"{family}_leaves_lone_{k}_{u}")
