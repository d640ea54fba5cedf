"""A verifier for one placement family, in the style of a constraint verifier: build the
master with only that family (plus the bijection every master needs, and whatever else
the test names), pin an assignment, and check what the master makes of it, on both
backends (CP-SAT and the MILP).

``verify(instance, plan, *families).given(assign)`` pins unit ``u`` to place
``assign[u]`` and then:

- :meth:`Pinned.is_feasible` / :meth:`Pinned.is_infeasible`: whether the pinned master
  has a solution;
- :meth:`Pinned.costs`: the master's least sum of the families' inputs (times in s, 0/1
  indicators counted as 1) equals that sum read off the Evaluator
  (:meth:`~pipette_cp.solvers.placement.data.PlacementData.x_of`), and ``expected`` when
  given; returns it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pytest

from pipette_cp.solvers.placement import BACKENDS
from pipette_cp.solvers.placement.build import build_placement_data
from pipette_cp.solvers.placement.data import Family, PlacementData
from pipette_cp.solvers.placement.families.group_tables import GroupTables, group_tables
from pipette_cp.solvers.placement.families.hard.bijection import PlacementBijection
from pipette_cp.solvers.placement.model import PlacementModel
from pipette_cp.specs import Instance, Plan
from tests.solvers.placement.test_group_masters import setup, uneven

#: CP-SAT reads each input up to 1 ns low; the MILP is solved to its tolerances.
ABS_S = 2e-9


@dataclass
class Verifier:
    """The master of ``families`` (after the bijection) on ``plan``'s units."""

    instance: Instance
    plan: Plan
    families: tuple[Family, ...]

    @cached_property
    def data(self) -> PlacementData:
        return build_placement_data(
            self.instance, self.plan, families=(PlacementBijection(), *self.families)
        )

    def given(self, assign) -> Pinned:
        assign = np.asarray(assign, dtype=np.int64)
        assert len(assign) == self.data.num_units, "one place per unit"
        return Pinned(self, assign)

    def assignments(self, count: int, seed: int = 0):
        """Random assignments within the places' capacities."""
        rng = np.random.default_rng(seed)
        seats = np.repeat(np.arange(self.data.num_places), self.data.capacity)
        for _ in range(count):
            yield self.given(rng.permutation(seats)[: self.data.num_units])


def verify(instance: Instance, plan: Plan, *families: Family) -> Verifier:
    return Verifier(instance, plan, families)


@dataclass
class Pinned:
    verifier: Verifier
    assign: np.ndarray

    def solve(self, backend: str) -> tuple[str, float | None]:
        """Status and least sum of the families' inputs of the pinned master."""
        data = self.verifier.data
        xi = data.xi
        if any(not data.allowed[data.stage_of(u), p] for u, p in enumerate(self.assign)):
            return "infeasible", None  # outside the unit's domain: no variable to pin
        upper = np.full(xi.size, np.inf)
        upper[xi.booleans] = 1.0
        full = [np.flatnonzero(data.allowed[data.stage_of(u)]) for u in range(data.num_units)]
        model = PlacementModel(data, BACKENDS[backend](), full, np.zeros(xi.size), upper, 1e3)
        for u, p in enumerate(self.assign):
            lit = model.place[u][int(p)]
            if not isinstance(lit, int):
                model.b.add_linear([(1, lit)], "==", 1, f"pin_{u}")
        total = model.b.new_time("family_sum", 0.0, 1e3)  # the objective: sum of the inputs
        flags = set(xi.booleans.tolist())
        times = [(1.0, model.xvar[i]) for i in range(xi.size) if i not in flags]
        model.b.add_cut(total, 0.0, times, [(1.0, model.xvar[i]) for i in sorted(flags)], "sum")
        model.b.minimise(total)
        res = model.b.solve(30.0, 1, 0)
        return res.status, res.objective_s

    def is_feasible(self) -> None:
        for backend in BACKENDS:
            status, _ = self.solve(backend)
            assert status == "optimal", (backend, status)

    def is_infeasible(self) -> None:
        for backend in BACKENDS:
            status, _ = self.solve(backend)
            assert status == "infeasible", (backend, status)

    def reads(self) -> np.ndarray:
        """The inputs of the assignment as the Evaluator gives them."""
        return self.verifier.data.x_of(self.assign)

    def costs(self, expected: float | None = None) -> float:
        read = float(self.reads().sum())
        if expected is not None:
            assert read == pytest.approx(expected, rel=1e-12)
        for backend in BACKENDS:
            status, value = self.solve(backend)
            assert status == "optimal", (backend, status)
            tolerance = ABS_S * max(self.verifier.data.xi.size, 1)
            assert value == pytest.approx(read, rel=1e-9, abs=tolerance), backend
        return read


def verify_group_family(
    layout: tuple, gpus: int, family: Family, priced: str
) -> tuple[Verifier, GroupTables, Plan]:
    """A verifier of a group family (all-to-all, context rings, expert rings) on the
    uneven cluster of the group masters' tests, whose tables price it (``priced``)."""
    instance, plan = setup(layout, gpus, uneven(4, gpus))
    verifier = verify(instance, plan, family)
    tables = group_tables(verifier.data)
    assert tables is not None and priced in tables.priced
    return verifier, tables, plan
