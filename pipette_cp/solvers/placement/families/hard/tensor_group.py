"""``tp_within_node``: the tp ranks of a unit share a node (an NVLink domain when tp
exceeds a node).

Nothing to add to the master: every place is a tensor group (or a set of them) of one
node, or of one NVLink domain when tp exceeds a node
(:func:`~pipette_cp.solvers.placement.build.tensor_slots`), so the tp ranks of a unit
never span nodes (domains); checked here once per master.
"""

from __future__ import annotations

from pipette_cp.solvers.placement.data import Family, MasterView


class TensorGroupWithinNode(Family):
    """The tensor group of every unit within one node or NVLink domain (module docstring)."""

    name = "tp_within_node"
    check = "tp_within_node"

    def add_rows(self, m: MasterView) -> None:
        d = m.data
        cluster = d.instance.cluster
        for p, slots in enumerate(d.place_slots):
            gpus = d.slot_gpus[slots]
            if d.plan.tp <= cluster.gpus_per_node:
                assert (gpus // cluster.gpus_per_node == d.place_node[p]).all()
            assert (gpus // cluster.gpus_per_domain == m.domain_of_node[d.place_node[p]]).all()
