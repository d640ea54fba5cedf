"""User constraint families for the split and placement models (CP-SAT and MILP).

A researcher adds a constraint to both solvers from their own code, without
editing the package: subclass :class:`ConstraintFamily`, write its rows once
against a small context (the same rows go to CP-SAT and to the MILP, because
both masters expose the same ``add_linear``), say how to recognise a violating
plan, and pass an instance to ``solve(..., constraints=[...])``.

* :meth:`ConstraintFamily.placement` gets a :class:`PlacementContext`: the units
  (one per pipeline stage and data-parallel replica, ``tp`` GPUs each), the
  places they may take (a node, or a tp-aligned GPU block), the 0/1 literal
  ``place(u, p)``, ``forbid`` and ``add_linear``.
* :meth:`ConstraintFamily.split` gets a :class:`SplitContext`: the integer
  layer counts per virtual stage and ``add_linear``.
* :meth:`ConstraintFamily.violations` checks a finished plan: heuristic plans
  (Megatron's order, random, Pipette's SA, greedy) know nothing of the family,
  so the solvers drop hints that violate it and the search drops plans that do.

Example: keep the first pipeline stage off node 0 (say its NIC is degraded)::

    class AvoidNode(ConstraintFamily):
        name = "stage0_off_node0"

        def placement(self, ctx):
            for u in ctx.units_of_stage(0):
                for p in ctx.places_on_node(0):
                    ctx.forbid(u, p)

        def violations(self, instance, plan):
            g = instance.cluster.gpus_per_node
            bad = [r for r, unit in enumerate(plan.placement[: plan.replicas]) if unit[0] // g == 0]
            return [f"replica {r}: stage 0 on node 0" for r in bad]

Families are hard constraints; objective terms are not offered (the Kelley
bound of the masters is a bound on the iteration time only).  In each master a user
family is one more family of its list, the hard-only case of the masters' family
protocol: rows and a check, no inputs
(:class:`~pipette_cp.solvers.placement.families.hard.user.UserFamily`,
:class:`~pipette_cp.solvers.split.families.UserSplitFamily`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from pipette_cp.specs import Instance, Plan

#: ``[(coefficient, variable), ...]``; integer coefficients, variables from a context.
LinearTerms = Sequence[tuple[int, Any]]


class RowSink(Protocol):
    """Takes integer rows (a placement backend, or the split model)."""

    def add_linear(self, terms: LinearTerms, sense: str, rhs: int, name: str) -> None: ...


class PlacementMaster(Protocol):
    """What :class:`PlacementContext` reads of the placement master
    (:class:`~pipette_cp.solvers.placement.model.PlacementModel`): its data
    (:class:`~pipette_cp.solvers.placement.data.PlacementData`), the literals
    ``place[unit][place]`` and the backend ``b`` (``new_bool``, ``add_linear``)."""

    @property
    def data(self) -> Any: ...

    place: list[dict[int, Any]]
    b: Any


class ConstraintFamily:
    """Base class of a user constraint family (override what applies).

    ``name`` labels the family's rows in the exported models and its messages.
    """

    name: str = "user_family"

    def placement(self, ctx: PlacementContext) -> None:
        """Add the family's rows to the placement master (default: none)."""

    def split(self, ctx: SplitContext) -> None:
        """Add the family's rows to the layer-split master (default: none)."""

    def violations(self, instance: Instance, plan: Plan) -> list[str]:
        """Why ``plan`` violates the family (empty: it satisfies it)."""
        raise NotImplementedError(f"{type(self).__name__} must say which plans violate it")


def family_violations(
    families: Sequence[ConstraintFamily], instance: Instance, plan: Plan
) -> list[str]:
    """Every violation of every family, prefixed with the family's name."""
    return [f"{f.name}: {v}" for f in families for v in f.violations(instance, plan)]


class PlacementContext:
    """What a family sees of the placement master.

    Unit ``u = stage * dp + replica`` holds the ``tp`` ranks of one stage of one
    data-parallel replica.  Place ``p`` is a node (when all nodes look alike to
    the model) or one tp-aligned GPU block; :meth:`gpus_of_place` lists its GPUs.
    """

    def __init__(self, model: PlacementMaster) -> None:
        self._model = model
        self.data = model.data
        self.instance: Instance = model.data.instance
        self.plan: Plan = model.data.plan
        self._rows = 0

    @property
    def num_units(self) -> int:
        return self.data.num_units

    @property
    def num_places(self) -> int:
        return self.data.num_places

    def stage_of(self, unit: int) -> int:
        return unit // self.plan.replicas

    def replica_of(self, unit: int) -> int:
        return unit % self.plan.replicas

    def units_of_stage(self, stage: int) -> list[int]:
        return [stage * self.plan.replicas + r for r in range(self.plan.replicas)]

    def node_of_place(self, place: int) -> int:
        return int(self.data.place_node[place])

    def places_on_node(self, node: int) -> list[int]:
        return [int(p) for p in np.flatnonzero(self.data.place_node == node)]

    def gpus_of_place(self, place: int) -> list[int]:
        slots = self.data.place_slots[place]
        return sorted(int(g) for g in self.data.slot_gpus[slots].ravel())

    def place(self, unit: int, place: int) -> Any:
        """The 0/1 literal "unit on place" (an int 0 or 1 when it is fixed)."""
        return self._model.place[unit].get(place, 0)

    def on_node(self, unit: int, node: int) -> list[Any]:
        """Literals whose sum is 1 exactly when ``unit`` is on ``node``."""
        return [self.place(unit, p) for p in self.places_on_node(node)]

    def new_bool(self, name: str) -> Any:
        """A fresh 0/1 variable (e.g. an indicator the family links to literals)."""
        return self._model.b.new_bool(f"user_{name}")

    def add_linear(self, terms: LinearTerms, sense: str, rhs: int, name: str = "") -> None:
        """``sum coef * var (sense) rhs``, sense one of ``<=``, ``>=``, ``==``;
        fixed literals (ints) are folded into the right-hand side."""
        free = [(int(c), x) for c, x in terms if not isinstance(x, int | np.integer)]
        fixed = sum(int(c) * int(x) for c, x in terms if isinstance(x, int | np.integer))
        self._rows += 1
        label = f"user_{name or 'row'}_{self._rows}"
        if not free:  # constant row: keep it, as an infeasible model if it fails
            ok = {"<=": fixed <= rhs, ">=": fixed >= rhs, "==": fixed == rhs}[sense]
            if not ok:
                z = self._model.b.new_bool(f"{label}_false")
                self._model.b.add_linear([(1, z)], "==", 2, label)
            return
        self._model.b.add_linear(free, sense, int(rhs) - fixed, label)

    def forbid(self, unit: int, place: int) -> None:
        """Unit ``unit`` may not take place ``place``."""
        self.add_linear([(1, self.place(unit, place))], "<=", 0, f"forbid_{unit}_{place}")


@dataclass
class SplitContext:
    """What a family sees of the layer-split master: ``layers[v]`` is the integer
    number of layers of virtual stage ``v`` (chunk ``v // pp`` of stage ``v % pp``)."""

    instance: Instance
    plan: Plan
    layers: list[Any]
    master: RowSink

    def add_linear(self, terms: LinearTerms, sense: str, rhs: int, name: str = "") -> None:
        """``sum coef * layers (sense) rhs`` in both masters."""
        self.master.add_linear([(int(c), x) for c, x in terms], sense, int(rhs), name or "user")
