"""Expert all-to-alls costed per node pair where the measured matrix is constant per node pair.

:func:`~pipette_cp.cost.network.parallel_groups.alltoall_times_s` walks every ordered pair of every
expert group: ``ep (ep - 1)`` flows a group, 64,512 for the 16 groups of ep = 64 on
1,024 GPUs.  Its per-rank result depends on the pair only through ``B[i, j]``, the two
NVLink domains and the two nodes' NIC flow counts.  Where ``B`` is one number over all
GPU pairs of two nodes (and over the off-diagonal pairs of one node), and every node
lies in one domain, a rank's serial (NVLink) and parallel (NIC) times are those of
every member of its group on its node, and a group is costed over its distinct node
pairs, weighted by member counts (64 pairs a group for Megatron's order at ep = 64 on
8-GPU nodes).  Every generated kind but ``v100-cube`` (its hybrid cube mesh inside a
node) is constant per node pair (:func:`~pipette_cp.clusters.generators.registry.generate`, 16
nodes, 36 for ``gb200-nvl72``, seed 1); ``degraded`` has failed node pairs (4 % of its
blocks are 0).

Exactness is per group: a group is costed pairwise when a node pair it uses is not
constant, is 0 (failed) or is not finite, or when it lists a GPU twice; the whole call
is where some node's GPUs lie in different domains, no node has constant NVLink pairs,
or the bytes or their scale are not finite.  The NIC flow counts are always those of
all groups at once.  Node-level parallel times are the pairwise ones bit for bit (the
same quotients, maxima and products); serial times are ``(count - 1) x (bytes / B)``
instead of a sum of ``count - 1`` equal quotients (a relative difference of at most
``ep`` units in the last place).
"""

from __future__ import annotations

import functools
import weakref
from typing import NamedTuple

import numpy as np

from pipette_cp.cost.network import collectives as comm


class NodeBlocks(NamedTuple):
    """The node-pair view of a fabric's bandwidth matrix (read-only)."""

    bandwidth: np.ndarray  # (nodes, nodes): B of a usable block, 1.0 elsewhere
    usable: np.ndarray  # (nodes, nodes): constant, positive and finite (or no pair)
    domain: np.ndarray  # (nodes,): NVLink domain of every node
    by_node: bool  # every domain is one node
    all_usable: bool
    ascending: bool  # node_of never decreases with the GPU id


class GroupNodes(NamedTuple):
    """The nodes of every expert group, slot-major (slots, groups): slot ``s`` of a
    group is its ``s``-th node in ascending order; slots past its distinct nodes repeat
    its first node with a count of 0.  Reductions over slots then run across the groups
    at once: the minimum over 8 slots of (16 groups x 8 slots) takes 1.5 us slot-major
    and 9.4 us group-major (numpy, the 2-core development machine)."""

    members: np.ndarray  # (groups, ep): GPU ids in rank order
    nodes: np.ndarray  # (slots, groups)
    counts: np.ndarray  # (slots, groups): members on each node
    distinct: np.ndarray  # (groups,): distinct nodes
    repeated: np.ndarray  # (groups,): a GPU listed twice


_BLOCKS: weakref.WeakKeyDictionary[comm.Fabric, NodeBlocks | None] = weakref.WeakKeyDictionary()


def node_blocks(fabric: comm.Fabric) -> NodeBlocks | None:
    """The node-pair view of ``fabric`` (built once per fabric: 3-4 ms at 1,024 H100s,
    7 ms at 1,008 GB200s, measured on the 2-core development machine), or None where a
    node has no GPU or spans several NVLink domains, or no node has constant NVLink pairs."""
    try:
        return _BLOCKS[fabric]
    except KeyError:
        pass
    out = _build_blocks(fabric)
    _BLOCKS[fabric] = out
    return out


def _build_blocks(fabric: comm.Fabric) -> NodeBlocks | None:
    n, node_of = fabric.num_nodes, np.asarray(fabric.node_of)
    if node_of.size == 0 or node_of.min() < 0 or node_of.max() >= n:
        return None
    sizes = np.bincount(node_of, minlength=n)
    if not sizes.all():
        return None
    ascending = bool((np.diff(node_of) >= 0).all())
    order = np.arange(node_of.size) if ascending else np.argsort(node_of, kind="stable")
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    domain = np.asarray(fabric.domain_of)[order[starts]]
    if not (np.asarray(fabric.domain_of) == domain[node_of]).all():
        return None
    if ascending and (sizes == sizes[0]).all():  # equal nodes in GPU order: one reshape
        low, high = _equal_blocks(np.asarray(fabric.bandwidth, dtype=float), n, int(sizes[0]))
    else:
        matrix = np.array(fabric.bandwidth, dtype=float)[np.ix_(order, order)]
        np.fill_diagonal(matrix, np.inf)  # a GPU's own entry is no pair (NaN stays NaN)
        low = np.minimum.reduceat(np.minimum.reduceat(matrix, starts, 0), starts, 1)
        np.fill_diagonal(matrix, -np.inf)
        high = np.maximum.reduceat(np.maximum.reduceat(matrix, starts, 0), starts, 1)
    with np.errstate(invalid="ignore"):
        usable = (low == high) & (low > 0) & np.isfinite(low)
    if (sizes > 1).any() and not usable.diagonal()[sizes > 1].any():
        return None  # no node with constant NVLink pairs (DGX-1's cube mesh): all pairwise
    usable[np.diag_indices(n)] |= sizes == 1  # no pair inside a one-GPU node
    bandwidth = np.where(usable, low, 1.0)
    bandwidth[np.diag_indices(n)] = np.where(sizes > 1, bandwidth.diagonal(), 1.0)
    by_node = bool(np.unique(domain).size == n)
    for array in (bandwidth, usable, domain):
        array.flags.writeable = False
    return NodeBlocks(bandwidth, usable, domain, by_node, bool(usable.all()), ascending)


def _equal_blocks(matrix: np.ndarray, n: int, g: int) -> tuple[np.ndarray, np.ndarray]:
    """(min, max) of every g x g block of ``matrix``, the diagonal blocks without their
    diagonal (NaN for a one-GPU node)."""
    blocks = matrix.reshape(n, g, n, g)
    low, high = blocks.min(axis=1).min(axis=2), blocks.max(axis=1).max(axis=2)  # rows first
    own = blocks[np.arange(n), :, np.arange(n), :][:, ~np.eye(g, dtype=bool)]  # (n, g (g - 1))
    diag = np.diag_indices(n)
    low[diag] = own.min(axis=1) if g > 1 else np.nan
    high[diag] = own.max(axis=1) if g > 1 else np.nan
    return low, high


def group_nodes_of(fabric: comm.Fabric, members: np.ndarray) -> GroupNodes:
    """The distinct nodes and member counts of every row of ``members`` (GPU ids)."""
    q, ep = members.shape
    blocks = node_blocks(fabric)
    if blocks is not None and blocks.ascending:  # sorted GPUs are sorted by node
        gpus = np.sort(members, axis=1)
        node = fabric.node_of[gpus]
    else:
        gpus = fabric.node_of[members] * fabric.num_gpus + members
        gpus.sort(axis=1)
        node = gpus // fabric.num_gpus
    repeated = (gpus[:, 1:] == gpus[:, :-1]).any(axis=1)
    new = np.empty((q, ep), dtype=bool)
    new[:, :1] = True
    np.not_equal(node[:, 1:], node[:, :-1], out=new[:, 1:])
    slot = np.cumsum(new, axis=1)
    distinct = slot[:, -1]
    width = int(distinct.max()) if q else 1
    if width == 1:
        return GroupNodes(members, node[:, 0][None], np.full((1, q), ep), distinct, repeated)
    index = ((slot - 1) * q + np.arange(q)[:, None]).ravel()
    counts = np.bincount(index, minlength=q * width).reshape(width, q)
    nodes = np.repeat(node[:, 0][None], width, axis=0)
    nodes.reshape(-1)[index] = node.ravel()  # equal values at a repeated index
    return GroupNodes(members, nodes, counts, distinct, repeated)


def usable_groups(blocks: NodeBlocks, g: GroupNodes) -> np.ndarray:
    """Whether :func:`node_level_times` holds for every group: each node pair it uses
    (a node with itself where it has two members) is usable, and no GPU is listed twice."""
    holds = ~g.repeated
    if blocks.all_usable:
        return holds
    a, b = g.nodes[None, :, :], g.nodes[:, None, :]  # [b, a, group]
    eye = _eye(g.nodes.shape[0])[:, :, None]
    needed = (g.counts[:, None, :] > eye) & (g.counts > 0)[None, :, :]
    return holds & (blocks.usable[a, b] | ~needed).all(axis=(0, 1))


def node_level_times(
    fabric: comm.Fabric, blocks: NodeBlocks, g: GroupNodes, nbytes: float,
    scale: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(time of every group's all-to-all, s, right where :func:`usable_groups` holds; NIC
    flows through every node, all groups at once); ``scale`` (one non-negative factor
    per group, or None) multiplies the times of the flows that leave their domain.

    Pair arrays are [receiving slot, sending slot, group].  A padding slot repeats its
    group's first node with no member: it sends nothing over NVLink, and its node-pair
    links are the first node's, so it changes no maximum."""
    width = g.nodes.shape[0]
    ep = g.members.shape[1]
    a, b = g.nodes[None, :, :], g.nodes[:, None, :]
    if blocks.by_node:  # same domain = same node: the NVLink pairs are the node's own
        serial = (g.counts - 1) * (nbytes / blocks.bandwidth[g.nodes, g.nodes])
        remote, in_domain = a != b, g.counts
    else:
        eye = _eye(width)[:, :, None]
        dom = blocks.domain[g.nodes]
        same = dom[None, :, :] == dom[:, None, :]
        peers = g.counts[:, None, :] - eye  # peers on slot b of a rank on slot a
        in_domain = np.where(same, g.counts[:, None, :], 0).sum(axis=0)
        serial = np.where(same, peers * (nbytes / blocks.bandwidth[a, b]), 0.0).sum(axis=0)
        serial = np.where(g.counts > 0, serial, 0.0)
        remote = ~same
    # flows leaving a rank's domain, summed per node: equal to those entering it
    weights = (g.counts * (ep - in_domain)).ravel()
    k = np.bincount(g.nodes.ravel(), weights=weights, minlength=fabric.num_nodes)
    latency = np.where(g.distinct > 1, fabric.inter_node_latency_s, fabric.intra_node_latency_s)
    if width == 1:
        return serial[0] + latency, k
    # cap / max(k_a, k_b) = min(cap / k_a, cap / k_b), and bytes over the slowest link is
    # the largest quotient: the pairwise path's numbers, bit for bit
    nic = fabric.nic_capacity_bytes_per_s / np.maximum(k, 1.0)[g.nodes]
    link = np.minimum(np.minimum(blocks.bandwidth[a, b], nic[:, None, :]), nic[None, :, :])
    parallel = nbytes / np.where(remote, link, np.inf).min(axis=0)  # 0: no NIC flow
    if scale is not None:
        parallel = parallel * scale
    per = np.maximum(serial, parallel)  # NVLink sends in turn, NIC sends at once
    return per.max(axis=0) + latency, k


@functools.lru_cache(maxsize=64)
def _eye(width: int) -> np.ndarray:
    out = np.eye(width, dtype=bool)
    out.flags.writeable = False
    return out
