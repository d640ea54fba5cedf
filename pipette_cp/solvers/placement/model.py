"""The placement master problem, written once over a small backend interface.

One formulation, two solvers: :mod:`pipette_cp.solvers.placement.cpsat` and
:mod:`pipette_cp.solvers.placement.milp` implement
:class:`~pipette_cp.solvers.placement.backend.Backend` (integer scaling for CP-SAT,
big-M enforcement for the MILP), so both solve exactly the same model.  The model is
built from the problem's list of families (:mod:`pipette_cp.solvers.placement.families`,
the protocol :mod:`pipette_cp.solvers.placement.family`): the hard ones carry the
checker's names (``placement_bijection``, ``tp_within_node``, ``memory_limit``,
``no_failed_link``), the cost ones bound the inputs of ``x``.

Variables: ``place[u, p]`` (unit ``u`` on place ``p``) for ``p`` in the unit's domain;
every family's inputs (:class:`~pipette_cp.solvers.placement.family.XIndex`: hop, ring,
embedding and group times, ring-crossing and compute-class indicators); ``t`` the
iteration time, bounded below by Kelley cuts (:mod:`pipette_cp.solvers.cuts`).  Every
cost row is a lower bound on an input, and every cut has non-negative coefficients, so
at an optimum each input equals the true maximum over its flows.

Build order: the place variables; every family's time inputs, then its indicators (in
list order); the bounds the objective puts on indicators; ``t``; every family's rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipette_cp.solvers.placement.backend import Backend
from pipette_cp.solvers.placement.data import PlacementData


def _const(v: Any) -> bool:
    return isinstance(v, int | np.integer)


class PlacementModel:
    """The master over ``data`` restricted to ``domains[u]`` (places allowed for unit u).

    A unit with a one-place domain is fixed (its indicator is the constant 1),
    which is how LNS sub-problems are built.  ``symmetry`` lets the symmetry-breaking
    family write its rows (only valid when every unit has its full domain; dropped
    where a family is not replica-symmetric, as a user's need not be).
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
        self.data, self.b, self.domains, self.xi = data, backend, domains, data.xi
        per = data.instance.cluster.nodes_per_nvlink_domain
        self.domain_of_node = np.arange(data.instance.cluster.num_nodes) // per
        self.lower_x, self.upper_x, self.upper_s = lower_x, upper_x, upper_s
        self.symmetry = symmetry and all(f.symmetric for f in data.families)
        self.build_variables()
        for family in data.families:
            family.add_rows(self)
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
        cap = max((f.time_cap(d) for f in d.families), default=0.0) + 1.0
        ux = np.minimum(self.upper_x, min(cap, 2.0 * self.upper_s))
        ux[xi.booleans] = self.upper_x[xi.booleans]  # 0/1 indicators: not times
        self.cap_x = ux
        self.xvar: list[Any] = [None] * xi.size
        for family in d.families:
            family.add_inputs(self)
        for family in d.families:
            family.add_indicators(self)
        lx = self.lower_x
        for i in xi.booleans:  # indicators the objective bound forces to 0 (or 1)
            if ux[i] < 0.5:
                b.add_linear([(1, self.xvar[i])], "<=", 0, f"bound_zero_{i}")
            if lx[i] > 0.5:
                b.add_linear([(1, self.xvar[i])], ">=", 1, f"bound_one_{i}")
        self.t = b.new_time("iteration", d.total_time_s(lx), self.upper_s)

    def canonical(self, assign: np.ndarray) -> np.ndarray:
        """The assignment moved to satisfy the symmetry breaking (and any family's rows
        that move assignments at equal value)."""
        for family in self.data.families:
            assign = family.canonical(self.data, assign)
        return assign

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
