"""Context-parallel rings: each stage's K/V ring step at its slowest link.

Input ``cps[s]`` (s): one ring step of stage ``s`` (``chunk / bandwidth`` of its slowest
ring link), exposed per layer as ``(cp - 1) max(0, step - core / cp)`` forward (twice
the bytes backward, again under recomputation;
:func:`~pipette_cp.solvers.placement.families.group_tables.cp_exposure`), convex in the
step.  Rows (where priced): as the DP ring's, every link at its bandwidth and at its
node's NIC share, both ends (:func:`~pipette_cp.solvers.placement.families.rows.ring_rows`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipette_cp.solvers.placement.data import MasterView, PlacementData
from pipette_cp.solvers.placement.families.group_family import GroupFamily
from pipette_cp.solvers.placement.families.group_tables import (
    GroupTables,
    cp_exposure,
    group_tables,
    per_byte_worst,
)
from pipette_cp.solvers.placement.families.rows import ring_rows
from pipette_cp.solvers.placement.family import Edge, Slot, TimeParts


class ContextParallelRings(GroupFamily):
    """The context-parallel ring step of every stage (module docstring)."""

    name = "cp"
    one_way = True
    inputs = ("cps",)

    def slots(self, data: PlacementData) -> Sequence[Slot]:
        g = group_tables(data)
        return (Slot("cps", (data.plan.pp if g is not None and g.cp else 0,), label="cp_step_{}"),)

    def table_edges(self, g: GroupTables) -> Sequence[Edge]:
        return g.cp_edges

    def priced_rows(self, m: MasterView, g: GroupTables) -> None:
        coef = np.full(m.data.plan.pp, g.cp_chunk_bytes)
        ring_rows(m, "cp", list(g.cp_edges), m.xi["cps"], coef, None)

    def add_time(self, data: PlacementData, g: GroupTables, x: np.ndarray, t: TimeParts) -> None:
        f, b = cp_exposure(g, data.plan.cp, x[data.xi["cps"]])
        t.forward, t.backward = t.forward + f, t.backward + b

    def worst_inputs(self, data: PlacementData, g: GroupTables) -> float:
        """One chunk at the slowest link or NIC share."""
        return g.cp_chunk_bytes * per_byte_worst(data)
