"""The placement-dependent groups of context and expert parallelism, over the measured matrix.

Three kinds of group sit inside each pipeline stage (:meth:`~pipette_cp.specs.plan.Plan.cp_groups`,
:meth:`~pipette_cp.specs.plan.Plan.expert_groups`):

- **context-parallel rings**: rank ``i`` of a ring passes key/value chunks to rank
  ``i + 1`` (``cp - 1`` steps per attention); the stage's rings run at once, so the
  stage runs at its slowest ring link, NIC shares included (:func:`cp_ring_bandwidths`);
- **expert-parallel groups**: dispatch and combine are all-to-alls, every rank sending
  the same bytes to every other rank of its group (uniform routing).  A rank's sends
  inside its NVLink domain leave through its one NVLink port one after another (the sum
  of ``bytes / B[i, j]``); its sends to other nodes run at once, each at ``B[i, j]`` or its
  share of the node's NICs (all groups of all stages at once, as the pipeline's steady
  state runs them); the rank finishes at the later of the two, the group with its
  slowest rank (:func:`alltoall_times_s`; per node pair where the matrix is constant
  per node pair, :mod:`pipette_cp.cost.network.alltoall_nodes`, per GPU pair elsewhere);
- **expert data-parallel rings**: the routed experts' gradients are reduced over the
  ranks that hold the same experts (``expert_dp`` of them), apart from the dense
  gradients' rings (:func:`expert_dp_rings`).

Every array here holds positions in the flat placement (``stage * replicas * tp +
replica * tp + tp_rank``), built once per layout; a placement turns them into GPU ids
with one gather.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from pipette_cp.cost.network import collectives as comm
from pipette_cp.cost.network.alltoall_nodes import (
    GroupNodes,
    group_nodes_of,
    node_blocks,
    node_level_times,
    usable_groups,
)
from pipette_cp.specs.cluster import ClusterSpec
from pipette_cp.specs.plan import Plan


class GroupFlows(NamedTuple):
    """The links of a layout's context-parallel rings and expert groups (positions)."""

    cp_src: np.ndarray  # (pp, rings * cp): ring link i -> i + 1
    cp_dst: np.ndarray
    ep_groups: np.ndarray  # (pp, groups, ep): the ranks of every expert group
    edp_rings: np.ndarray  # (pp * groups, expert_dp): expert data-parallel rings

    @property
    def ep_src(self) -> np.ndarray:
        """(pp, groups, ep, ep - 1): the sender of every ordered pair of a group."""
        ep = self.ep_groups.shape[-1]
        return np.broadcast_to(self.ep_groups[..., None], (*self.ep_groups.shape, ep - 1))

    @property
    def ep_dst(self) -> np.ndarray:
        """The receivers, as :attr:`ep_src` (rank ``i`` to ``i + 1 ... i + ep - 1 mod ep``)."""
        return self.ep_groups[..., _peers(self.ep_groups.shape[-1])]


def group_flows(plan: Plan) -> GroupFlows:
    """The positions of every context-parallel ring link, expert group and expert
    data-parallel ring of ``plan`` (read-only; empty where the degree is 1)."""
    pp, per_stage = plan.pp, plan.replicas * plan.tp
    base = (np.arange(pp) * per_stage)[:, None, None]
    cp = np.asarray(plan.cp_groups(), dtype=np.int64).reshape(-1, plan.cp)
    cp_src = (base + cp[None]).reshape(pp, -1)
    cp_dst = (base + np.roll(cp, -1, axis=1)[None]).reshape(pp, -1)
    if plan.cp == 1:
        cp_src = cp_dst = cp_src[:, :0]
    ep, etp, edp = plan.ep, plan.expert_tp, plan.expert_dp
    groups = np.asarray(plan.expert_groups(), dtype=np.int64).reshape(-1, ep)
    ep_groups = base + groups[None]
    # expert data-parallel ring: the ranks of one (etp rank, ep rank) across edp ranks
    rings = groups.reshape(edp, etp, ep).transpose(1, 2, 0).reshape(-1, edp)
    edp_rings = (base + rings[None]).reshape(-1, edp)
    out = GroupFlows(cp_src, cp_dst, ep_groups, edp_rings)
    for a in out:
        a.flags.writeable = False
    return out


def cp_ring_bandwidths(
    fabric: comm.Fabric, flat: np.ndarray, f: GroupFlows
) -> tuple[np.ndarray, np.ndarray]:
    """(bandwidth, latency) of each stage's slowest context-parallel ring link, the
    rings of all stages at once sharing the NICs; :class:`~pipette_cp.errors.InfeasibleError`
    for a failed pair."""
    pp = f.cp_src.shape[0]
    if not f.cp_src.size:
        return np.zeros(pp), np.zeros(pp)
    src, dst = flat[f.cp_src.ravel()], flat[f.cp_dst.ravel()]
    bw = fabric.pair_bandwidth(src, dst)
    if not bw.all():
        comm.check_links(fabric, src, dst, "a context-parallel ring")
    bw, lat = comm.shared_nic_flows(fabric, src, dst, bw=bw)
    return bw.reshape(pp, -1).min(axis=1), lat.reshape(pp, -1).max(axis=1)


def node_dedup_factor(num_experts: int, top_k: int, nodes: np.ndarray) -> np.ndarray:
    """Bytes a node-deduplicating dispatcher (DeepEP) sends to other nodes, as a fraction
    of the plain all-to-all's, for groups spread evenly over ``nodes`` nodes: a token's
    ``top_k`` experts, drawn without replacement from ``num_experts`` split evenly over
    the nodes, reach ``(n - 1) (1 - C(E - E/n, k) / C(E, k))`` other nodes on average
    where the plain all-to-all sends ``k (n - 1) / n`` copies there (1 where n = 1)."""
    n = np.maximum(np.asarray(nodes, dtype=float), 1.0)
    others = num_experts - num_experts / n  # experts on the other nodes
    miss = np.ones_like(n)  # probability that no pick lands on a given node
    for i in range(top_k):
        miss *= np.clip((others - i) / (num_experts - i), 0.0, 1.0)
    copies = top_k * (n - 1) / n
    return np.where(n > 1, (n - 1) * (1 - miss) / np.where(n > 1, copies, 1.0), 1.0)


def group_nodes(fabric: comm.Fabric, flat: np.ndarray, f: GroupFlows) -> np.ndarray:
    """Distinct nodes of every expert group, (pp, groups)."""
    members = np.sort(fabric.node_of[flat[f.ep_groups]], axis=-1)
    return 1 + (np.diff(members, axis=-1) != 0).sum(axis=-1)


def expert_members(flat: np.ndarray, f: GroupFlows) -> np.ndarray:
    """The GPUs of every expert group, (pp * groups, ep), in rank order."""
    return flat[f.ep_groups.reshape(-1, f.ep_groups.shape[-1])]


def alltoall_times_s(
    fabric: comm.Fabric, flat: np.ndarray, f: GroupFlows, nbytes: float,
    remote_scale: np.ndarray | float = 1.0,
) -> np.ndarray:  # fmt: skip
    """Each stage's time of one all-to-all (dispatch or combine) over its expert groups,
    ``nbytes`` from every rank to every other rank of its group, s (see the module
    docstring; zeros with ep = 1); ``remote_scale`` (per group, (pp, groups), or one
    number) scales the bytes of the flows that leave their NVLink domain (a
    deduplicating dispatcher, :func:`node_dedup_factor`).  The NIC shares are
    :func:`~pipette_cp.cost.network.collectives.shared_nic_flows`' (all flows at once), computed here on
    the flows that leave their NVLink domain only (the hot path of expert layouts)."""
    pp = f.ep_groups.shape[0]
    return stage_alltoall_times_s(fabric, expert_members(flat, f), pp, nbytes, remote_scale)


#: Group sizes up to which every ordered pair is costed directly: two flows a group cost
#: less than sorting the group by node (80 against 100 us for the 512 groups of ep = 2
#: on 1,024 H100s, measured on the 2-core development machine)
PAIRWISE_EP = 2


def stage_alltoall_times_s(
    fabric: comm.Fabric, members: np.ndarray, pp: int, nbytes: float,
    remote_scale: np.ndarray | float = 1.0, nodes: GroupNodes | None = None,
) -> np.ndarray:  # fmt: skip
    """:func:`alltoall_times_s` of the groups ``members`` (GPU ids, (pp * groups, ep),
    :func:`expert_members`; ``nodes``: their :func:`~pipette_cp.cost.network.alltoall_nodes.group_nodes_of`
    if at hand): per node pair where the matrix allows it
    (:mod:`pipette_cp.cost.network.alltoall_nodes`), per GPU pair elsewhere."""
    ep = members.shape[-1]
    if ep <= 1 or nbytes <= 0:
        return np.zeros(pp)
    scale = None
    if not np.isscalar(remote_scale) or remote_scale != 1.0:
        shape = (pp, members.shape[0] // pp)
        scale = np.broadcast_to(np.asarray(remote_scale, dtype=float), shape).reshape(-1)
    plain = np.isfinite(nbytes) and (scale is None or bool(np.isfinite(scale).all()))
    blocks = node_blocks(fabric) if ep > PAIRWISE_EP and plain else None
    if blocks is not None:
        groups = nodes if nodes is not None else group_nodes_of(fabric, members)
        holds = usable_groups(blocks, groups)
        if holds.any():
            times, k = node_level_times(fabric, blocks, groups, nbytes, scale)
            if not holds.all():  # the NIC flows are all groups': pass them on
                rest = np.flatnonzero(~holds)
                part = None if scale is None else scale[rest]
                ranks = pairwise_alltoall_times_s(fabric, members[rest], nbytes, part, k)
                times[rest] = ranks.max(axis=1)
            return times.reshape(pp, -1).max(axis=1)
    return pairwise_alltoall_times_s(fabric, members, nbytes, scale).reshape(pp, -1).max(axis=1)


def pairwise_alltoall_times_s(
    fabric: comm.Fabric, members: np.ndarray, nbytes: float, scale: np.ndarray | None = None,
    nic_flows: np.ndarray | None = None,
) -> np.ndarray:  # fmt: skip
    """Each rank's all-to-all time over every ordered pair of the groups ``members``
    (GPU ids, (groups, ep)), s, (groups, ep): :func:`alltoall_times_s` before the
    maximum over ranks; ``scale`` (per group) as its ``remote_scale``; ``nic_flows``: the
    flows through every node's NICs (default: those of ``members``' own flows)."""
    peer = _peers(members.shape[-1])
    dst = members[..., peer]
    bw = fabric.bandwidth[members[..., None], dst]
    if not bw.all():
        src = np.broadcast_to(members[..., None], dst.shape)
        comm.check_links(fabric, src, dst, "an expert-parallel all-to-all")
    dom, node = fabric.domain_of[members], fabric.node_of[members]
    remote = dom[..., None] != dom[..., peer]
    latency = np.full(members.shape, fabric.intra_node_latency_s)
    if remote.any():
        k = nic_flows
        if k is None:  # all pairs of each group: the flows leaving a node equal those entering it
            counts = remote.sum(axis=-1)
            k = np.bincount(node.ravel(), weights=counts.ravel(), minlength=fabric.num_nodes)
        kn = np.maximum(k[node], 1.0)
        share = fabric.nic_capacity_bytes_per_s / np.maximum(kn[..., None], kn[..., peer])
        bw = np.where(remote, np.minimum(bw, share), bw)
        latency[remote.any(axis=-1)] = fabric.inter_node_latency_s
    if fabric.domain_of is not fabric.node_of:  # inside a domain, across its trays
        across = (node[..., None] != node[..., peer]).any(axis=-1)
        latency[across] = fabric.inter_node_latency_s
    t = nbytes / bw
    if scale is not None:
        t = np.where(remote, t * scale[:, None, None], t)
    serial = np.where(remote, 0.0, t).sum(axis=-1)  # one NVLink port, one send after another
    parallel = np.where(remote, t, 0.0).max(axis=-1)  # through the NICs, all at once
    return np.maximum(serial, parallel) + latency


@functools.lru_cache(maxsize=64)
def _peers(ep: int) -> np.ndarray:
    """(ep, ep - 1): the other ranks of a group, from each rank."""
    out = (np.arange(ep)[:, None] + 1 + np.arange(ep - 1)[None, :]) % ep
    out.flags.writeable = False
    return out


def expert_dp_rings(flat: np.ndarray, f: GroupFlows) -> np.ndarray:
    """The GPUs of every expert data-parallel ring, (pp * rings, expert_dp)."""
    return flat[f.edp_rings]


def fastest_link_bytes_per_s(cluster: ClusterSpec) -> float:
    """The cluster's fastest GPU pair, bytes/s: where a context-parallel ring could run
    at best (what placement-free lower bounds assume)."""
    return cluster.fastest_link_bytes_per_s()
