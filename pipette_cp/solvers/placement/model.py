"""The placement master problem, written once over a small backend interface.

One formulation, two solvers: :mod:`pipette_cp.solvers.placement.cpsat` and
:mod:`pipette_cp.solvers.placement.milp` implement :class:`Backend` (integer
scaling for CP-SAT, big-M enforcement for the MILP), so both solve exactly the
same model and the constraint families carry the checker's names
(``placement_bijection``, ``tp_within_node``, ``no_failed_link``,
``memory_limit``) plus the cost families.

Variables: ``place[u, p]`` (unit ``u`` on place ``p``) for ``p`` in the unit's
domain; the time variables of :class:`~pipette_cp.solvers.placement.xindex.XIndex`
(hop, ring, embedding times, ring-crossing and compute-class indicators);
``t`` the iteration time, bounded below by Kelley cuts
(:mod:`pipette_cp.solvers.cuts`).  Every cost constraint is a lower bound on a
time variable, and every cut has non-negative coefficients, so at an optimum
each time variable equals the true maximum over its flows.

Cost families (``v`` the unit after ``u``): for every place ``p`` of ``u``,
``place[u, p] => T >= sum_q c(p, q) place[v, q]`` and the mirror over ``q``
(the "max over flows" of a hop, ring link or embedding pair, with ``c`` the
Evaluator's flow time at one unit's NIC share).  NIC sharing (nodes that may
hold several units): ``cross[e, n] >= place_node[u, n] - sum_{m in D(n)}
place_node[v, m]`` counts flows leaving node ``n`` for another NVLink domain
(``D(n)``: the nodes of ``n``'s domain, ``{n}`` by default; flows between the
nodes of one domain run over NVLink) and ``T >= bytes tp / nic_capacity x count``
(docs/design.md, section 3, the Evaluator's ``concurrent_flows``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipette_cp.errors import InfeasibleError
from pipette_cp.solvers.extensions import PlacementContext
from pipette_cp.solvers.placement.backend import Backend
from pipette_cp.solvers.placement.data import RING_FAMILIES, PlacementData
from pipette_cp.solvers.placement.group_families import (
    add_group_costs,
    add_group_variables,
    group_worst_x,
)
from pipette_cp.solvers.placement.nic_families import add_nic_sharing
from pipette_cp.solvers.placement.symmetry import add_symmetry_breaking, canonical


def _const(v: Any) -> bool:
    return isinstance(v, int | np.integer)


class PlacementModel:
    """The master over ``data`` restricted to ``domains[u]`` (places allowed for unit u).

    A unit with a one-place domain is fixed (its indicator is the constant 1),
    which is how LNS sub-problems are built.  ``symmetry`` adds the
    symmetry-breaking family (only valid when every unit has its full domain).
    """

    def __init__(
        self,
        data: PlacementData,
        backend: Backend,
        domains: list[np.ndarray],
        lower_x: np.ndarray,
        upper_x: np.ndarray,
        upper_s: float,
        symmetry: bool = True,
    ) -> None:
        self.data, self.b, self.domains = data, backend, domains
        per = data.instance.cluster.nodes_per_nvlink_domain
        self.domain_of_node = np.arange(data.instance.cluster.num_nodes) // per
        self.lower_x, self.upper_x, self.upper_s = lower_x, upper_x, upper_s
        self.build_variables()
        self.add_placement_bijection()
        self.add_tp_within_node()
        self.add_memory_limit()
        self.add_no_failed_link()
        self.add_hop_costs()
        self.add_ring_costs()
        self.add_embedding_cost()
        self.add_nic_sharing()
        add_group_costs(self)
        self.add_compute_classes()
        for family in data.constraints:
            family.placement(PlacementContext(self))
        if symmetry and not data.constraints:  # user rows need not be replica-symmetric
            self.add_symmetry_breaking()
        self.set_objective()
        self.watched = [(u, p, x) for u, lits in enumerate(self.place)
                        for p, x in lits.items() if not _const(x)]  # fmt: skip
        backend.watch([x for *_, x in self.watched])

    # ------------------------------------------------------------ variables
    def build_variables(self) -> None:
        d, b, xi = self.data, self.b, self.data.xi
        self.place: list[dict[int, Any]] = []
        for u, dom in enumerate(self.domains):
            if len(dom) == 1:
                self.place.append({int(dom[0]): 1})
            else:
                self.place.append({int(p): b.new_bool(f"place_{u}_{p}") for p in dom})
        # no input of a placement as fast as upper_s exceeds 2 upper_s (the snapped
        # cuts of placement_kelley.CutPool are valid up to there)
        ux = np.minimum(self.upper_x, min(self._upper_time(), 2.0 * self.upper_s))
        ux[xi.booleans] = self.upper_x[xi.booleans]  # 0/1 indicators: not times
        lx = self.lower_x
        self.xvar: list[Any] = [None] * xi.size
        for name, idx in (("hop_fwd", xi.hf), ("hop_bwd", xi.hb), ("ring", xi.ring)):
            for s, i in enumerate(idx):
                self.xvar[i] = b.new_time(f"{name}_{s}", lx[i], max(ux[i], lx[i]))
        if xi.emb is not None:
            self.xvar[xi.emb] = b.new_time("emb", lx[xi.emb], max(ux[xi.emb], lx[xi.emb]))
        add_group_variables(self, ux)
        for s, i in enumerate(xi.cross):
            self.xvar[i] = b.new_bool(f"ring_cross_{s}")
        for (s, c), i in np.ndenumerate(xi.worse):
            self.xvar[i] = b.new_bool(f"stage_class_le_{s}_{c}")
        for i in xi.booleans:  # indicators the objective bound forces to 0 (or 1)
            if ux[i] < 0.5:
                b.add_linear([(1, self.xvar[i])], "<=", 0, f"bound_zero_{i}")
            if lx[i] > 0.5:
                b.add_linear([(1, self.xvar[i])], ">=", 1, f"bound_one_{i}")
        self.t = b.new_time("iteration", d.total_time_s(lx), self.upper_s)

    def _upper_time(self) -> float:
        d = self.data
        costs = [d.hop_cost(), d.emb_cost()] + [d.ring_cost(s) for s in range(d.plan.pp)]
        finite = max(float(c[np.isfinite(c)].max(initial=0.0)) for c in costs)
        g = self.data.instance.cluster.gpus_per_node
        groups = max(group_worst_x(d).values(), default=0.0)
        return max(finite * g * max(d.plan.replicas, 1), groups) + 1.0

    def nodes_of(self, u: int) -> dict[int, list[Any]]:
        """Indicators of unit ``u`` being on each node, as lists of place literals."""
        out: dict[int, list[Any]] = {}
        for p, lit in self.place[u].items():
            out.setdefault(int(self.data.place_node[p]), []).append(lit)
        return out

    # ------------------------------------------------------------ structure
    def add_placement_bijection(self) -> None:
        """Every unit on exactly one place; a place holds at most its free slots."""
        users: dict[int, list[Any]] = {}
        for u, lits in enumerate(self.place):
            free = [lit for lit in lits.values() if not _const(lit)]
            if free:
                self.b.add_linear([(1, x) for x in free], "==", 1, f"one_place_{u}")
            for p, lit in lits.items():
                users.setdefault(p, []).append(lit)
        for p, held in users.items():
            fixed = sum(1 for x in held if _const(x))
            terms = [(1, x) for x in held if not _const(x)]
            cap = int(self.data.capacity[p]) - fixed
            if cap < 0:  # units whose only place it is (e.g. the only GPU with the memory)
                raise InfeasibleError(
                    f"{fixed} units can only go to place {p}, which has room for "
                    f"{int(self.data.capacity[p])} (memory or failed links)"
                )
            if terms and len(terms) > cap:
                self.b.add_linear(terms, "<=", cap, f"capacity_{p}")

    def add_tp_within_node(self) -> None:
        """Nothing to add: every place is a tensor group (or a set of them) of one node,
        or of one NVLink domain when tp exceeds a node, so the tp ranks of a unit never
        span nodes (domains); checked here once."""
        d = self.data
        cluster = d.instance.cluster
        for p, slots in enumerate(d.place_slots):
            gpus = d.slot_gpus[slots]
            if d.plan.tp <= cluster.gpus_per_node:
                assert (gpus // cluster.gpus_per_node == d.place_node[p]).all()
            assert (gpus // cluster.gpus_per_domain == self.domain_of_node[d.place_node[p]]).all()

    def add_memory_limit(self) -> None:
        """Domains hold only places whose GPU type fits the stage (checked here)."""
        for u, lits in enumerate(self.place):
            assert all(self.data.allowed[self.data.stage_of(u), p] for p in lits)

    def add_no_failed_link(self) -> None:
        """No unit pair that exchanges data on a failed link: ``place[u,p] + sum of the
        places q of v with a failed p-q link <= 1``."""
        d = self.data
        bad_any = ~np.isfinite(d.inv_bw) | ~np.isfinite(d.inv_bw.T)
        bad_dir = ~np.isfinite(d.inv_bw)
        for family, edges in d.edges().items():
            bad = bad_dir if family in RING_FAMILIES else bad_any
            for k, (_, u, v) in enumerate(edges):
                for p, lit in self.place[u].items():
                    worse = [x for q, x in self.place[v].items() if bad[p, q] and q != p]
                    if not worse:
                        continue
                    terms = [(1, x) for x in [lit, *worse] if not _const(x)]
                    rhs = 1 - sum(1 for x in [lit, *worse] if _const(x))
                    self.b.add_linear(terms, "<=", rhs, f"no_failed_link_{family}_{k}_{p}")

    # ------------------------------------------------------------ costs
    def _max_over_pairs(self, i: int, cost: np.ndarray, u: int, v: int, name: str) -> None:
        """``x[i] >= cost[p, q]`` whenever u is on p and v on q (failed pairs skipped);
        pairs dearer than the input's upper bound (``objective_bound`` family: no
        placement as fast as the incumbent uses them) are forbidden outright."""
        var, cap = self.xvar[i], self.upper_x[i] * (1 + 1e-12)
        pu, pv = self.place[u], self.place[v]
        for first, second, mat, tag in ((pu, pv, cost, "a"), (pv, pu, cost.T, "b")):
            for p, lit in first.items():
                row = {q: float(mat[p, q]) for q in second if np.isfinite(mat[p, q])}
                dear = [second[q] for q, c in row.items() if c > cap]
                if dear and tag == "a":
                    clique = [(1, x) for x in [lit, *dear] if not _const(x)]
                    rhs = 1 - sum(1 for x in [lit, *dear] if _const(x))
                    self.b.add_linear(clique, "<=", rhs, f"objective_bound_{name}_{p}")
                if tag == "b" and (len(pu) == 1 or len(pv) == 1):
                    break  # the mirror adds nothing when one side is fixed
                ok = {q: c for q, c in row.items() if c <= cap}
                if not ok:
                    continue
                floor = min(ok.values())  # sum of second's places is 1 when lit holds
                shifted = [(c - floor, second[q]) for q, c in ok.items() if c > floor]
                const = floor + sum(c for c, x in shifted if _const(x))
                terms = [(c, x) for c, x in shifted if not _const(x)]
                enforce = None if _const(lit) else lit
                self.b.add_time_bound(var, terms, const, enforce, f"{name}_{tag}{p}")

    def add_hop_costs(self) -> None:
        """Each boundary's activation and gradient hop >= every replica's flow time."""
        d, xi = self.data, self.data.xi
        fwd = d.hop_cost()
        bwd = d.hop_back_cost()
        for s, u, v in d.edges()["hop"]:
            self._max_over_pairs(int(xi.hf[s]), fwd, u, v, f"hop_fwd_{s}_{u}")
            self._max_over_pairs(int(xi.hb[s]), bwd, u, v, f"hop_bwd_{s}_{u}")

    def add_ring_costs(self) -> None:
        """Each stage's DP ring >= the bandwidth part of every link, in replica order."""
        d, xi = self.data, self.data.xi
        for s, u, v in d.edges()["ring"]:
            self._max_over_pairs(int(xi.ring[s]), d.ring_cost(s), u, v, f"ring_{s}_{u}")

    def add_embedding_cost(self) -> None:
        """The tied-embedding all-reduce >= every replica's first-last pair."""
        d, xi = self.data, self.data.xi
        if xi.emb is None:
            return
        for _, u, v in d.edges()["emb"]:
            self._max_over_pairs(xi.emb, d.emb_cost(), u, v, f"emb_{u}")

    def _crossing(self, u: int, v: int, n: int, name: str, domain: bool = False) -> Any:
        """0/1 (literal or constant) >= [u on node n and v not] (``domain``: and v not
        on any node of n's NVLink domain)."""
        on_u, of_v = self.nodes_of(u).get(n, []), self.nodes_of(v)
        near = np.flatnonzero(self.domain_of_node == self.domain_of_node[n]) if domain else [n]
        on_v = [x for m in near for x in of_v.get(int(m), [])]
        const = sum(1 for x in on_u if _const(x)) - sum(1 for x in on_v if _const(x))
        terms = [(1, x) for x in on_u if not _const(x)] + [(-1, x) for x in on_v if not _const(x)]
        if not terms:
            return max(const, 0)
        flag = self.b.new_bool(name)
        self.b.add_linear([(1, flag)] + [(-c, x) for c, x in terms], ">=", const, f"def_{name}")
        return flag

    def add_nic_sharing(self) -> None:
        """Flows leaving (entering) a node for another NVLink domain share its NICs
        (:func:`~pipette_cp.solvers.placement.nic_families.add_nic_sharing`)."""
        add_nic_sharing(self)

    def _at_least(self, big: Any, small: Any, name: str) -> None:
        if _const(small):
            if small:
                self.b.add_linear([(1, big)], ">=", 1, name)
        else:
            self.b.add_linear([(1, big), (-1, small)], ">=", 0, name)

    def add_compute_classes(self) -> None:
        """``worse[s, c] >= [a unit of stage s on a place of class <= c]`` (ladder)."""
        d, xi = self.data, self.data.xi
        for (s, c), i in np.ndenumerate(xi.worse):
            for u in range(s * d.plan.replicas, (s + 1) * d.plan.replicas):
                lits = [x for p, x in self.place[u].items() if d.place_class[p] <= c]
                if lits:
                    terms = [(1, self.xvar[i])] + [(-1, x) for x in lits if not _const(x)]
                    rhs = sum(1 for x in lits if _const(x))
                    self.b.add_linear(terms, ">=", rhs, f"class_{s}_{c}_{u}")
            if c + 1 < xi.worse.shape[1]:
                nxt = self.xvar[xi.worse[s, c + 1]]
                self.b.add_linear([(1, nxt), (-1, self.xvar[i])], ">=", 0, f"ladder_{s}_{c}")

    # ------------------------------------------------------------ symmetry
    def add_symmetry_breaking(self) -> None:
        add_symmetry_breaking(self)

    def canonical(self, assign: np.ndarray) -> np.ndarray:
        """The assignment moved to satisfy the symmetry breaking."""
        return canonical(self.data, assign)

    # ------------------------------------------------------------ objective
    def add_cut(self, intercept_s: float, gradient: np.ndarray, name: str) -> None:
        """``t >= intercept + gradient . x`` (gradient >= 0, already snapped)."""
        booleans = set(self.data.xi.booleans.tolist())
        time_terms = [(float(g), self.xvar[i]) for i, g in enumerate(gradient)
                      if g and i not in booleans]  # fmt: skip
        bool_terms = [(float(g), self.xvar[i]) for i, g in enumerate(gradient)
                      if g and i in booleans]  # fmt: skip
        self.b.add_cut(self.t, intercept_s, time_terms, bool_terms, name)

    def set_objective(self) -> None:
        self.b.minimise(self.t)

    def set_hint(self, assign: np.ndarray) -> None:
        values: dict[Any, int] = {}
        for u, lits in enumerate(self.place):
            for p, x in lits.items():
                if not _const(x):
                    values[x] = int(p == assign[u])
        self.b.hint(values)

    def recorded(self, solutions: tuple[tuple[int, ...], ...]) -> list[np.ndarray]:
        """Assignments of the solutions the backend recorded (watched values)."""
        base = np.array([next(iter(lits)) if len(lits) == 1 else -1 for lits in self.place])
        out = []
        for values in solutions:
            assign = base.copy()
            for (u, p, _), v in zip(self.watched, values, strict=True):
                if v:
                    assign[u] = p
            out.append(assign)
        return out

    def extract(self) -> np.ndarray:
        """The assignment of the last solution."""
        out = np.empty(len(self.place), dtype=np.int64)
        for u, lits in enumerate(self.place):
            out[u] = next(p for p, x in lits.items() if _const(x) or self.b.value(x) > 0.5)
        return out
