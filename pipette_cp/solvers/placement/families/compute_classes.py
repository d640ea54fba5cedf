"""The compute-class ladder: every stage runs at its slowest unit's speed.

A place's compute class is its GPU type and its tensor group's TP link bandwidth,
sorted slowest first (:func:`~pipette_cp.solvers.placement.build.build_placement_data`
tabulates each class's forward, backward and optimizer times).  Inputs ``worse[s, c]``
(0/1, ``c < classes - 1``): stage ``s`` holds a unit on a place of class ``<= c``.  Rows:
``worse[s, c] >= place[u, p]`` for every unit ``u`` of ``s`` and place ``p`` of class
``<= c``, and the ladder ``worse[s, c + 1] >= worse[s, c]``.  The stage times are the
fastest class's plus, for every ``c`` the stage reaches down to, the step from class
``c + 1`` to ``c``; this prices the Evaluator exactly only where the classes are a ladder
(one GPU type, or one TP bandwidth, and each class at least as fast as the one below),
which ``build`` checks.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipette_cp.solvers.placement.data import Family, MasterView, PlacementData
from pipette_cp.solvers.placement.families.rows import const
from pipette_cp.solvers.placement.family import Reading, Slot, TimeParts
from pipette_cp.specs.training import GRADIENT_SHARDING


class ComputeClasses(Family):
    """The compute-class inputs of every stage (module docstring)."""

    name = "class"

    def slots(self, data: PlacementData) -> Sequence[Slot]:
        shape = (data.plan.pp, len(data.class_forward) - 1)
        return (Slot("worse", shape, boolean=True, label="stage_class_le_{}_{}"),)

    def add_rows(self, m: MasterView) -> None:
        """``worse[s, c] >= [a unit of stage s on a place of class <= c]`` (ladder)."""
        d, worse = m.data, m.xi["worse"]
        for (s, c), i in np.ndenumerate(worse):
            for u in range(s * d.plan.replicas, (s + 1) * d.plan.replicas):
                lits = [x for p, x in m.place[u].items() if d.place_class[p] <= c]
                if lits:
                    terms = [(1, m.xvar[i])] + [(-1, x) for x in lits if not const(x)]
                    rhs = sum(1 for x in lits if const(x))
                    m.b.add_linear(terms, ">=", rhs, f"class_{s}_{c}_{u}")
            if c + 1 < worse.shape[1]:
                nxt = m.xvar[worse[s, c + 1]]
                m.b.add_linear([(1, nxt), (-1, m.xvar[i])], ">=", 0, f"ladder_{s}_{c}")

    def read(self, data: PlacementData, reading: Reading, x: np.ndarray) -> None:
        worse = data.xi["worse"]
        if worse.size:
            worst = data.worst_class(reading.assign)
            x[worse] = np.arange(worse.shape[1])[None, :] >= worst[:, None]

    def compute(self, data: PlacementData, x: np.ndarray, times: TimeParts) -> None:
        """The stage times: the fastest class's, stepped down the ladder where ``worse``."""
        worse, pp = data.xi["worse"], data.plan.pp
        forward, backward = data.class_forward[-1].copy(), data.class_backward[-1].copy()
        optimizer = data.class_optimizer[-1].copy()
        rows = np.arange(pp * data.plan.vpp) % pp
        for c in range(worse.shape[1]):
            w = x[worse[:, c]]  # ladder: class c minus class c + 1, where stage is <= c
            forward += w[rows] * (data.class_forward[c] - data.class_forward[c + 1])
            backward += w[rows] * (data.class_backward[c] - data.class_backward[c + 1])
            optimizer += w * (data.class_optimizer[c] - data.class_optimizer[c + 1])
        times.forward, times.backward, times.optimizer = forward, backward, optimizer
        if data.plan.sharding in GRADIENT_SHARDING:  # what per-layer collectives hide behind
            layer = data.class_layer[-1].copy()
            for c in range(worse.shape[1]):
                layer += x[worse[0, c]] * (data.class_layer[c] - data.class_layer[c + 1])
            times.layer = (float(layer[0]), float(layer[1]))
