"""The :class:`Fabric` and the point-to-point flows over it, NIC sharing included.

:meth:`Fabric.from_cluster` gathers a cluster's arrays once (the GPU x GPU links, each
GPU's node and NVLink domain, a node's NIC capacity); :func:`concurrent_flows` gives
every flow of a set that runs at once its bandwidth (``B[i, j]``, or its share of the
NICs where it leaves an NVLink domain) and start-up latency, and :func:`p2p_times_s` its
time, as :mod:`pipette_cp.cost.network.collectives` models them (docs/design.md, section 3); a failed
pair raises :class:`~pipette_cp.errors.InfeasibleError` (:func:`check_links`).  The
ring and hierarchical collectives built on these flows are in :mod:`pipette_cp.cost.network.collectives`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipette_cp.errors import InfeasibleError
from pipette_cp.specs.cluster import ClusterSpec
from pipette_cp.specs.hierarchy import HierarchicalFabric


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
        intra- or inter-node value (on a fabric too).
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
    # the intra- or inter-node value, on a fabric too: its levels' latencies differ by
    # microseconds, and one inter-node value keeps the masters' latency terms exact
    latency = np.where(cross, fabric.inter_node_latency_s, fabric.intra_node_latency_s)
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
