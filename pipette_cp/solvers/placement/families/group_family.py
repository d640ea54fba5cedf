"""What the three families priced from the group tables share.

The expert all-to-alls, the context-parallel rings and the expert rings
(:mod:`~pipette_cp.solvers.placement.families.alltoall`,
:mod:`~pipette_cp.solvers.placement.families.context_rings`,
:mod:`~pipette_cp.solvers.placement.families.expert_rings`) take their edges, their
exactness and their reading of an assignment from the problem's
:func:`~pipette_cp.solvers.placement.families.group_tables.group_tables`, write rows only
where the tables price them, and bound their inputs by one worst value per input.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipette_cp.solvers.placement.data import Family, MasterView, PlacementData
from pipette_cp.solvers.placement.families.group_tables import (
    GroupTables,
    group_reading,
    group_tables,
)
from pipette_cp.solvers.placement.family import Edge, Reading, TimeParts


class GroupFamily(Family):
    """A family whose inputs are read from the group tables (module docstring).

    ``name`` is its key in :attr:`~pipette_cp.solvers.placement.families.group_tables.
    GroupTables.priced`; ``inputs`` names its slots, the time input first, each also a
    field of :class:`~pipette_cp.solvers.placement.families.group_tables.GroupInputs`.
    The hooks below are called only where the layout has group tables.
    """

    inputs: tuple[str, ...] = ()

    def table_edges(self, g: GroupTables) -> Sequence[Edge]:
        """Its unit pairs in the tables."""
        raise NotImplementedError

    def priced_rows(self, m: MasterView, g: GroupTables) -> None:
        """Its rows, where the tables price the family."""
        raise NotImplementedError

    def add_time(self, data: PlacementData, g: GroupTables, x: np.ndarray, t: TimeParts) -> None:
        """Add its communication time of ``x`` to ``t`` (the layout has its inputs)."""
        raise NotImplementedError

    def worst_inputs(self, data: PlacementData, g: GroupTables) -> float | np.ndarray:
        """What each of its time inputs reaches at most (one value for all, or one each)."""
        raise NotImplementedError

    # ------------------------------------------------------------ the family's hooks
    def edges(self, data: PlacementData) -> list[Edge] | None:
        g = group_tables(data)
        return None if g is None else list(self.table_edges(g))

    def exact(self, data: PlacementData) -> bool:
        g = group_tables(data)  # the three group families share the tables' verdict
        return g is None or g.exact

    def add_rows(self, m: MasterView) -> None:
        g = group_tables(m.data)
        if g is not None and self.name in g.priced:
            self.priced_rows(m, g)

    def read(self, data: PlacementData, reading: Reading, x: np.ndarray) -> None:
        g = group_tables(data)
        if g is not None:
            read = group_reading(data, g, reading)
            for name in self.inputs:
                x[data.xi[name]] = getattr(read, name)

    def communicate(self, data: PlacementData, x: np.ndarray, times: TimeParts) -> None:
        g = group_tables(data)
        if data.xi[self.inputs[0]].size and g is not None:
            self.add_time(data, g, x, times)

    def worst(self, data: PlacementData, x: np.ndarray) -> None:
        g = group_tables(data)
        if data.xi[self.inputs[0]].size and g is not None:
            x[data.xi[self.inputs[0]]] = self.worst_inputs(data, g)

    def time_cap(self, data: PlacementData) -> float:
        g = group_tables(data)
        if not data.xi[self.inputs[0]].size or g is None:
            return 0.0
        return float(np.max(self.worst_inputs(data, g)))
