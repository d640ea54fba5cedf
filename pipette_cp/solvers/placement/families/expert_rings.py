"""Expert data-parallel rings: each class of expert rings' gradient sync, and whether it
leaves a node.

Where the expert rings differ from the dense ones, inputs ``ering[k]`` (s) and
``ecross[k]`` (0/1) per ring class ``k`` (stage ``k // classes``; the rings of one class
visit the same units): the bandwidth part of their gradient sync and whether they leave
a node (their latency).  A stage's expert sync is its slowest class's
(:func:`~pipette_cp.solvers.placement.families.group_tables.expert_sync`), added to the
dense ring's.  Rows (where priced): as the DP ring's, every link at its bandwidth and
its node's NIC share, both ends, and a class leaving a node pays the inter-node latency
(:func:`~pipette_cp.solvers.placement.families.rows.ring_rows`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipette_cp.solvers.placement.data import Family, MasterView, PlacementData
from pipette_cp.solvers.placement.families.group_tables import (
    expert_sync,
    group_reading,
    group_tables,
    per_byte_worst,
)
from pipette_cp.solvers.placement.families.rows import ring_rows
from pipette_cp.solvers.placement.family import Edge, Reading, Slot, TimeParts


class ExpertRings(Family):
    """The expert ring inputs of every ring class (module docstring)."""

    name = "ering"
    one_way = True

    def slots(self, data: PlacementData) -> Sequence[Slot]:
        g = group_tables(data)
        n = data.plan.pp * g.ering_classes if g is not None else 0
        return Slot("ering", (n,)), Slot("ecross", (n,), boolean=True, label="ering_cross_{}")

    def edges(self, data: PlacementData) -> list[Edge] | None:
        g = group_tables(data)
        return None if g is None else list(g.ering_edges)

    def exact(self, data: PlacementData) -> bool:
        g = group_tables(data)  # the three group families share the tables' verdict
        return g is None or g.exact

    def add_inputs(self, m: MasterView) -> None:
        """Its time inputs and, with them, its crossing indicators."""
        super().add_inputs(m)
        super().add_indicators(m)

    def add_indicators(self, m: MasterView) -> None:
        del m  # made with the time inputs

    def add_rows(self, m: MasterView) -> None:
        g = group_tables(m.data)
        if g is not None and "ering" in g.priced:
            coef = np.repeat(g.ering_bytes, g.ering_classes)
            ring_rows(m, "ering", list(g.ering_edges), m.xi["ering"], coef, m.xi["ecross"])

    def read(self, data: PlacementData, reading: Reading, x: np.ndarray) -> None:
        g = group_tables(data)
        if g is not None:
            inputs = group_reading(data, g, reading)
            x[data.xi["ering"]], x[data.xi["ecross"]] = inputs.ering, inputs.ecross

    def communicate(self, data: PlacementData, x: np.ndarray, times: TimeParts) -> None:
        ering = data.xi["ering"]
        g = group_tables(data)
        if ering.size and g is not None:
            s, a = expert_sync(data.instance, g, x[ering], x[data.xi["ecross"]], data.plan.pp)
            times.sync, times.gather = times.sync + s, times.gather + a

    def worst(self, data: PlacementData, x: np.ndarray) -> None:
        g = group_tables(data)
        for k, i in enumerate(data.xi["ering"]):
            assert g is not None
            x[i] = float(g.ering_bytes[k // g.ering_classes]) * per_byte_worst(data)

    def time_cap(self, data: PlacementData) -> float:
        g = group_tables(data)
        if g is None or not data.xi["ering"].size:
            return 0.0
        return max(float(b) * per_byte_worst(data) for b in g.ering_bytes)
