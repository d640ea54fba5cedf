"""Pipeline hops: each boundary's slowest activation and gradient hop.

Inputs ``hf[s]``, ``hb[s]`` (s): boundary ``s``'s activation hop (stage ``s`` to the next,
the last to stage 0 when interleaved) and gradient hop back, at the slowest replica and
tp rank.  Rows: for every replica's pair of units ``u`` (stage ``s``) and ``v``,
``place[u, p] => hf[s] >= sum_q c(p, q) place[v, q]`` and the mirror over ``q``, ``c``
the Evaluator's flow time at one unit's NIC share (latency + bytes / bandwidth); the
NIC-sharing family adds the shares of nodes holding several units.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipette_cp.solvers.placement.data import Family, MasterView, PlacementData
from pipette_cp.solvers.placement.families.rows import max_over_pairs
from pipette_cp.solvers.placement.family import Edge, FlowClass, Reading, Slot, TimeParts


def hop_cost(data: PlacementData) -> np.ndarray:
    """Activation flow p -> q alone with one unit's NIC share: latency + bytes / bw."""
    return data.pair_cost(("hop",), lambda: data.latency + data.act_bytes * data.inv_bw)


def hop_back_cost(data: PlacementData) -> np.ndarray:
    """The gradient flow back over a hop whose activations go p -> q (q -> p)."""
    return data.pair_cost(("hop back",), lambda: data.latency + data.act_bytes * data.inv_bw.T)


class PipelineHops(Family):
    """The hop inputs of every pipeline boundary (module docstring)."""

    name = "hop"

    def slots(self, data: PlacementData) -> Sequence[Slot]:
        return (Slot("hf", (data.hops,), label="hop_fwd_{}"),
                Slot("hb", (data.hops,), label="hop_bwd_{}"))  # fmt: skip

    def edges(self, data: PlacementData) -> list[Edge]:
        pp, dp = data.plan.pp, data.plan.replicas
        return [(s, s * dp + r, (s + 1) % pp * dp + r) for s in range(data.hops) for r in range(dp)]

    def flow_costs(
        self, data: PlacementData, index: np.ndarray, p: np.ndarray, q: np.ndarray
    ) -> Sequence[np.ndarray]:
        cost = hop_cost(data)
        return cost[p, q], cost.T[p, q]

    def add_rows(self, m: MasterView) -> None:
        d, xi = m.data, m.xi
        fwd, bwd = hop_cost(d), hop_back_cost(d)
        for s, u, v in self.edges(d):
            max_over_pairs(m, int(xi["hf"][s]), fwd, u, v, f"hop_fwd_{s}_{u}")
            max_over_pairs(m, int(xi["hb"][s]), bwd, u, v, f"hop_bwd_{s}_{u}")

    def read(self, data: PlacementData, reading: Reading, x: np.ndarray) -> None:
        x[data.xi["hf"]] = reading.inputs.fwd_hop_s[: data.hops]
        x[data.xi["hb"]] = reading.inputs.bwd_hop_s[: data.hops]

    def communicate(self, data: PlacementData, x: np.ndarray, times: TimeParts) -> None:
        fwd, bwd = np.zeros(data.plan.pp), np.zeros(data.plan.pp)
        fwd[: data.hops], bwd[: data.hops] = x[data.xi["hf"]], x[data.xi["hb"]]
        times.fwd_hop, times.bwd_hop = fwd, bwd

    def classes(self, data: PlacementData) -> list[FlowClass]:
        xi, pp = data.xi, data.plan.pp
        out: list[FlowClass] = []
        for s in range(data.hops):
            out += [
                (int(xi["hf"][s]), hop_cost(data), s, (s + 1) % pp, ("hf",)),
                (int(xi["hb"][s]), hop_back_cost(data), s, (s + 1) % pp, ("hb",)),
            ]
        return out

    def worst(self, data: PlacementData, x: np.ndarray) -> None:
        """A hop at its dearest pair or at a whole node's flows sharing its NICs."""
        share = data.instance.cluster.gpus_per_node / data.nic_capacity
        lat = data.instance.cluster.inter_node_latency_s
        for i in (*data.xi["hf"], *data.xi["hb"]):
            x[i] = max(x[i], lat + data.act_bytes * share)

    def time_cap(self, data: PlacementData) -> float:
        cost = hop_cost(data)
        finite = float(cost[np.isfinite(cost)].max(initial=0.0))
        return finite * data.instance.cluster.gpus_per_node * max(data.plan.replicas, 1)
