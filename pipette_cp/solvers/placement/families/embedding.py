"""The tied-embedding all-reduce between the first and the last stage of every replica.

Input ``emb`` (s; only with tied embeddings and pp > 1): the slowest replica's
all-reduce of the embedding gradients over its pair of units, ``2 (2-1)/2 bytes /
slowest link`` plus two latencies.  Rows: every replica's pair at its cost, both
directions; the NIC-sharing family adds the shares of shared nodes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipette_cp.solvers.placement.data import Family, MasterView, PlacementData
from pipette_cp.solvers.placement.families.rows import max_over_pairs
from pipette_cp.solvers.placement.family import Edge, FlowClass, Reading, Slot, TimeParts


def emb_cost(data: PlacementData) -> np.ndarray:
    """Tied-embedding all-reduce between p and q (both directions)."""
    return data.pair_cost(
        ("emb",),
        lambda: data.emb_bytes * np.maximum(data.inv_bw, data.inv_bw.T) + 2.0 * data.latency,
    )


class TiedEmbedding(Family):
    """The tied-embedding input (module docstring)."""

    name = "emb"

    def slots(self, data: PlacementData) -> Sequence[Slot]:
        return (Slot("emb", (1 if data.tied else 0,), label="emb"),)

    def edges(self, data: PlacementData) -> list[Edge]:
        pp, dp = data.plan.pp, data.plan.replicas
        return [(0, r, (pp - 1) * dp + r) for r in range(dp)] if data.tied else []

    def flow_costs(
        self, data: PlacementData, index: np.ndarray, p: np.ndarray, q: np.ndarray
    ) -> Sequence[np.ndarray]:
        return (emb_cost(data)[p, q],)

    def add_rows(self, m: MasterView) -> None:
        d, emb = m.data, m.xi["emb"]
        for _, u, v in self.edges(d):
            max_over_pairs(m, int(emb[0]), emb_cost(d), u, v, f"emb_{u}")

    def read(self, data: PlacementData, reading: Reading, x: np.ndarray) -> None:
        x[data.xi["emb"]] = reading.inputs.embedding_sync_s

    def communicate(self, data: PlacementData, x: np.ndarray, times: TimeParts) -> None:
        emb = data.xi["emb"]
        if emb.size:
            times.embedding = float(x[emb[0]])

    def classes(self, data: PlacementData) -> list[FlowClass]:
        emb = data.xi["emb"]
        pp = data.plan.pp
        return [(int(emb[0]), emb_cost(data), 0, pp - 1, ("emb",))] if emb.size else []

    def worst(self, data: PlacementData, x: np.ndarray) -> None:
        cluster = data.instance.cluster
        share = cluster.gpus_per_node / data.nic_capacity
        for i in data.xi["emb"]:
            x[i] = max(x[i], 2 * cluster.inter_node_latency_s + data.emb_bytes * share)

    def time_cap(self, data: PlacementData) -> float:
        cost = emb_cost(data)  # a cap, whether or not the layout ties its embeddings
        finite = float(cost[np.isfinite(cost)].max(initial=0.0))
        return finite * data.instance.cluster.gpus_per_node * max(data.plan.replicas, 1)
