"""Data-parallel rings: each stage's gradient sync over its replicas, and whether the
ring leaves a node.

Inputs (dp > 1): ``ring[s]`` (s), the bandwidth part of stage ``s``'s gradient sync,
``c (D-1)/D bytes / slowest ring link`` (``c`` 2 for an all-reduce, 1 for a
reduce-scatter; Patarasuk & Yuan 2009), and ``cross[s]`` (0/1), whether that ring leaves a
node (its step latency is then the inter-node one).  The schedule adds ``c (D-1)`` step
latencies, and the distributed optimizer's parameter gather; under ZeRO-2/3 (pp = 1)
``ring`` is one layer's gradient reduce-scatter, exposed per layer
(:func:`~pipette_cp.cost.network.data_parallel.exposed_per_layer`).  Rows: every ring
link in replica order at its pair's cost (one way); the NIC-sharing family adds the
shares of shared nodes and sets ``cross``.  With three replicas or more NCCL builds the
ring from the replicas' order, the nodes in the order of their first replica
(:mod:`~pipette_cp.solvers.placement.families.nccl_ring_rows` writes that ring, its
NIC shares and ``cross``; exact on node places).  Bounds: per stage, the ring must connect
its places (:func:`~pipette_cp.solvers.placement.kelley.ring_bound`); under the
Evaluator's ``best`` algorithm the floor of NCCL's two-level all-reduce.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipette_cp.cost.compute.model_chunks import LayerTimes
from pipette_cp.cost.network.data_parallel import exposed_per_layer
from pipette_cp.solvers.placement.data import Family, MasterView, PlacementData
from pipette_cp.solvers.placement.families.group_tables import (
    group_reading,
    group_tables,
    ring_latency,
)
from pipette_cp.solvers.placement.families.nccl_ring_rows import (
    Ring,
    nccl_ring_rows,
    ring_rows_exact,
)
from pipette_cp.solvers.placement.families.rows import max_over_pairs
from pipette_cp.solvers.placement.family import Edge, FlowClass, Reading, Slot, TimeParts
from pipette_cp.specs.training import GRADIENT_SHARDING


def ring_cost(data: PlacementData, stage: int) -> np.ndarray:
    """Bandwidth part of ``stage``'s DP sync if its slowest link is p -> q."""
    size = float(data.ring_bytes[stage])
    if not size:
        return data.pair_cost(("ring", 0.0), lambda: np.zeros_like(data.inv_bw))
    return data.pair_cost(("ring", size), lambda: size * data.inv_bw)


class DataParallelRings(Family):
    """The DP ring inputs of every stage (module docstring)."""

    name = "ring"
    one_way = True

    def slots(self, data: PlacementData) -> Sequence[Slot]:
        n = data.plan.pp if data.plan.replicas > 1 else 0
        return Slot("ring", (n,)), Slot("cross", (n,), boolean=True, label="ring_cross_{}")

    def edges(self, data: PlacementData) -> list[Edge] | None:
        pp, dp = data.plan.pp, data.plan.replicas
        if dp < 2:
            return []
        if dp > 2:
            return None  # NCCL's ring, not rank-order pairs: its own rows (add_rows)
        return [(s, s * dp + r, s * dp + (r + 1) % dp) for s in range(pp) for r in range(dp)]

    def exact(self, data: PlacementData) -> bool:
        return data.plan.replicas <= 2 or ring_rows_exact(data)

    def flow_costs(
        self, data: PlacementData, index: np.ndarray, p: np.ndarray, q: np.ndarray
    ) -> Sequence[np.ndarray]:
        return (data.ring_bytes[index] * data.inv_bw[p, q],)

    def add_rows(self, m: MasterView) -> None:
        d, ring = m.data, m.xi["ring"]
        pp, dp = d.plan.pp, d.plan.replicas
        if dp > 2:
            cross = m.xi["cross"]
            rings: list[Ring] = [(int(ring[s]), int(cross[s]), [s * dp + r for r in range(dp)],
                                  float(d.ring_bytes[s])) for s in range(pp)]  # fmt: skip
            nccl_ring_rows(m, "ring", rings, [0] * pp)
            return
        for s, u, v in self.edges(d) or []:
            max_over_pairs(m, int(ring[s]), ring_cost(d, s), u, v, f"ring_{s}_{u}")

    def read(self, data: PlacementData, reading: Reading, x: np.ndarray) -> None:
        plan, xi = data.plan, data.xi
        if plan.replicas < 2:
            return
        nodes = data.place_node[reading.assign].reshape(plan.pp, plan.replicas)
        crosses = (nodes != np.roll(nodes, -1, axis=1)).any(axis=1)
        x[xi["cross"]] = crosses
        # ZeRO-2/3: the ring is one layer's reduce-scatter, else the step's gradient
        # sync (the dense rings': the expert rings' follow it)
        inputs = reading.inputs
        sync = reading.layer[0] if plan.sharding in GRADIENT_SHARDING else inputs.dp_sync_s
        tables = group_tables(data)
        if tables is not None:
            sync = sync - group_reading(data, tables, reading).expert_sync_s
        x[xi["ring"]] = sync - data.sync_factor * ring_latency(data.instance, x[xi["cross"]])

    def communicate(self, data: PlacementData, x: np.ndarray, times: TimeParts) -> None:
        plan, xi = data.plan, data.xi
        if plan.replicas < 2:
            return
        ring = x[xi["ring"]]
        lat = ring_latency(data.instance, x[xi["cross"]])
        times.sync = ring + data.sync_factor * lat
        times.gather = data.gather_ratio * ring + data.gather_factor * lat
        if plan.sharding in GRADIENT_SHARDING:  # pp = 1: per-layer collectives exposed
            assert times.layer is not None, "the compute family sets one layer's times"
            ag = data.layer_gather_ratio * ring[0] + data.sync_factor * lat[0]
            one = LayerTimes(times.layer[0], times.layer[1], 0.0, 0.0, 0.0)
            ef, eb = exposed_per_layer(plan, one, float(times.sync[0]), float(ag))
            layers = np.asarray(plan.layer_split, dtype=float)
            times.forward, times.backward = (
                times.forward + ef * layers,
                times.backward + eb * layers,
            )
            times.sync = np.zeros(plan.pp)

    def classes(self, data: PlacementData) -> list[FlowClass]:
        if data.plan.replicas < 2:
            return []
        ring = data.xi["ring"]
        return [(int(ring[s]), ring_cost(data, s), s, s, ("ring", float(data.ring_bytes[s])))
                for s in range(data.plan.pp)]  # fmt: skip

    def lower(self, data: PlacementData, x: np.ndarray) -> None:
        """A ring leaves a node unless some node holds two units."""
        if data.plan.replicas > 1:
            x[data.xi["cross"]] = 0.0 if data.multi else 1.0

    def floor(self, data: PlacementData, x: np.ndarray) -> None:
        """Each ring input lowered to what NCCL's two-level all-reduce could take at best.

        Two-level over ``D = L d`` replicas, ``L`` per node on ``d`` nodes (Evaluator:
        :func:`~pipette_cp.cost.network.collectives.hierarchical_times_s`): ``c (L-1)/L S /
        b_intra + c (L-1) l_intra + c (d-1)/d (S/L) / b_inter + c (d-1) l_inter``, with ``c``
        the collective's ring factor; the floor takes the fastest intra- and inter-node
        link of the cluster and the best ``L`` a node can hold."""
        plan, cluster = data.plan, data.instance.cluster
        dp = plan.replicas
        if dp < 2 or not data.multi:
            return
        b_intra, b_inter = cluster.fastest_links_bytes_per_s()
        lat_in, lat_out = cluster.intra_node_latency_s, cluster.inter_node_latency_s
        c = data.sync_factor / (dp - 1)  # the ring factor of the stage's collective
        per_node = min(dp, cluster.gpus_per_node // plan.tp)
        for s, i in enumerate(data.xi["ring"]):
            if not data.ring_bytes[s]:
                continue
            size = data.ring_bytes[s] / (c * (dp - 1) / dp)
            best = np.inf
            for local in (k for k in range(1, per_node + 1) if dp % k == 0):
                nodes = dp // local
                t = c * (nodes - 1) / nodes * (size / local) / b_inter + c * (nodes - 1) * lat_out
                if local > 1:
                    t += c * (local - 1) / local * size / b_intra + c * (local - 1) * lat_in
                best = min(best, t)
            # the schedule adds sync_factor x the latency of x's ring (intra-node at lower_x)
            x[i] = min(x[i], max(0.0, best - data.sync_factor * lat_in))

    def worst(self, data: PlacementData, x: np.ndarray) -> None:
        share = data.instance.cluster.gpus_per_node / data.nic_capacity
        for s, i in enumerate(data.xi["ring"]):
            x[i] = max(x[i], data.ring_bytes[s] * share)

    def time_cap(self, data: PlacementData) -> float:
        finite = 0.0
        for s in range(data.plan.pp):
            cost = ring_cost(data, s)
            finite = max(finite, float(cost[np.isfinite(cost)].max(initial=0.0)))
        return finite * data.instance.cluster.gpus_per_node * max(data.plan.replicas, 1)
