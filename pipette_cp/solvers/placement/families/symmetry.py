"""The replica symmetry of the placement masters.

DP replicas are interchangeable up to a rotation of the ring (a pipeline keeps its
replica index on every stage).  Context-parallel rings, expert groups and expert rings
are blocks and strides of consecutive replicas, so only rotations by a multiple of
:func:`rotation_period` keep them (each group onto a group of its kind): replica 0 of
stage 0 takes the lowest place index among stage 0's replicas ``0, L, 2 L, ...``.  With
symmetric link costs and no groups the ring may also be reversed: then replica 1 is
below replica ``dp - 1``.  Every placement has an equivalent one (same time) that meets
these rows, so a master with them keeps a valid bound; the master drops them where a
family is not symmetric (a user's) or a unit is fixed (LNS).

NCCL builds a ring of three or more replicas from their order, visiting the nodes in
the order of their first replica (:mod:`pipette_cp.cost.network.nccl_rings`); a rotation
changes that order once the replicas span three nodes, or a node pair's GPU pairs
differ.  The rows hold only where no rotation can change a ring
(:func:`rotations_keep_rings`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipette_cp.solvers.placement.data import Family, MasterView, PlacementData


def rotation_period(data: PlacementData) -> int:
    """Least rotation of the replicas that maps every family's unit pairs onto pairs of
    that family (the dense ones are kept by every rotation; the groups' by multiples of
    their size)."""
    replicas = data.plan.replicas
    local = [{(u % replicas, v % replicas) for _, u, v in edges if u < replicas}
             for _, edges in data.flows()]  # fmt: skip
    for period in (k for k in range(1, replicas + 1) if replicas % k == 0):
        if all({((u + period) % replicas, (v + period) % replicas) for u, v in f} == f
               for f in local):  # fmt: skip
            return period
    return replicas


def rotations_keep_rings(data: PlacementData) -> bool:
    """Whether every rotation of the replicas keeps the rings NCCL builds: two replicas
    (one ring either way), or node places on at most two nodes (every order of the
    replicas visits the same two nodes, each GPU pair of them alike)."""
    if data.plan.replicas <= 2:
        return True
    return bool(data.node_level) and data.instance.cluster.num_nodes <= 2


def _reflects(data: PlacementData) -> bool:
    return (
        data.plan.replicas >= 3
        and rotation_period(data) == 1
        and np.array_equal(data.inv_bw, data.inv_bw.T)
    )


class ReplicaSymmetry(Family):
    """The rotation rows (and the reflection row) of the module docstring."""

    name = "symmetry"

    def add_rows(self, m: MasterView) -> None:
        if not m.symmetry or not rotations_keep_rings(m.data):
            return
        d = m.data
        dp, period = d.plan.replicas, rotation_period(d)
        if dp < 2 or period >= dp:
            return

        def pos(u: int, sign: int) -> list[tuple[int, Any]]:
            return [(sign * p, x) for p, x in m.place[u].items()]

        def at_most_zero(terms: list[tuple[int, Any]], name: str) -> None:
            # a unit with a one-place domain holds the constant 1, not a variable
            free = [(c, x) for c, x in terms if not isinstance(x, int | np.integer)]
            if free:
                fixed = sum(c * int(x) for c, x in terms if isinstance(x, int | np.integer))
                m.b.add_linear(free, "<=", -fixed, name)

        for r in range(period, dp, period):
            at_most_zero(pos(0, 1) + pos(r, -1), f"symmetry_rotation_{r}")
        if _reflects(d):
            at_most_zero(pos(1, 1) + pos(dp - 1, -1), "symmetry_reflection")

    def canonical(self, data: PlacementData, assign: np.ndarray) -> np.ndarray:
        """The assignment rotated (and reflected) to satisfy the symmetry breaking."""
        pp, dp = data.plan.pp, data.plan.replicas
        if not rotations_keep_rings(data):
            return assign  # no rows to satisfy
        period = rotation_period(data)
        grid = np.asarray(assign).reshape(pp, dp)
        grid = np.roll(grid, -period * int(np.argmin(grid[0, ::period])), axis=1)
        if _reflects(data) and grid[0, 1] > grid[0, -1]:
            grid = np.concatenate((grid[:, :1], grid[:, :0:-1]), axis=1)
        return grid.ravel()
