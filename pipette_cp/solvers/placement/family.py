"""The placement family protocol: what one family of constraints or costs brings.

A *family* is one object that knows everything of one kind of row of the placement
master: the hard families (``placement_bijection``, ``tp_within_node``, ``memory_limit``,
``no_failed_link``, a user's :class:`~pipette_cp.solvers.extensions.ConstraintFamily`),
the cost families (pipeline hops, data-parallel rings, the tied embedding, NIC sharing,
expert all-to-alls, context-parallel and expert rings, the compute-class ladder) and the
symmetry breaking.  :class:`PlacementFamily` lists its hooks; each has a default that
contributes nothing, so a family overrides only what it has:

- **inputs** (:meth:`~PlacementFamily.slots`): its entries of the master's input vector
  ``x`` (times in s, 0/1 indicators), from which :class:`XIndex` is assembled, family by
  family in list order;
- **tables**: its unit pairs (:meth:`~PlacementFamily.edges`, ``one_way`` for rings),
  their flow costs for the local search (:meth:`~PlacementFamily.flow_costs`), whether its
  rows price the Evaluator exactly (:meth:`~PlacementFamily.exact`); cost matrices are
  the family's own, kept in the problem's memo;
- **rows** for CP-SAT and the MILP, through
  :class:`~pipette_cp.solvers.placement.backend.Backend` (:meth:`~PlacementFamily.add_inputs`,
  :meth:`~PlacementFamily.add_indicators`, :meth:`~PlacementFamily.add_rows`), over what a
  family sees of the master (:class:`Master`);
- **value** on an assignment: its part of ``x_of`` (:meth:`~PlacementFamily.read`), of the
  iteration time of ``x`` (:meth:`~PlacementFamily.compute`,
  :meth:`~PlacementFamily.communicate`), and for a hard family the rows no input carries
  (:meth:`~PlacementFamily.admits`);
- **bounds** of Kelley's loop: its flow classes (:meth:`~PlacementFamily.classes`, whose
  per-class bound :mod:`~pipette_cp.solvers.placement.kelley` computes), its own lower,
  floor and worst values (:meth:`~PlacementFamily.lower`, :meth:`~PlacementFamily.floor`,
  :meth:`~PlacementFamily.worst`) and the cap of its time variables
  (:meth:`~PlacementFamily.time_cap`);
- **check**: the name of the checker's function (:data:`pipette_cp.checker.CHECKS`) that
  refuses a plan breaking a hard family.

This module imports neither the model nor the problem data: the protocol is generic in
the data type ``D`` (:class:`~pipette_cp.solvers.placement.data.PlacementData`, which
names the specialisation :data:`~pipette_cp.solvers.placement.data.Family`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from pipette_cp.cost.schedule.critical_path import PipelineInputs
from pipette_cp.solvers.placement.backend import Backend

D = TypeVar("D")
D_co = TypeVar("D_co", covariant=True)

#: ``(index, u, v)``: units ``u`` and ``v`` exchange data for input class ``index``.
Edge = tuple[int, int, int]
#: ``(position in x, pair cost matrix, stage of u, stage of v, memo key)`` of a flow class:
#: the input is the largest cost over the class's flows (classes of one key share a matrix).
FlowClass = tuple[int, np.ndarray, int, int, tuple]


@dataclass(frozen=True)
class Slot:
    """Inputs of one name: ``shape`` entries of ``x``, times (s) or 0/1 indicators.
    ``label``: the master variables' names, formatted with the entry's index."""

    name: str
    shape: tuple[int, ...]
    boolean: bool = False
    label: str = ""

    def name_of(self, index: tuple[int, ...]) -> str:
        return (self.label or self.name + "_{}" * len(self.shape)).format(*index)


@dataclass(frozen=True)
class XIndex:
    """Positions of the master's inputs in ``x``, by slot name (:func:`assemble`).

    ``xi["ring"]`` (or ``xi.ring``) is an array of positions of the slot's shape;
    ``booleans`` the positions of 0/1 indicators, in ``x`` order."""

    positions: dict[str, np.ndarray]
    slots: dict[str, Slot]
    size: int
    booleans: np.ndarray

    @classmethod
    def assemble(cls, slots: Sequence[Slot]) -> XIndex:
        """The index of ``slots`` laid out one after another (names must differ)."""
        positions, kinds, pos, flags = {}, {}, 0, []
        for slot in slots:
            if slot.name in positions:
                raise ValueError(f"two families declare the input {slot.name!r}")
            n = int(np.prod(slot.shape, dtype=np.int64))
            positions[slot.name] = np.arange(pos, pos + n).reshape(slot.shape)
            kinds[slot.name] = slot
            if slot.boolean:
                flags.append(positions[slot.name].ravel())
            pos += n
        booleans = np.concatenate(flags).astype(int) if flags else np.zeros(0, dtype=int)
        return cls(positions, kinds, pos, booleans)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.positions[name]

    def get(self, name: str) -> np.ndarray:
        """Positions of ``name``, empty when no family of the problem declares it."""
        return self.positions.get(name, np.zeros(0, dtype=int))

    def __getattr__(self, name: str) -> np.ndarray:
        if name.startswith("__") or name in ("positions", "slots", "size", "booleans"):
            raise AttributeError(name)
        try:
            return self.positions[name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass
class Reading:
    """What :meth:`~pipette_cp.solvers.placement.data.PlacementData.x_of` reads once per
    assignment: the units' GPUs ``(pp, dp, tp)``, the Evaluator's schedule inputs and one
    layer's times; ``memo`` holds what several families share (the group inputs)."""

    assign: np.ndarray
    gpus: np.ndarray
    inputs: PipelineInputs
    layer: tuple
    memo: dict = field(default_factory=dict)


@dataclass
class TimeParts:
    """The schedule inputs as the families build them from ``x``: the compute family
    sets the stage times, the others add their communication.  The arrays start as
    read-only zeros: a family replaces an array (``times.sync = times.sync + s``), never
    writes into one.  ``layer``: one layer's (forward, backward) on stage 0's slowest
    class, where per-layer collectives hide behind it (ZeRO-2/3), else None."""

    forward: np.ndarray
    backward: np.ndarray
    optimizer: np.ndarray
    fwd_hop: np.ndarray
    bwd_hop: np.ndarray
    sync: np.ndarray
    gather: np.ndarray
    embedding: float = 0.0
    layer: tuple[float, float] | None = None


class Master(Protocol[D_co]):
    """What a family sees of the master while it writes rows
    (:class:`~pipette_cp.solvers.placement.model.PlacementModel`): the problem, the
    backend, ``place[u][p]`` (a 0/1 variable, or the constant 1 where the unit is fixed),
    the variables of the inputs (``xvar[i]`` for position ``i`` of ``x``), their lower
    bounds, the largest values an improving placement affords (``upper_x``, reduced-cost
    fixing; infinite where unknown) and the caps of the time variables (``cap_x``), each
    node's NVLink domain, and whether the symmetry breaking is on."""

    @property
    def data(self) -> D_co: ...

    b: Backend
    place: list[dict[int, Any]]
    xvar: list[Any]
    xi: XIndex
    lower_x: np.ndarray
    upper_x: np.ndarray
    cap_x: np.ndarray
    domain_of_node: np.ndarray
    symmetry: bool


class PlacementFamily(Generic[D]):
    """One family of the placement master (module docstring); every hook has a default
    that contributes nothing.

    ``name`` labels the family (its edges in :meth:`edges`' table); ``check`` names the
    checker function a plan breaking it fails (hard families); ``one_way``: its flows
    carry data one way (rings), else both; ``symmetric``: its rows and value are
    invariant under the replica rotations that map every family's edges onto themselves
    (the symmetry breaking is dropped when a family is not)."""

    name: str = ""
    check: str | None = None
    one_way: bool = False
    symmetric: bool = True

    # ------------------------------------------------------------ inputs and tables
    def slots(self, data: D) -> Sequence[Slot]:
        """Its inputs in ``x`` (possibly of size 0 where the layout has none)."""
        del data
        return ()

    def edges(self, data: D) -> list[Edge] | None:
        """The unit pairs its flows join (None: a family without flows)."""
        del data
        return None

    def reordered(self, data: D) -> bool:
        """Whether its edges are the rank-order links of rings NCCL reorders (its own
        rows then forbid the failed links NCCL's ring would take, not the pairs')."""
        del data
        return False

    def flow_costs(
        self, data: D, index: np.ndarray, p: np.ndarray, q: np.ndarray
    ) -> Sequence[np.ndarray] | None:
        """Seconds of the flows of edges of class ``index`` between places ``p`` and ``q``
        (one array per direction priced); None: each at the pair's inverse bandwidth."""
        del data, index, p, q
        return None

    def exact(self, data: D) -> bool:
        """Whether its rows price the Evaluator exactly (else they bound it)."""
        del data
        return True

    # ------------------------------------------------------------ rows
    def add_inputs(self, m: Master[D]) -> None:
        """Variables of its time inputs (default: one per entry of each time slot)."""
        for slot in self.slots(m.data):
            if not slot.boolean:
                for index, i in np.ndenumerate(m.xi[slot.name]):
                    lo = float(m.lower_x[i])
                    m.xvar[i] = m.b.new_time(slot.name_of(index), lo, max(float(m.cap_x[i]), lo))

    def add_indicators(self, m: Master[D]) -> None:
        """Variables of its 0/1 inputs, made after every family's time inputs (default:
        one per entry of each boolean slot)."""
        for slot in self.slots(m.data):
            if slot.boolean:
                for index, i in np.ndenumerate(m.xi[slot.name]):
                    m.xvar[i] = m.b.new_bool(slot.name_of(index))

    def add_rows(self, m: Master[D]) -> None:
        """Its rows (a hard family's constraints; a cost family's lower bounds on its inputs)."""

    def canonical(self, data: D, assign: np.ndarray) -> np.ndarray:
        """The assignment moved into what its rows allow, at the same value (symmetry)."""
        del data
        return assign

    # ------------------------------------------------------------ value of an assignment
    def read(self, data: D, reading: Reading, x: np.ndarray) -> None:
        """Write its inputs of the assignment into ``x`` (the Evaluator's values); called
        only where the family has inputs in the problem, as :meth:`communicate` is."""

    def admits(self, data: D, assign: np.ndarray) -> bool:
        """Whether the assignment satisfies it where ``x_of`` does not already refuse it."""
        del data, assign
        return True

    def compute(self, data: D, x: np.ndarray, times: TimeParts) -> None:
        """Set the stages' compute times of ``x`` (run before every :meth:`communicate`)."""

    def communicate(self, data: D, x: np.ndarray, times: TimeParts) -> None:
        """Add its communication time of ``x`` to ``times``."""

    # ------------------------------------------------------------ bounds
    def classes(self, data: D) -> list[FlowClass]:
        """Its inputs that are the largest cost over a class of flows (bounded per class)."""
        del data
        return []

    def lower(self, data: D, x: np.ndarray) -> None:
        """Raise its inputs in ``x`` to values no placement beats (beyond its classes')."""

    def floor(self, data: D, x: np.ndarray) -> None:
        """Lower its inputs in ``x`` to what any algorithm the final Evaluator may choose
        could take (the bound where it is not the master's)."""

    def worst(self, data: D, x: np.ndarray) -> None:
        """Raise its inputs in ``x`` to values no placement exceeds (``x`` starts at its
        classes' dearest pairs, 1 elsewhere)."""

    def time_cap(self, data: D) -> float:
        """Seconds none of its time inputs exceeds in a placement worth keeping (caps the
        time variables; any such value is valid)."""
        del data
        return 0.0
