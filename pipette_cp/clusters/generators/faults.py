"""Generators of unhealthy fabrics: G3 (degraded production cluster), G4 (oversubscribed pods).

Call them through :func:`pipette_cp.clusters.generators.registry.generate`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from pipette_cp.clusters.generators.fabric import Fabric
from pipette_cp.clusters.generators.healthy import filled_fabric, h100_multileaf, healthy_a100
from pipette_cp.clusters.generators.noise import (
    pick_failed,
    pick_pairs,
    set_symmetric,
    upper_pairs,
)
from pipette_cp.clusters.generators.params import (
    Common,
    bandwidth,
    call_builder,
    choice,
    factor,
    factor_range,
    integer,
    leaf_generator,
    number,
)
from pipette_cp.errors import SpecError
from pipette_cp.units import GB

#: Base fabrics G3 degrades (docs/design.md, section 5: "G1/G2 plus ...").
DEGRADED_BASES = {"healthy-a100": healthy_a100, "h100-multileaf": h100_multileaf}

#: Spine oversubscription ratios of G4 (docs/design.md, section 5).
OVERSUBSCRIPTIONS = (2.8, 7.0, 15.0)


def degraded(
    rng: np.random.Generator,
    *,
    nodes: int,
    gpus_per_node: int = 8,
    base: str = "healthy-a100",
    degraded_fraction: float = 0.10,
    degraded_factor_low: float = 0.55,
    degraded_factor_high: float = 0.70,
    straggler_every: float = 17.0,
    straggler_pair_fraction: float = 0.7,
    failed_fraction: float = 0.04,
    **base_params: Any,
) -> Fabric:
    """G3: a production cluster with degraded pairs, straggler NICs and failed pairs.

    Numbers from docs/design.md, section 5, which summarises the pairwise nccl-tests of
    the 17-node H100 cluster of xxrjun/nccl-tests-cluster (example-cluster00): 6-21 %
    of pairs degraded to 0.54-0.70 x the median, one node in most of the slow pairs,
    34 of 810 tests (4.2 %) failed.

    Parameters
    ----------
    rng : numpy.random.Generator
        The random stream.
    nodes : int
        Number of servers (>= 1; the fractions below are met from about 16 nodes).  One
        node has no node pair to degrade or fail: it is the base generator's node.
    gpus_per_node : int
        GPUs per server, passed to the base generator.
    base : str
        The healthy fabric degraded: ``healthy-a100`` (G1) or ``h100-multileaf`` (G2).
    degraded_fraction : float
        Share of node pairs degraded in total, straggler pairs included (docs/design.md: 5-15 %).
    degraded_factor_low, degraded_factor_high : float
        A degraded pair keeps ``U(low, high)`` x its healthy bandwidth (docs/design.md: 0.55-0.70).
    straggler_every : float
        One straggler-NIC node per this many nodes, rounded (docs/design.md: ~17).
    straggler_pair_fraction : float
        Share of a straggler's pairs that are degraded (docs/design.md: ~70 %).
    failed_fraction : float
        Share of node pairs that fail outright, bandwidth 0 (docs/design.md: ~4 %).
    **base_params
        Parameters of the base generator (e.g. ``leaf_size``, ``noise_sigma``).

    Returns
    -------
    Fabric
        The base fabric with degraded (both directions) and failed pairs.
    """
    kind = "degraded"
    base = choice(f"{kind}.base", base, tuple(DEGRADED_BASES))
    fraction = number(f"{kind}.degraded_fraction", degraded_fraction, 0.0, 0.5)
    low, high = factor_range(kind, "degraded_factor", degraded_factor_low, degraded_factor_high)
    every = number(f"{kind}.straggler_every", straggler_every, 1.0, 1e9)
    straggler_share = number(f"{kind}.straggler_pair_fraction", straggler_pair_fraction, 0.0, 1.0)
    failed_share = number(f"{kind}.failed_fraction", failed_fraction, 0.0, 0.5)
    fabric = call_builder(
        kind, DEGRADED_BASES[base], rng, nodes, {"gpus_per_node": gpus_per_node, **base_params}
    )
    failed = pick_failed(rng, nodes, failed_share)
    bad = np.zeros((nodes, nodes), dtype=bool)
    stragglers = np.sort(rng.choice(nodes, size=int(nodes / every + 0.5), replace=False))
    for node in stragglers:
        partners = np.flatnonzero(~failed[node] & ~bad[node])
        partners = partners[partners != node]
        chosen = pick_pairs(rng, partners, round(straggler_share * (nodes - 1)))
        bad[node, chosen] = bad[chosen, node] = True
    rows, cols = upper_pairs(nodes)
    free = np.flatnonzero(~failed[rows, cols] & ~bad[rows, cols])
    missing = round(fraction * rows.size) - int(bad[rows, cols].sum())
    chosen = pick_pairs(rng, free, missing)
    bad[rows[chosen], cols[chosen]] = bad[cols[chosen], rows[chosen]] = True
    hit = np.flatnonzero(bad[rows, cols])
    factors = np.log(rng.uniform(low, high, size=hit.size))
    penalty = np.zeros((nodes, nodes))
    set_symmetric(penalty, rows[hit], cols[hit], factors)
    fabric.log_level = fabric.log_level + penalty
    fabric.failed = failed
    return fabric


@leaf_generator("oversubscribed", gpu="a100", nics_per_node=8, nic_gbytes_per_s=18.8)
def oversubscribed(
    rng: np.random.Generator,
    common: Common,
    *,
    intra_node_gbytes_per_s: float = 235.0,
    pod_size: int = 8,
    oversubscription: float = 2.8,
    load_fraction: float = 0.5,
) -> Fabric:
    """G4: racks grouped into pods whose uplinks to the spine are oversubscribed.

    Inside a pod the fabric is non-blocking (G1's A100 + HDR numbers); a pair across
    pods gets ``min(1, 1 / (oversubscription x load_fraction))`` of that (docs/design.md,
    section 5): when a fraction ``u`` of the pod's injection bandwidth crosses an
    uplink stage oversubscribed ``o``:1, each flow gets ``1/(o u)`` of its rate.  The
    servers are G1's (:func:`~pipette_cp.clusters.generators.healthy.healthy_a100`).

    Parameters
    ----------
    {common}
    intra_node_gbytes_per_s : float
        As :func:`~pipette_cp.clusters.generators.healthy.healthy_a100` (G1).
    pod_size : int
        Nodes per pod, filled in hostfile order (8: an assumption, one rack); ``nodes``
        must exceed it (two pods at least, so one node is refused).
    oversubscription : float
        Uplink oversubscription ``o``: 2.8, 7 or 15 (docs/design.md, section 5).
    load_fraction : float
        Share ``u`` of the pods' injection bandwidth that crosses pods at once, in
        (0, 1] (0.5: an assumption, a job whose data-parallel rings span pods).
    {noise}

    Returns
    -------
    Fabric
        Node groups = pod ids.
    """
    kind, nodes = common.kind, common.nodes
    # G4 computes with the NIC bandwidth as a float (G1, G2, G5 with the value as given)
    common = replace(common, nic_gbytes_per_s=float(common.nic_gbytes_per_s))
    intra = bandwidth(f"{kind}.intra_node_gbytes_per_s", intra_node_gbytes_per_s)
    pod = integer(f"{kind}.pod_size", pod_size, 1)
    if nodes == 1:
        raise SpecError(
            "nodes", nodes, f"must be >= 2 for {kind} (its pods meet only across node pairs)"
        )
    if nodes <= pod:
        raise SpecError("nodes", nodes, f"must be > pod_size={pod} for {kind} (two pods at least)")
    ratio = choice(f"{kind}.oversubscription", oversubscription, OVERSUBSCRIPTIONS)
    load = factor(f"{kind}.load_fraction", load_fraction)
    return filled_fabric(rng, common, pod, cross_pod_factor(ratio, load), intra * GB)


def cross_pod_factor(oversubscription: float, load_fraction: float) -> float:
    """Cross-pod bandwidth factor ``min(1, 1/(o u))`` (docs/design.md, section 5).

    >>> round(cross_pod_factor(7.0, 0.5), 4)
    0.2857
    """
    return min(1.0, 1.0 / (oversubscription * load_fraction)) if load_fraction > 0 else 1.0
