"""NIC sharing of the dense flows: hops, the tied embedding and DP rings that leave a
node's NVLink domain share its NICs.

For each node ``n`` that may hold two or more units, ``cross[e, n] >= place_node[u, n] -
sum_{m in D(n)} place_node[v, m]`` flags each hop, embedding and DP-ring flow ``u -> v``
(and its mirror, entering) that leaves ``n`` for another NVLink domain ``D(n)`` (``{n}``
by default; flows between the nodes of one domain run over NVLink), and ``T >= lat [any
flow of T's own] + bytes tp / nic_capacity x count`` bounds every time the flows load
(the Evaluator's ``concurrent_flows``, docs/design.md, section 3); a DP ring that leaves
a node, or whose unit sits alone on one, also sets its inter-node latency indicator.
The family has no inputs of its own: it bounds those of the hop, embedding and DP-ring
families (by their names in ``x``).  The group families write their NIC rows themselves.
"""

from __future__ import annotations

from typing import Any

from pipette_cp.solvers.placement.data import Family, MasterView
from pipette_cp.solvers.placement.families.rows import at_least, const, crossing, shared_nodes


class NicSharing(Family):
    """The NIC-sharing rows of the dense flows (module docstring)."""

    name = "nic"

    def add_rows(self, m: MasterView) -> None:
        """Flows leaving (entering) a node for another NVLink domain share its NICs (only
        nodes that hold >= 2 units; a lone unit's share is folded into the pair costs).
        Also sets the ring latency indicators ``cross[s]`` (the ring leaves a node)."""
        d, xi = m.data, m.xi
        cl = d.instance.cluster
        shared = shared_nodes(m)
        per_count = d.plan.tp / d.nic_capacity
        edges = d.edges()
        wide = cl.nodes_per_nvlink_domain > 1  # NIC flows: leaving the domain, not the node
        ring_flags: dict[tuple[str, int], list[tuple[int, Any, Any]]] = {}
        targets = {"hop": lambda s: (xi["hf"][s], xi["hb"][s]), "emb": lambda s: (xi["emb"][0],),
                   "ring": lambda s: (xi["ring"][s],)}  # fmt: skip
        for family in ("hop", "emb", "ring"):
            for n in shared:
                for way in ("out", "in"):
                    by_index: dict[int, list[Any]] = {}
                    for k, (i, u, v) in enumerate(edges.get(family, [])):
                        a, c = (u, v) if way == "out" else (v, u)
                        name = f"cross_{family}_{way}_{k}_{n}"
                        flag = crossing(m, a, c, n, name, domain=wide)
                        if family == "ring":  # the NIC flag and the node-crossing one
                            node = crossing(m, a, c, n, f"node_{name}") if wide else flag
                            ring_flags.setdefault((way, n), []).append((i, flag, node))
                        elif not (const(flag) and not flag):
                            by_index.setdefault(i, []).append(flag)
                    for i, flags in by_index.items():
                        nbytes = d.act_bytes if family == "hop" else d.emb_bytes
                        lat = cl.inter_node_latency_s * (1 if family == "hop" else 2)
                        _count_bound(m, targets[family](i), flags, nbytes * per_count, lat, n,
                                     way, family, i)  # fmt: skip
        for (way, n), flags in ring_flags.items():
            nic = [(i, f) for i, f, _ in flags if not (const(f) and not f)]
            everything = [f for _, f in nic]
            for s in {i for i, _ in nic}:
                mine = [f for i, f in nic if i == s]
                coef = d.ring_bytes[s] * per_count
                _count_bound(m, (xi["ring"][s],), everything, coef, 0.0, n, way, "ring", s, mine)
            for s, _, f in flags:  # the ring of stage s leaves a node: inter-node latency
                if not (const(f) and not f):
                    at_least(m, m.xvar[xi["cross"][s]], f, f"ring_cross_{s}_{way}_{n}")
        _lone_units_cross(m, set(shared), edges.get("ring", []))


def _count_bound(m: MasterView, targets, flags, coef, lat, n, way, family, i, mine=None) -> None:
    """targets >= lat [some flag of mine] + coef x (number of flags)."""
    mine = flags if mine is None else mine
    fixed = sum(int(f) for f in flags if const(f))
    terms = [(coef, f) for f in flags if not const(f)]
    if any(const(f) and f for f in mine):
        enforce = None
    else:
        enforce = m.b.new_bool(f"any_{family}_{way}_{i}_{n}")
        for f in mine:
            at_least(m, enforce, f, f"def_any_{family}_{way}_{i}_{n}")
    for t in targets:
        if family == "ring":  # product of an indicator and a count: enforced
            m.b.add_time_bound(
                m.xvar[t], terms, coef * fixed, enforce, f"nic_{family}_{way}_{i}_{n}"
            )
        else:  # lat x any + coef x count is exact without enforcement
            extra = [] if enforce is None else [(lat, enforce)]
            base = coef * fixed + (lat if enforce is None else 0.0)
            m.b.add_time_bound(m.xvar[t], terms + extra, base, None, f"nic_{family}_{way}_{i}_{n}")  # fmt: skip


def _lone_units_cross(m: MasterView, shared: set[int], ring: list[tuple[int, int, int]]) -> None:
    """A unit on a node that holds no other unit makes its DP ring cross nodes."""
    d, cross = m.data, m.xi.get("cross")
    for s, u, _ in ring:
        lone = [x for p, x in m.place[u].items() if int(d.place_node[p]) not in shared]
        if lone:
            fixed = sum(1 for x in lone if const(x))
            terms = [(1, m.xvar[cross[s]])] + [(-1, x) for x in lone if not const(x)]
            m.b.add_linear(terms, ">=", fixed, f"ring_cross_lone_{s}_{u}")
