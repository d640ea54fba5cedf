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

from pipette_cp.solvers.placement.data import Family, MasterView, PlacementData
from pipette_cp.solvers.placement.families.group_tables import (
    cp_exposure,
    group_reading,
    group_tables,
    per_byte_worst,
)
from pipette_cp.solvers.placement.families.rows import ring_rows
from pipette_cp.solvers.placement.family import Edge, Reading, Slot, TimeParts


class ContextParallelRings(Family):
    """The context-parallel ring step of every stage (module docstring)."""

    name = "cp"
    one_way = True

    def slots(self, data: PlacementData) -> Sequence[Slot]:
        g = group_tables(data)
        return (Slot("cps", (data.plan.pp if g is not None and g.cp else 0,), label="cp_step_{}"),)

    def edges(self, data: PlacementData) -> list[Edge] | None:
        g = group_tables(data)
        return None if g is None else list(g.cp_edges)

    def exact(self, data: PlacementData) -> bool:
        g = group_tables(data)  # the three group families share the tables' verdict
        return g is None or g.exact

    def add_rows(self, m: MasterView) -> None:
        g = group_tables(m.data)
        if g is not None and "cp" in g.priced:
            coef = np.full(m.data.plan.pp, g.cp_chunk_bytes)
            ring_rows(m, "cp", list(g.cp_edges), m.xi["cps"], coef, None)

    def read(self, data: PlacementData, reading: Reading, x: np.ndarray) -> None:
        g = group_tables(data)
        if g is not None:
            x[data.xi["cps"]] = group_reading(data, g, reading).cps

    def communicate(self, data: PlacementData, x: np.ndarray, times: TimeParts) -> None:
        cps = data.xi["cps"]
        g = group_tables(data)
        if cps.size and g is not None:
            f, b = cp_exposure(g, data.plan.cp, x[cps])
            times.forward, times.backward = times.forward + f, times.backward + b

    def worst(self, data: PlacementData, x: np.ndarray) -> None:
        for i in data.xi["cps"]:
            x[i] = self._worst(data)

    def time_cap(self, data: PlacementData) -> float:
        return self._worst(data) if data.xi["cps"].size else 0.0

    @staticmethod
    def _worst(data: PlacementData) -> float:
        """One chunk at the slowest link or NIC share."""
        g = group_tables(data)
        assert g is not None
        return g.cp_chunk_bytes * per_byte_worst(data)
