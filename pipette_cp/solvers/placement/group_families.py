"""The masters' cost families of context-parallel rings, expert all-to-alls and expert rings.

Written once over :class:`~pipette_cp.solvers.placement.backend.Backend`, like the
families of :mod:`~pipette_cp.solvers.placement.model` (``u`` a unit on place ``p``,
``v`` one of its partners on ``q``; every family a lower bound on an input of ``x``,
:mod:`~pipette_cp.solvers.placement.groups`):

- ``a2a_pair``: ``place[u,p] => a2a[s] >= lat_inter + bytes / B(p, q)`` for the partners
  in another NVLink domain (a send through the NICs, at its link or one unit's share);
- ``a2a_serial``: ``place[u,p] => a2a[s] >= lat_intra + own bytes / B(p, p) + sum_v
  peers(u, v) bytes / B(p, q) [v on q in p's domain] + (lat_inter - lat_intra) any[u]``
  (a rank's NVLink sends one after another; ``any[u]``: a partner on another node);
- ``a2a_nic``: ``any_s[n] => a2a[s] >= lat_inter + bytes / nic x sum flows(u, v)
  cross[u, v, n]`` (the flows leaving node ``n`` for another domain share its NICs; the
  groups' flows are symmetric, so the flows entering a node equal those leaving it);
- ``cp_pair`` / ``cp_nic`` and ``ering_pair`` / ``ering_nic`` / ``ering_cross``: as the
  DP ring's families (every link at its bandwidth and at its node's NIC share, both
  ends; an expert ring class leaving a node pays the inter-node latency).

Only the families :attr:`~pipette_cp.solvers.placement.groups.GroupTables.priced`
lists are written; each input is otherwise bounded by 0 and :func:`group_worst_x`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from pipette_cp.solvers.placement.data import PlacementData

if TYPE_CHECKING:
    from pipette_cp.solvers.placement.model import PlacementModel


def _const(v: Any) -> bool:
    return isinstance(v, int | np.integer)


def group_worst_x(data: PlacementData) -> dict[int, float]:
    """Values no placement's group inputs exceed (each GPU sends at most ``ep - 1``
    all-to-all flows, one ring flow per ring; a node's NICs carry at most all its GPUs'
    flows): position in ``x`` -> seconds."""
    g, xi = data.groups, data.xi
    out: dict[int, float] = {}
    if g is None:
        return out
    c = data.instance.cluster
    bw = c.links
    slowest = float(bw[bw > 0].min()) if (bw > 0).any() else 1.0
    per_byte = max(1.0 / slowest, c.gpus_per_node / data.nic_capacity)
    for i in xi.a2a:
        out[int(i)] = c.inter_node_latency_s + g.a2a_bytes * (data.plan.ep - 1) * per_byte
    for i in xi.cps:
        out[int(i)] = g.cp_chunk_bytes * per_byte
    for k, i in enumerate(xi.ering):
        out[int(i)] = float(g.ering_bytes[k // g.ering_classes]) * per_byte
    return out


def add_group_variables(m: PlacementModel, ux: np.ndarray) -> None:
    """The group inputs' variables (``ux``: the capped upper bounds)."""
    b, xi, lx = m.b, m.data.xi, m.lower_x
    for name, idx in (("a2a", xi.a2a), ("cp_step", xi.cps), ("ering", xi.ering)):
        for k, i in enumerate(idx):
            m.xvar[i] = b.new_time(f"{name}_{k}", lx[i], max(ux[i], lx[i]))
    for k, i in enumerate(xi.ecross):
        m.xvar[i] = b.new_bool(f"ering_cross_{k}")


def add_group_costs(m: PlacementModel) -> None:
    """Every priced family of the layout's groups."""
    g = m.data.groups
    if g is None:
        return
    if "a2a" in g.priced:
        _add_alltoall(m)
    if "cp" in g.priced:
        coef = np.full(m.data.plan.pp, g.cp_chunk_bytes)
        _add_rings(m, "cp", list(g.cp_edges), m.data.xi.cps, coef, None)
    if "ering" in g.priced:
        coef = np.repeat(g.ering_bytes, g.ering_classes)
        _add_rings(m, "ering", list(g.ering_edges), m.data.xi.ering, coef, m.data.xi.ecross)


def _shared_nodes(m: PlacementModel) -> list[int]:
    d = m.data
    nodes = d.instance.cluster.num_nodes
    per_node = np.bincount(d.place_node, weights=d.capacity, minlength=nodes)
    return [n for n in range(nodes) if per_node[n] >= 2]


def _bound(m: PlacementModel, var: Any, terms: list, const: float, lit: Any, name: str) -> None:
    """``lit => var >= const + terms``, with constant literals folded in."""
    fixed = const + sum(c * int(x) for c, x in terms if _const(x))
    free = [(c, x) for c, x in terms if not _const(x) and c]
    if _const(lit):
        if lit:
            m.b.add_time_bound(var, free, fixed, None, name)
        return
    m.b.add_time_bound(var, free, fixed, lit, name)


def _any_of(m: PlacementModel, flags: list[Any], name: str) -> Any:
    """A 0/1 at least every flag (a constant 1 if one is)."""
    if any(_const(f) and f for f in flags):
        return 1
    free = [f for f in flags if not _const(f)]
    if not free:
        return 0
    out = m.b.new_bool(name)
    for k, f in enumerate(free):
        m.b.add_linear([(1, out), (-1, f)], ">=", 0, f"{name}_{k}")
    return out


def _count(m: PlacementModel, var: Any, flags: list, coef: float, lat: float, enforce: Any,
           name: str) -> None:  # fmt: skip
    """``enforce => var >= lat + coef x (flags set)`` (``flags``: (weight, flag))."""
    terms = [(coef * w, f) for w, f in flags if not (_const(f) and not f)]
    if terms and not (_const(enforce) and not enforce):
        _bound(m, var, terms, lat, enforce, name)


def _add_alltoall(m: PlacementModel) -> None:
    d, g, xi = m.data, m.data.groups, m.data.xi
    assert g is not None
    cl = d.instance.cluster
    lat_in, lat_out = cl.intra_node_latency_s, cl.inter_node_latency_s
    wide = cl.nodes_per_nvlink_domain > 1
    nbytes, scale = g.a2a_bytes, g.remote_scale
    remote = np.where(d.cross, lat_out + nbytes * scale * d.inv_bw, 0.0)
    remote = np.maximum(remote, remote.T)
    partners: dict[int, list[tuple[int, int, int]]] = {}
    for s, u, v, peers, flows in g.a2a_pairs:
        partners.setdefault(u, []).append((v, peers, flows))
        if u < v:
            m._max_over_pairs(int(xi.a2a[s]), remote, u, v, f"a2a_pair_{u}_{v}")
    # nodes whose NIC flows depend on the placement: shared ones, and every node of a
    # multi-node NVLink domain (its flows may stay in the domain); else a lone unit's
    counted = set(range(cl.num_nodes)) if wide else set(_shared_nodes(m))
    per_node: dict[int, list[tuple[int, int, Any]]] = {}  # node -> (stage, flows, flag)
    for u in range(d.num_units):
        s, mine = d.stage_of(u), partners.get(u, [])
        var = m.xvar[int(xi.a2a[s])]
        on = m.nodes_of(u)
        node_flags: list[Any] = []
        for n in on:
            if n not in counted:  # a lone unit: every partner elsewhere
                node_flags.extend(on[n])
                continue
            for v, _, flows in mine:
                flag = m._crossing(u, v, n, f"a2a_cross_{u}_{v}_{n}", domain=wide)
                per_node.setdefault(n, []).append((s, flows, flag))
                near = m._crossing(u, v, n, f"a2a_node_{u}_{v}_{n}") if wide else flag
                node_flags.append(near)
        away = _any_of(m, node_flags, f"a2a_any_{u}") if mine else 0
        own = float(g.a2a_own[u]) * nbytes
        for p, lit in m.place[u].items():
            terms: list[tuple[float, Any]] = []
            for v, peers, _ in mine:
                for q, x in m.place[v].items():
                    cost = d.inv_bw[p, q]
                    if not d.cross[p, q] and np.isfinite(cost):
                        terms.append((peers * nbytes * float(cost), x))
            terms.append((lat_out - lat_in, away))
            own_s = own * float(d.inv_bw[p, p]) if own else 0.0
            _bound(m, var, terms, lat_in + own_s, lit, f"a2a_serial_{u}_{p}")
            n = int(d.place_node[p])
            if n not in counted and mine:  # a lone unit's flows, all remote
                total = sum(flows for _, _, flows in mine)
                _bound(m, var, [], lat_out + nbytes * scale * total / d.nic_capacity, lit,
                       f"a2a_lone_{u}_{p}")  # fmt: skip
    coef = nbytes * scale / d.nic_capacity
    for n, flags in per_node.items():
        everything = [(float(w), f) for _, w, f in flags]
        for s in sorted({s for s, _, _ in flags}):
            enforce = _any_of(m, [f for t, _, f in flags if t == s], f"a2a_nic_any_{s}_{n}")
            _count(m, m.xvar[int(xi.a2a[s])], everything, coef, lat_out, enforce,
                   f"a2a_nic_{s}_{n}")  # fmt: skip


def _add_rings(
    m: PlacementModel, family: str, edges: list[tuple[int, int, int]], index: np.ndarray,
    coef: np.ndarray, cross: np.ndarray | None,
) -> None:  # fmt: skip
    """Ring links ``(k, u, v)``: input ``index[k] >= coef[k] / B`` per link, the NIC
    shares at both ends, and (``cross``) the ring-leaves-a-node indicators."""
    d = m.data
    cl = d.instance.cluster
    wide = cl.nodes_per_nvlink_domain > 1
    for k, u, v in edges:
        m._max_over_pairs(int(index[k]), coef[k] * d.inv_bw, u, v, f"{family}_pair_{k}_{u}")
    shared = _shared_nodes(m)
    per_count = d.plan.tp / d.nic_capacity
    for n in shared:
        for way in ("out", "in"):
            flags: list[tuple[int, Any]] = []
            for e, (k, u, v) in enumerate(edges):
                a, c = (u, v) if way == "out" else (v, u)
                name = f"{family}_cross_{way}_{e}_{n}"
                flag = m._crossing(a, c, n, name, domain=wide)
                flags.append((k, flag))
                if cross is not None and way == "out":
                    node = m._crossing(a, c, n, f"node_{name}") if wide else flag
                    if not (_const(node) and not node):
                        m._at_least(m.xvar[int(cross[k])], node, f"{family}_leaves_{e}_{n}")
            for k in sorted({k for k, _ in flags}):
                enforce = _any_of(m, [f for j, f in flags if j == k], f"{family}_any_{way}_{k}_{n}")
                weighted = [(1.0, f) for _, f in flags]
                _count(m, m.xvar[int(index[k])], weighted, coef[k] * per_count, 0.0, enforce,
                       f"{family}_nic_{way}_{k}_{n}")  # fmt: skip
    if cross is None:
        return
    for k, u, _ in edges:  # a unit alone on its node: its ring link leaves the node
        lone = [x for p, x in m.place[u].items() if int(d.place_node[p]) not in shared]
        if lone:
            fixed = sum(1 for x in lone if _const(x))
            terms = [(1, m.xvar[int(cross[k])])] + [(-1, x) for x in lone if not _const(x)]
            m.b.add_linear(terms, ">=", fixed, f"{family}_leaves_lone_{k}_{u}")
