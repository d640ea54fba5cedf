"""A new cost family, written here and nowhere else, joins a problem through
``build_placement_data(..., families=placement_families(extra=...))``: its input enters
``x``, the master, the value of an assignment and Kelley's bounds, and the exact method
then finds the brute-force optimum of the new objective.

The family: every stage's optimizer step waits for the slowest of its units to write a
checkpoint shard to its node's local disk (``write_s[n]`` per node): input ``ckpt[s] >=
write_s[node of p]`` for every unit of stage ``s`` on place ``p``, added to the stage's
optimizer time.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

import numpy as np
import pytest

from pipette_cp.solvers.placement import BACKENDS
from pipette_cp.solvers.placement.build import build_placement_data
from pipette_cp.solvers.placement.data import Family, MasterView, PlacementData
from pipette_cp.solvers.placement.families import placement_families
from pipette_cp.solvers.placement.families.rows import bound
from pipette_cp.solvers.placement.family import Reading, Slot, TimeParts
from pipette_cp.solvers.placement.kelley import CutPool, kelley, lower_x, worst_x
from pipette_cp.specs.layouts import make_plan
from tests.conftest import small_instance
from tests.solvers.placement.families.harness import verify


class CheckpointWrite(Family):
    """The checkpoint write of every stage (module docstring)."""

    name = "ckpt"

    def __init__(self, write_s: Sequence[float]) -> None:
        self.write_s = np.asarray(write_s, dtype=float)

    def cost(self, data: PlacementData) -> np.ndarray:
        """Seconds of a unit's write on each place (its table)."""
        return self.write_s[data.place_node]

    def slots(self, data: PlacementData) -> Sequence[Slot]:
        return (Slot("ckpt", (data.plan.pp,)),)

    def add_rows(self, m: MasterView) -> None:
        cost, ckpt = self.cost(m.data), m.xi["ckpt"]
        for u, lits in enumerate(m.place):
            var = m.xvar[ckpt[m.data.stage_of(u)]]
            for p, lit in lits.items():
                bound(m, var, [], float(cost[p]), lit, f"ckpt_{u}_{p}")

    def read(self, data: PlacementData, reading: Reading, x: np.ndarray) -> None:
        per_unit = self.cost(data)[reading.assign].reshape(data.plan.pp, -1)
        x[data.xi["ckpt"]] = per_unit.max(axis=1)

    def communicate(self, data: PlacementData, x: np.ndarray, times: TimeParts) -> None:
        times.optimizer = times.optimizer + x[data.xi["ckpt"]]

    def lower(self, data: PlacementData, x: np.ndarray) -> None:
        cost = self.cost(data)
        for s, i in enumerate(data.xi["ckpt"]):
            x[i] = cost[data.allowed[s]].min()

    def worst(self, data: PlacementData, x: np.ndarray) -> None:
        x[data.xi["ckpt"]] = self.cost(data).max()

    def time_cap(self, data: PlacementData) -> float:
        return float(self.cost(data).max())


MATRIX = np.array([[0, 5, 10, 20], [5, 0, 20, 10], [10, 20, 0, 5], [20, 10, 5, 0]]) * 1e9
INSTANCE = small_instance(nodes=4, gpus_per_node=1, node_bandwidth=MATRIX)
PLAN = make_plan(num_layers=8, dp=1, pp=3, tp=1, micro_batch_size=1)
#: node 1's disk is slow, the link 0-3 fast: what the hops alone choose pays for the disk
WRITE_S = (0.01, 0.5, 0.02, 0.03)


def test_the_family_alone_in_the_harness() -> None:
    verifier = verify(INSTANCE, PLAN, CheckpointWrite(WRITE_S))
    verifier.given([1, 0, 2]).costs(0.5 + 0.01 + 0.02)
    verifier.given([3, 2, 0]).costs(0.03 + 0.02 + 0.01)


def test_registered_without_editing_the_package_it_changes_the_optimum() -> None:
    extra = (CheckpointWrite(WRITE_S),)
    data = build_placement_data(INSTANCE, PLAN, families=placement_families(extra=extra))
    plain = build_placement_data(INSTANCE, PLAN)
    assert data.xi.size == plain.xi.size + PLAN.pp and "ckpt" in data.xi.positions
    everything = [np.array(a) for a in itertools.permutations(range(4), 3)]
    values = {tuple(a): data.value(a) for a in everything}
    best = min(values, key=values.__getitem__)
    plain_best = min(everything, key=plain.value)
    assert 1 in plain_best and 1 not in best  # the disk moves the optimum off node 1
    for a in everything[:6]:  # the value adds the write to the optimizer step
        assert values[tuple(a)] > plain.value(a)
    for backend in BACKENDS:
        pool = CutPool(data, upper_s=data.total_time_s(worst_x(data)))
        pool.add_at(lower_x(data))
        full = [np.flatnonzero(data.allowed[data.stage_of(u)]) for u in range(data.num_units)]
        res = kelley(data, BACKENDS[backend], domains=full, start=None, pool=pool,
                     deadline=time.perf_counter() + 30)  # fmt: skip
        assert res.status == "optimal", backend
        assert res.value_s == pytest.approx(values[best], rel=1e-9)
        assert res.bound_s <= values[best] * (1 + 1e-9)
