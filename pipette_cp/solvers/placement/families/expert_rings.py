"""Expert data-parallel rings: each class of expert rings' gradient sync, and whether it
leaves a node.

Where the expert rings differ from the dense ones, inputs ``ering[k]`` (s) and
``ecross[k]`` (0/1) per ring class ``k`` (stage ``k // classes``; the rings of one class
visit the same units): the bandwidth part of their gradient sync and whether they leave
a node (their latency).  A stage's expert sync is its slowest class's
(:func:`~pipette_cp.solvers.placement.families.group_tables.expert_sync`), added to the
dense ring's.  Rows (where priced): as the DP ring's, every link at its bandwidth and
its node's NIC share, both ends, and a class leaving a node pays the inter-node latency
(:func:`~pipette_cp.solvers.placement.families.rows.ring_rows`); rings of three ranks or
more as NCCL builds them from their rank order
(:mod:`~pipette_cp.solvers.placement.families.nccl_ring_rows`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipette_cp.solvers.placement.data import MasterView, PlacementData
from pipette_cp.solvers.placement.families.group_family import GroupFamily
from pipette_cp.solvers.placement.families.group_tables import (
    GroupTables,
    expert_sync,
    group_tables,
    per_byte_worst,
)
from pipette_cp.solvers.placement.families.nccl_ring_rows import (
    Ring,
    nccl_ring_rows,
    ring_rows_exact,
)
from pipette_cp.solvers.placement.families.rows import ring_rows
from pipette_cp.solvers.placement.family import Edge, Slot, TimeParts


class ExpertRings(GroupFamily):
    """The expert ring inputs of every ring class (module docstring)."""

    name = "ering"
    one_way = True
    inputs = ("ering", "ecross")

    def slots(self, data: PlacementData) -> Sequence[Slot]:
        g = group_tables(data)
        n = data.plan.pp * g.ering_classes if g is not None else 0
        return Slot("ering", (n,)), Slot("ecross", (n,), boolean=True, label="ering_cross_{}")

    def table_edges(self, g: GroupTables) -> Sequence[Edge]:
        return g.ering_edges

    def reordered(self, data: PlacementData) -> bool:
        return data.plan.expert_dp > 2  # NCCL builds longer rings in its own order

    def exact(self, data: PlacementData) -> bool:
        return super().exact(data) and (data.plan.expert_dp <= 2 or ring_rows_exact(data))

    def add_inputs(self, m: MasterView) -> None:
        """Its time inputs and, with them, its crossing indicators."""
        super().add_inputs(m)
        super().add_indicators(m)

    def add_indicators(self, m: MasterView) -> None:
        del m  # made with the time inputs

    def priced_rows(self, m: MasterView, g: GroupTables) -> None:
        coef = np.repeat(g.ering_bytes, g.ering_classes)
        if m.data.plan.expert_dp <= 2:
            ring_rows(m, "ering", list(g.ering_edges), m.xi["ering"], coef, m.xi["ecross"])
            return
        units: dict[int, list[int]] = {}  # each class's ring, its units in rank order
        for k, u, _ in g.ering_edges:
            units.setdefault(k, []).append(u)
        index, cross = m.xi["ering"], m.xi["ecross"]
        rings: list[Ring] = [(int(index[k]), int(cross[k]), seq, float(coef[k]))
                             for k, seq in units.items()]  # fmt: skip
        nccl_ring_rows(m, "ering", rings, [0] * len(rings))

    def add_time(self, data: PlacementData, g: GroupTables, x: np.ndarray, t: TimeParts) -> None:
        s, a = expert_sync(data.instance, g, x[data.xi["ering"]], x[data.xi["ecross"]],
                           data.plan.pp)  # fmt: skip
        t.sync, t.gather = t.sync + s, t.gather + a

    def worst_inputs(self, data: PlacementData, g: GroupTables) -> np.ndarray:
        """Each ring class's bytes at the slowest link or NIC share."""
        return np.repeat(g.ering_bytes, g.ering_classes) * per_byte_worst(data)
