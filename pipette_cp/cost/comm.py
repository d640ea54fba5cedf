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
- a ring collective over ``n`` GPUs moves ``2 (n-1)/n`` (all-reduce) or
  ``(n-1)/n`` (reduce-scatter, all-gather) of the buffer over every link of
  the ring and is paced by the slowest link, plus one latency per step;
- a hierarchical collective reduces inside each node first, then runs
  ``L`` rings across nodes on ``1/L`` of the buffer each (``L`` = GPUs of the
  group per node), then gathers inside the node;
- a failed pair (off-diagonal 0) on any link an operation needs raises
  :class:`~pipette_cp.errors.InfeasibleError` naming the GPUs: it is never
  used silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from pipette_cp.errors import InfeasibleError
from pipette_cp.specs.cluster import ClusterSpec
from pipette_cp.specs.hierarchy import HierarchicalFabric

Collective = Literal["all_reduce", "reduce_scatter", "all_gather"]
Algorithm = Literal["ring", "hierarchical", "best"]

#: Fraction of the buffer each link carries in a ring collective of n GPUs,
#: as a multiple of (n - 1) / n (Patarasuk & Yuan 2009; NCCL's busbw factors).
_RING_FACTOR = {"all_reduce": 2.0, "reduce_scatter": 1.0, "all_gather": 1.0}


@dataclass(frozen=True, eq=False)
class Fabric:
    """Per-cluster arrays of the communication model (read-only, built once).

    Attributes
    ----------
    bandwidth : numpy.ndarray
        GPU x GPU point-to-point bandwidth, bytes/s; 0 off the diagonal = failed (or a
        :class:`~pipette_cp.specs.hierarchy.LinkView`, indexed the same way, for a
        hierarchical fabric: read pairs with :meth:`pair_bandwidth`).
    latency : numpy.ndarray or None
        Not read (kept for callers that pass one): a flow's start-up latency is the
        intra- or inter-node value (:meth:`pair_latency`).
    node_of : numpy.ndarray
        Node index of every GPU.
    domain_of : numpy.ndarray
        NVLink domain of every GPU (``node_of`` itself when each node is one).
    nic_capacity_bytes_per_s : float
        ``nics_per_node * nic_bandwidth_bytes_per_s``: what all inter-node
        flows of one node share, per direction.
    num_nodes : int
        Number of nodes.
    """

    bandwidth: np.ndarray
    latency: np.ndarray | None
    node_of: np.ndarray
    nic_capacity_bytes_per_s: float
    num_nodes: int
    intra_node_latency_s: float = 0.0
    inter_node_latency_s: float = 0.0
    #: NVLink domain of every GPU (None: its node)
    domain_of: np.ndarray = None  # type: ignore[assignment]
    #: the switch levels and exceptions, when the links are a hierarchical fabric
    hierarchy: HierarchicalFabric | None = None
    #: ``bandwidth`` flattened (dense only): ``B[i, j]`` is ``flat_bandwidth[i * num_gpus + j]``.
    flat_bandwidth: np.ndarray | None = field(init=False, repr=False)

    @classmethod
    def from_cluster(cls, cluster: ClusterSpec) -> Fabric:
        """Gather the arrays of ``cluster`` once.

        Examples
        --------
        >>> import numpy as np
        >>> from pipette_cp.clusters.expand import cluster_from_node_matrix
        >>> from pipette_cp.specs import resolve_gpu
        >>> c = cluster_from_node_matrix(node_bandwidth=np.full((2, 2), 20e9),
        ...     intra_node=200e9, gpus_per_node=4, gpu=resolve_gpu("a100"),
        ...     nics_per_node=2, nic_bandwidth_bytes_per_s=25e9)
        >>> Fabric.from_cluster(c).nic_capacity_bytes_per_s
        50000000000.0
        """
        node_of = np.arange(cluster.num_gpus) // cluster.gpus_per_node
        per = cluster.nodes_per_nvlink_domain
        domain_of = node_of // per if per > 1 else node_of
        for array in (node_of, domain_of):
            array.flags.writeable = False
        return cls(
            bandwidth=cluster.links,
            latency=None,
            node_of=node_of,
            nic_capacity_bytes_per_s=cluster.nics_per_node * cluster.nic_bandwidth_bytes_per_s,
            num_nodes=cluster.num_nodes,
            intra_node_latency_s=cluster.intra_node_latency_s,
            inter_node_latency_s=cluster.inter_node_latency_s,
            domain_of=domain_of,
            hierarchy=cluster.fabric,
        )

    def __post_init__(self) -> None:
        dense = isinstance(self.bandwidth, np.ndarray)
        object.__setattr__(self, "flat_bandwidth", self.bandwidth.reshape(-1) if dense else None)
        if self.domain_of is None:
            object.__setattr__(self, "domain_of", self.node_of)

    def pair_bandwidth(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """``B[src[i], dst[i]]`` for integer arrays of one shape (one gather when dense)."""
        if self.flat_bandwidth is not None:
            return self.flat_bandwidth[src * self.num_gpus + dst]
        assert self.hierarchy is not None
        return self.hierarchy.bandwidth(src, dst)

    def pair_latency(self, src: np.ndarray, dst: np.ndarray, cross: np.ndarray) -> np.ndarray:
        """Start-up latency of each flow (``cross``: whether it leaves its node): the
        intra- or inter-node value, on a fabric too (its levels' latencies differ by
        microseconds; one inter-node value keeps the placement masters' latency terms,
        which take the same two values, exact)."""
        del src, dst
        return np.where(cross, self.inter_node_latency_s, self.intra_node_latency_s)

    @property
    def num_gpus(self) -> int:
        return int(self.node_of.shape[0])


def check_links(fabric: Fabric, src: np.ndarray, dst: np.ndarray, what: str) -> None:
    """Raise :class:`InfeasibleError` if any flow ``src[i] -> dst[i]`` uses a failed pair.

    ``what`` names the operation in the message ("pipeline hop 2->3", ...).
    """
    src, dst = np.asarray(src).ravel(), np.asarray(dst).ravel()
    bad = (fabric.bandwidth[src, dst] <= 0) & (src != dst)
    if bad.any():
        pairs = sorted({(int(i), int(j)) for i, j in zip(src[bad], dst[bad], strict=True)})
        shown = ", ".join(f"{i}->{j}" for i, j in pairs[:6])
        more = f" and {len(pairs) - 6} more" if len(pairs) > 6 else ""
        raise InfeasibleError(
            f"{what} needs the failed GPU pair(s) {shown}{more} (bandwidth 0); "
            "choose a placement that avoids them"
        )


def concurrent_flows(
    fabric: Fabric,
    src: np.ndarray,
    dst: np.ndarray,
    group: np.ndarray | None = None,
    what: str | None = "a transfer",
) -> tuple[np.ndarray, np.ndarray]:
    """(bandwidth, latency) of each flow ``src[i] -> dst[i]``; see :func:`flow_bandwidths`.

    ``what=None`` skips the failed-pair check (a 0 bandwidth is returned):
    for callers that check several operations at once and name them.
    """
    src, dst = np.asarray(src).ravel(), np.asarray(dst).ravel()
    bw = fabric.pair_bandwidth(src, dst)
    if what is not None and not bw.all():
        check_links(fabric, src, dst, what)
    offset = 0 if group is None else np.asarray(group).ravel() * fabric.num_nodes
    return shared_nic_flows(fabric, src, dst, offset, bw=bw)


def shared_nic_flows(
    fabric: Fabric, src: np.ndarray, dst: np.ndarray, offset: np.ndarray | int = 0,
    size: int = 0, bw: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(bandwidth, latency) of concurrent flows ``src[i] -> dst[i]`` (1-D), unchecked.

    ``offset`` (per flow): concurrency group x ``num_nodes``, the NIC-sharing key
    of :func:`concurrent_flows`; ``size``: more than the largest key (0: find it);
    ``bw``: the flows' point-to-point bandwidths, if gathered already.
    """
    if bw is None:
        bw = fabric.pair_bandwidth(src, dst)
    src_node, dst_node = fabric.node_of[src], fabric.node_of[dst]
    cross = src_node != dst_node
    if not cross.any():
        return bw, np.full(bw.shape, fabric.intra_node_latency_s)
    latency = fabric.pair_latency(src, dst, cross)
    nic = cross  # through the NICs: the flows that leave an NVLink domain
    if fabric.domain_of is not fabric.node_of:
        nic = fabric.domain_of[src] != fabric.domain_of[dst]
        if not nic.any():
            return bw, latency
    out_key, in_key = src_node, dst_node
    if not isinstance(offset, int) or offset:
        out_key, in_key = src_node + offset, dst_node + offset
    size = size or int(max(out_key.max(), in_key.max())) + 1
    k_out = np.bincount(out_key[nic], minlength=size)
    k_in = np.bincount(in_key[nic], minlength=size)
    # NIC share per flow: cap / k, k = concurrent flows through that end's NICs
    # (docs/design.md, section 3); flows inside a node (an NVLink domain) keep B[i, j]
    k = np.maximum(k_out[out_key], k_in[in_key])
    share = fabric.nic_capacity_bytes_per_s / np.maximum(k, 1)
    return np.where(nic, np.minimum(bw, share), bw), latency


def flow_bandwidths(
    fabric: Fabric,
    src: np.ndarray,
    dst: np.ndarray,
    group: np.ndarray | None = None,
    what: str = "a transfer",
) -> np.ndarray:
    """Bandwidth each of a set of *concurrent* flows ``src[i] -> dst[i]`` gets, bytes/s.

    Flows between GPUs of one node (of one NVLink domain) get ``B[i, j]``.  Flows
    between domains share their nodes' NICs: with ``k_out`` such flows leaving the
    source node and ``k_in`` entering the destination node at once, each gets
    ``min(B[i, j], cap / k_out, cap / k_in)`` (docs/design.md, section 3:
    concurrent inter-node flows of a node share its NICs).  ``group``
    (optional, one id per flow) splits the flows into sets that do *not*
    overlap in time: only flows of one group share NICs.
    Raises :class:`InfeasibleError` naming ``what`` on a failed pair.
    """
    return concurrent_flows(fabric, src, dst, group, what)[0]


def p2p_times_s(
    fabric: Fabric,
    src: np.ndarray,
    dst: np.ndarray,
    nbytes: float | np.ndarray,
    group: np.ndarray | None = None,
    what: str = "a transfer",
) -> np.ndarray:
    """Time of each of a set of concurrent point-to-point flows, s.

    ``latency(i, j) + nbytes / bw`` with ``bw`` from :func:`flow_bandwidths`
    (``nbytes`` and ``group`` broadcast against the flows).
    """
    bw, latency = concurrent_flows(fabric, src, dst, group, what)
    # point-to-point: latency + bytes / bandwidth (docs/design.md, section 3)
    return latency + np.ravel(nbytes) / bw


def p2p_time_s(fabric: Fabric, src: int, dst: int, nbytes: float) -> float:
    """Time of one point-to-point transfer alone on the fabric, s.

    Raises :class:`InfeasibleError` when ``src -> dst`` is a failed pair.
    """
    return float(p2p_times_s(fabric, np.array([src]), np.array([dst]), nbytes)[0])


def ring_times_s(
    fabric: Fabric,
    rings: np.ndarray,
    nbytes: float | np.ndarray,
    collective: Collective = "all_reduce",
    group: np.ndarray | None = None,
    what: str = "a ring collective",
) -> np.ndarray:
    """Time of concurrent ring collectives, one per row of ``rings``, s.

    Row ``r`` lists the GPUs of one ring in ring order; GPU ``rings[r, i]``
    sends to ``rings[r, (i + 1) % n]``.  The rings run at the same time and
    share NICs (:func:`flow_bandwidths`), except that rings of different
    ``group`` ids (one per row) do not overlap.  ``nbytes`` is a scalar or one
    size per row: the full buffer (the input of a reduce-scatter, the output
    of an all-gather).

    Ring all-reduce: ``2 (n-1)/n * nbytes / min_link_bw + 2 (n-1) * max_link_latency``;
    reduce-scatter and all-gather: half of both terms.
    """
    rings = np.atleast_2d(np.asarray(rings))
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
    """Time of one ring collective over ``ring`` (in ring order) alone on the fabric, s."""
    return float(ring_times_s(fabric, np.asarray(ring)[None, :], nbytes, collective)[0])


def _node_blocks(fabric: Fabric, groups: np.ndarray) -> np.ndarray | None:
    """``groups`` regrouped as (k, nodes, local): members sorted by node, stable.

    None when some group does not have the same number of members on each of
    its nodes (or groups differ in node count): the hierarchical algorithm
    needs equal local groups.
    """
    k, n = groups.shape
    nodes = fabric.node_of[groups]
    order = np.argsort(nodes, axis=1, kind="stable")
    rows = np.arange(k)[:, None]
    ordered, nodes = groups[rows, order], nodes[rows, order]
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
    # with one GPU per node the two-level algorithm is just a ring in node order: only
    # worth costing when the given ring needs a failed link
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
