"""Communication over the cluster's measured GPU x GPU bandwidth matrix.

Every function here takes a :class:`Fabric` (the per-cluster arrays, built
once by :meth:`Fabric.from_cluster`) and integer numpy arrays of GPU ids, so
that evaluating thousands of placements is a handful of numpy gathers each.

Model (docs/design.md, section 3, "Communication over a measured matrix"):

- one flow i -> j of ``n`` bytes takes ``latency(i, j) + n / bw`` where
  ``bw = B[i, j]``, the measured point-to-point bandwidth;
- flows that leave (or enter) a node at the same time share its NICs: with
  ``k`` concurrent inter-node flows out of a node, each gets at most
  ``nics_per_node * nic_bandwidth / k`` (and the same on the receiving
  node), so ``bw = min(B[i, j], cap / k_out, cap / k_in)``; where NVLink
  domains span several nodes (``ClusterSpec.nodes_per_nvlink_domain``, a GB200
  NVL72 rack) only flows that leave the domain go through NICs, while a flow
  between two nodes of one domain runs over NVLink at ``B[i, j]`` (its latency
  is still the inter-node one);
- a ring runs in the order NCCL builds from the group's rank order (nodes in the
  order of their first rank, each node's GPUs together: :mod:`.nccl_rings`), not in
  rank order itself nor in an order chosen for the network;
- a ring collective over ``n`` GPUs moves ``2 (n-1)/n`` (all-reduce) or
  ``(n-1)/n`` (reduce-scatter, all-gather) of the buffer over every link of
  the ring and is paced by the slowest link, plus one latency per step;
- a hierarchical collective reduces inside each node first, then runs
  ``L`` rings across nodes on ``1/L`` of the buffer each (``L`` = GPUs of the
  group per node), then gathers inside the node;
- a failed pair (off-diagonal 0) on any link an operation needs raises
  :class:`~pipette_cp.errors.InfeasibleError` naming the GPUs: it is never
  used silently.

The :class:`Fabric` and the point-to-point flows live in :mod:`pipette_cp.cost.network.fabric`
(re-exported here); this module holds the ring and hierarchical collectives.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from pipette_cp.cost.network.fabric import (
    Fabric,
    check_links,
    concurrent_flows,
    flow_bandwidths,
    p2p_time_s,
    p2p_times_s,
    shared_nic_flows,
)
from pipette_cp.cost.network.nccl_rings import nccl_rings
from pipette_cp.errors import InfeasibleError

__all__ = [
    "Algorithm",
    "Collective",
    "Fabric",
    "check_links",
    "collective_times_s",
    "concurrent_flows",
    "flow_bandwidths",
    "hierarchical_times_s",
    "local_group_size",
    "p2p_time_s",
    "p2p_times_s",
    "ring_time_from_links",
    "ring_time_s",
    "ring_times_s",
    "shared_nic_flows",
]

Collective = Literal["all_reduce", "reduce_scatter", "all_gather"]
Algorithm = Literal["ring", "hierarchical", "best"]

#: Fraction of the buffer each link carries in a ring collective of n GPUs,
#: as a multiple of (n - 1) / n (Patarasuk & Yuan 2009; NCCL's busbw factors).
_RING_FACTOR = {"all_reduce": 2.0, "reduce_scatter": 1.0, "all_gather": 1.0}


def ring_times_s(
    fabric: Fabric,
    rings: np.ndarray,
    nbytes: float | np.ndarray,
    collective: Collective = "all_reduce",
    group: np.ndarray | None = None,
    what: str = "a ring collective",
) -> np.ndarray:
    """Time of concurrent ring collectives, one per row of ``rings``, s.

    Row ``r`` lists the GPUs of one communicator in rank order; the ring is the one
    NCCL builds from it (:func:`~pipette_cp.cost.network.nccl_rings.nccl_rings`: nodes
    in the order of their first rank, each node's GPUs together), GPU ``ring[i]``
    sending to ``ring[(i + 1) % n]``.  The rings run at the same time and
    share NICs (:func:`flow_bandwidths`), except that rings of different
    ``group`` ids (one per row) do not overlap.  ``nbytes`` is a scalar or one
    size per row: the full buffer (the input of a reduce-scatter, the output
    of an all-gather).

    Ring all-reduce: ``2 (n-1)/n * nbytes / min_link_bw + 2 (n-1) * max_link_latency``;
    reduce-scatter and all-gather: half of both terms.
    """
    rings = nccl_rings(np.atleast_2d(np.asarray(rings)), fabric.node_of)
    k, n = rings.shape
    if n <= 1:
        return np.zeros(k)
    succ = np.concatenate((rings[:, 1:], rings[:, :1]), axis=1)
    # flows in (link, ring) order: the per-ring reductions then run over long columns
    flows_group = None if group is None else np.tile(np.asarray(group), n)
    bw, latency = concurrent_flows(fabric, rings.T, succ.T, flows_group, what)
    return ring_time_from_links(bw.reshape(n, k).T, latency.reshape(n, k).T, nbytes, collective)


def ring_time_from_links(
    bandwidth: np.ndarray,
    latency: np.ndarray,
    nbytes: float | np.ndarray,
    collective: Collective = "all_reduce",
) -> np.ndarray:
    """Ring collective time from the (k, n) bandwidths and latencies of its links, s.

    ``factor (n-1)/n * nbytes / min(bandwidth) + factor (n-1) * max(latency)``
    with ``factor`` 2 for all-reduce and 1 for reduce-scatter / all-gather.
    """
    k, n = bandwidth.shape
    if n <= 1:
        return np.zeros(k)
    factor = _RING_FACTOR[collective] * (n - 1)
    # ring collective: factor (n-1)/n * bytes / slowest link + one latency per step
    # (Patarasuk & Yuan 2009; docs/design.md, section 3)
    return factor / n * np.asarray(nbytes, dtype=float) / bandwidth.min(axis=1) + factor * (
        latency.max(axis=1)
    )


def ring_time_s(
    fabric: Fabric, ring: np.ndarray, nbytes: float, collective: Collective = "all_reduce"
) -> float:
    """Time of one ring collective over ``ring`` (in rank order) alone on the fabric, s."""
    return float(ring_times_s(fabric, np.asarray(ring)[None, :], nbytes, collective)[0])


def _node_blocks(fabric: Fabric, groups: np.ndarray) -> np.ndarray | None:
    """``groups`` regrouped as (k, nodes, local): nodes in the order of their first
    rank, each node's members in rank order (NCCL's node order, :mod:`.nccl_rings`).

    None when some group does not have the same number of members on each of
    its nodes (or groups differ in node count): the hierarchical algorithm
    needs equal local groups.
    """
    k, n = groups.shape
    ordered = nccl_rings(groups, fabric.node_of)
    nodes = fabric.node_of[ordered]
    d = 1 + int(np.count_nonzero(nodes[0, 1:] != nodes[0, :-1]))
    if n % d:
        return None
    blocks = ordered.reshape(k, d, n // d)
    block_nodes = nodes.reshape(k, d, n // d)
    same = (block_nodes == block_nodes[:, :, :1]).all()
    distinct = (block_nodes[:, 1:, 0] != block_nodes[:, :-1, 0]).all()
    return blocks if same and distinct else None


def local_group_size(fabric: Fabric, groups: np.ndarray) -> int:
    """GPUs per node of the first group (1 when every member is on its own node)."""
    nodes = fabric.node_of[np.atleast_2d(groups)[0]].tolist()
    return len(nodes) // len(set(nodes))


def hierarchical_times_s(
    fabric: Fabric,
    groups: np.ndarray,
    nbytes: float | np.ndarray,
    collective: Collective = "all_reduce",
    what: str = "a hierarchical collective",
) -> np.ndarray:
    """Time of concurrent two-level collectives, one per row of ``groups``, s.

    Each group is split by node into local groups of ``L`` GPUs (equal on
    every node, else the result is ``inf``: not applicable).  All-reduce =
    intra-node reduce-scatter of ``nbytes`` + ``L`` concurrent inter-node ring
    all-reduces of ``nbytes / L`` (one per local index) + intra-node
    all-gather of ``nbytes`` (docs/design.md, section 3: intra-node first, then
    across nodes on bytes / local group size).  Reduce-scatter
    keeps the first two phases, all-gather the last two.  The inter-node rings
    of every group run at once and share NICs.
    """
    groups = np.atleast_2d(np.asarray(groups))
    k, _ = groups.shape
    blocks = _node_blocks(fabric, groups)
    if blocks is None:
        return np.full(k, np.inf)
    _, d, local = blocks.shape
    size = np.asarray(nbytes, dtype=float)
    if size.shape != (k,):
        size = np.broadcast_to(size, (k,))
    # intra-node phase: no NIC on the path; reduce-scatter + all-gather take
    # exactly a ring all-reduce's time (docs/design.md, section 3)
    nxt = np.concatenate((blocks[:, :, 1:], blocks[:, :, :1]), axis=2)
    intra_bw = fabric.bandwidth[blocks, nxt]
    if local > 1 and not intra_bw.all():
        check_links(fabric, blocks, nxt, what)
    factor, intra = _RING_FACTOR[collective] * (local - 1), np.zeros(k)
    if local > 1:  # ring over the local GPUs (Patarasuk & Yuan 2009), intra latency per step
        intra = (
            factor / local * size / intra_bw.min(axis=(1, 2)) + factor * fabric.intra_node_latency_s
        )
    inter_rings = blocks.transpose(0, 2, 1).reshape(k * local, d)
    inter_bytes = np.repeat(size / local, local)
    inter = ring_times_s(fabric, inter_rings, inter_bytes, collective, None, what)
    inter = inter.reshape(k, local).max(axis=1)
    return intra + inter


def collective_times_s(
    fabric: Fabric,
    groups: np.ndarray,
    nbytes: float | np.ndarray,
    collective: Collective = "all_reduce",
    algorithm: Algorithm = "best",
    what: str = "a collective",
) -> np.ndarray:
    """Time of concurrent collectives over the rows of ``groups``, s.

    ``algorithm="ring"`` runs a flat ring in the given row order,
    ``"hierarchical"`` the two-level algorithm (falling back to the ring
    where local groups are unequal), ``"best"`` the faster of the two per
    group, as NCCL's tuner picks an algorithm per call.  An algorithm whose
    links include a failed pair is not a candidate; if no candidate is left,
    :class:`InfeasibleError` names the failed pairs.
    """
    groups = np.atleast_2d(np.asarray(groups))
    if groups.shape[1] <= 1:
        return np.zeros(groups.shape[0])
    candidates: list[np.ndarray] = []
    errors: list[InfeasibleError] = []
    if algorithm in ("ring", "best"):
        try:
            candidates.append(ring_times_s(fabric, groups, nbytes, collective, None, what))
        except InfeasibleError as exc:
            errors.append(exc)
    # with one GPU per node the two-level algorithm is the flat ring itself (both visit
    # the nodes in NCCL's order): only costed to name the failed link
    flat_only = algorithm == "best" and bool(candidates) and local_group_size(fabric, groups) == 1
    if algorithm in ("hierarchical", "best") and not flat_only:
        try:
            hier = hierarchical_times_s(fabric, groups, nbytes, collective, what)
            if np.isinf(hier).all() and algorithm == "hierarchical":
                hier = ring_times_s(fabric, groups, nbytes, collective, None, what)
            candidates.append(hier)
        except InfeasibleError as exc:
            errors.append(exc)
    if not candidates:
        raise errors[0]
    times = np.minimum.reduce(candidates)
    if errors and np.isinf(times).any():  # the two-level one does not apply where the ring failed
        raise errors[0]
    return times
