"""Expert all-to-alls: each stage's slowest all-to-all among its expert groups.

Input ``a2a[s]`` (s): one all-to-all of stage ``s`` at its slowest rank
(:mod:`~pipette_cp.solvers.placement.families.group_tables`).  Rows (``u`` a unit on place
``p``, ``v`` one of its partners on ``q``), written only where the tables price the
family (:attr:`~pipette_cp.solvers.placement.families.group_tables.GroupTables.priced`):

- ``a2a_pair``: ``place[u,p] => a2a[s] >= lat_inter + bytes / B(p, q)`` for the partners
  in another NVLink domain (a send through the NICs, at its link or one unit's share);
- ``a2a_serial``: ``place[u,p] => a2a[s] >= lat_intra + own bytes / B(p, p) + sum_v
  peers(u, v) bytes / B(p, q) [v on q in p's domain] + (lat_inter - lat_intra) any[u]``
  (a rank's NVLink sends one after another; ``any[u]``: a partner on another node);
- ``a2a_nic``: ``any_s[n] => a2a[s] >= lat_inter + bytes / nic x sum flows(u, v)
  cross[u, v, n]`` (the flows leaving node ``n`` for another domain share its NICs; the
  groups' flows are symmetric, so the flows entering a node equal those leaving it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pipette_cp.solvers.placement.data import MasterView, PlacementData
from pipette_cp.solvers.placement.families.group_family import GroupFamily
from pipette_cp.solvers.placement.families.group_tables import (
    GroupTables,
    a2a_added,
    group_tables,
    per_byte_worst,
)
from pipette_cp.solvers.placement.families.rows import (
    any_of,
    bound,
    count,
    crossing,
    max_over_pairs,
    nodes_of,
    shared_nodes,
)
from pipette_cp.solvers.placement.family import Edge, Slot, TimeParts


class ExpertAllToAll(GroupFamily):
    """The all-to-all input of every stage (module docstring)."""

    name = "a2a"
    inputs = ("a2a",)

    def slots(self, data: PlacementData) -> Sequence[Slot]:
        g = group_tables(data)
        return (Slot("a2a", (data.plan.pp if g is not None and g.a2a else 0,)),)

    def table_edges(self, g: GroupTables) -> list[Edge]:
        return [(s, u, v) for s, u, v, _, _ in g.a2a_pairs]

    def priced_rows(self, m: MasterView, g: GroupTables) -> None:
        _add_alltoall(m)

    def add_time(self, data: PlacementData, g: GroupTables, x: np.ndarray, t: TimeParts) -> None:
        f, b = a2a_added(g, x[data.xi["a2a"]])
        t.forward, t.backward = t.forward + f, t.backward + b

    def worst_inputs(self, data: PlacementData, g: GroupTables) -> float:
        """Each GPU sends at most ``ep - 1`` flows, each at its slowest link or NIC share."""
        lat = data.instance.cluster.inter_node_latency_s
        return lat + g.a2a_bytes * (data.plan.ep - 1) * per_byte_worst(data)


def _add_alltoall(m: MasterView) -> None:
    d, xi = m.data, m.xi
    g = group_tables(d)
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
            max_over_pairs(m, int(xi["a2a"][s]), remote, u, v, f"a2a_pair_{u}_{v}")
    # nodes whose NIC flows depend on the placement: shared ones, and every node of a
    # multi-node NVLink domain (its flows may stay in the domain); else a lone unit's
    counted = set(range(cl.num_nodes)) if wide else set(shared_nodes(m))
    per_node: dict[int, list[tuple[int, int, Any]]] = {}  # node -> (stage, flows, flag)
    for u in range(d.num_units):
        s, mine = d.stage_of(u), partners.get(u, [])
        var = m.xvar[int(xi["a2a"][s])]
        on = nodes_of(m, u)
        node_flags: list[Any] = []
        for n in on:
            if n not in counted:  # a lone unit: every partner elsewhere
                node_flags.extend(on[n])
                continue
            for v, _, flows in mine:
                flag = crossing(m, u, v, n, f"a2a_cross_{u}_{v}_{n}", domain=wide)
                per_node.setdefault(n, []).append((s, flows, flag))
                near = crossing(m, u, v, n, f"a2a_node_{u}_{v}_{n}") if wide else flag
                node_flags.append(near)
        away = any_of(m, node_flags, f"a2a_any_{u}") if mine else 0
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
            bound(m, var, terms, lat_in + own_s, lit, f"a2a_serial_{u}_{p}")
            n = int(d.place_node[p])
            if n not in counted and mine:  # a lone unit's flows, all remote
                total = sum(flows for _, _, flows in mine)
                bound(m, var, [], lat_out + nbytes * scale * total / d.nic_capacity, lit,
                      f"a2a_lone_{u}_{p}")  # fmt: skip
    coef = nbytes * scale / d.nic_capacity
    for n, flags in per_node.items():
        everything = [(float(w), f) for _, w, f in flags]
        for s in sorted({s for s, _, _ in flags}):
            enforce = any_of(m, [f for t, _, f in flags if t == s], f"a2a_nic_any_{s}_{n}")
            count(m, m.xvar[int(xi["a2a"][s])], everything, coef, lat_out, enforce,
                  f"a2a_nic_{s}_{n}")  # fmt: skip
