"""The cluster: nodes, GPUs, NICs and the measured GPU-to-GPU bandwidth matrix.

The checks that need no :class:`ClusterSpec` (an NVLink domain map's run length, a node
cut off by failed links) are in :mod:`pipette_cp.specs.cluster_checks`.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field, ValidationInfo, field_validator, model_validator

from pipette_cp.errors import SpecError
from pipette_cp.specs._base import FrozenSpec, Matrix
from pipette_cp.specs.cluster_checks import (
    check_no_cut_off_node,
    check_no_isolated_node,
    nodes_per_domain,
)
from pipette_cp.specs.gpu import GpuSpec
from pipette_cp.specs.hierarchy import HierarchicalFabric
from pipette_cp.units import GB

#: Largest cluster given as a dense matrix (the matrix alone is 2 GiB): a larger one is
#: given as a :class:`~pipette_cp.specs.hierarchy.HierarchicalFabric` (``fabric``), whose
#: memory grows with the nodes and the exceptions, not with the GPU pairs.
MAX_GPUS = 16384

#: Most GPUs (and NICs) in one node: the largest NVLink domains hold a few hundred GPUs.
MAX_GPUS_PER_NODE = 1024

#: Slowest working link, bytes/s (1 MB/s = 0.001 GB/s, the resolution of a cluster file):
#: a pair below it is a unit mistake or a failed pair, to be given as 0.
MIN_LINK_BYTES_PER_S = 1e6

#: Fastest link, bytes/s (1 PB/s, some 500 x NVLink 5): above it is a unit mistake.
MAX_LINK_BYTES_PER_S = 1e15

#: Longest start-up latency of one transfer, s (measured ones are micro-seconds).
MAX_LATENCY_S = 1.0

__all__ = [
    "MAX_GPUS",
    "MAX_GPUS_PER_NODE",
    "MAX_LATENCY_S",
    "MAX_LINK_BYTES_PER_S",
    "MIN_LINK_BYTES_PER_S",
    "ClusterSpec",
    "nodes_per_domain",
]


class ClusterSpec(FrozenSpec):
    """N nodes x G GPUs and the bandwidth every ordered GPU pair delivers.

    GPU ``g`` lives on node ``g // gpus_per_node`` (local index
    ``g % gpus_per_node``); ``bandwidth_bytes_per_s[i, j]`` is what one
    point-to-point stream from GPU i to GPU j achieves (it may differ from
    ``[j, i]``).  An off-diagonal 0 marks a failed or unmeasured pair: it is
    never used silently; every other entry lies in [:data:`MIN_LINK_BYTES_PER_S`,
    :data:`MAX_LINK_BYTES_PER_S`].  The diagonal is meaningless and stored as 0.

    NVLink domains: every ``nodes_per_nvlink_domain`` consecutive nodes form one NVLink
    domain (node ``k`` is in domain ``k // nodes_per_nvlink_domain``; 1, the default, is
    one domain per node).  A GB200 NVL72 rack is 18 compute trays (nodes, each a host
    with its own NICs) of 4 GPUs in one 72-GPU domain: a tensor-parallel group may span
    the trays of a domain, never two domains, and traffic between two trays of one
    domain runs over NVLink (the matrix holds its bandwidth), not over their NICs.
    """

    name: str = Field(default="cluster", description="Identifier of this cluster or snapshot.")
    num_nodes: int = Field(gt=0, description="Number of servers.")
    gpus_per_node: int = Field(
        gt=0, le=MAX_GPUS_PER_NODE, description="GPUs in every server (NVLink domain)."
    )
    gpu_types: dict[str, GpuSpec] = Field(
        description="The GPU types present, by name (usually just one)."
    )
    node_gpu_types: tuple[str, ...] = Field(
        description="GPU type name of each node (a key of gpu_types); mixed types are allowed."
    )
    node_names: tuple[str, ...] = Field(description="Host name of each node, in hostfile order.")
    nodes_per_nvlink_domain: int = Field(
        default=1,
        gt=0,
        description="Consecutive nodes that form one NVLink domain (1: each node is one; "
        "18 for a GB200 NVL72 rack of 4-GPU trays); must divide num_nodes.",
    )
    node_groups: tuple[int, ...] | None = Field(
        default=None,
        description="Switch group (leaf, pod) of each node, if known; used for statistics only.",
    )
    nics_per_node: int = Field(
        gt=0, le=MAX_GPUS_PER_NODE, description="Inter-node NICs per server."
    )
    nic_bandwidth_bytes_per_s: float = Field(
        ge=MIN_LINK_BYTES_PER_S,
        le=MAX_LINK_BYTES_PER_S,
        description="What one NIC delivers in one direction under load, bytes/s.",
    )
    bandwidth_bytes_per_s: Matrix | None = Field(
        default=None,
        description="GPU x GPU point-to-point bandwidth, bytes/s; off-diagonal 0 = failed pair "
        "(or give fabric).",
    )
    fabric: HierarchicalFabric | None = Field(
        default=None,
        description="The links as switch levels plus sparse measured exceptions, instead of "
        "the dense bandwidth matrix (clusters of any size).",
    )
    intra_node_latency_s: float = Field(
        default=5e-6,
        ge=0,
        le=MAX_LATENCY_S,
        description="Start-up latency of one intra-node transfer, s.",
    )
    inter_node_latency_s: float = Field(
        default=10e-6,
        ge=0,
        le=MAX_LATENCY_S,
        description="Start-up latency of one inter-node transfer, s.",
    )
    source: str = Field(
        default="", description="Where the numbers come from (measurement, generator)."
    )

    @field_validator("nodes_per_nvlink_domain")
    @classmethod
    def _domains_divide(cls, value: int, info: ValidationInfo) -> int:
        nodes = info.data.get("num_nodes")
        if nodes is not None and nodes % value:
            raise ValueError(
                f"must divide num_nodes={nodes}: a domain is that many consecutive whole nodes"
            )
        return value

    @model_validator(mode="after")
    def _node_lists_match(self) -> ClusterSpec:
        for field in ("node_gpu_types", "node_names", "node_groups"):
            values = getattr(self, field)
            if values is not None and len(values) != self.num_nodes:
                raise ValueError(
                    f"{field} has {len(values)} entries for num_nodes={self.num_nodes}"
                )
        unknown = sorted(set(self.node_gpu_types) - set(self.gpu_types))
        if unknown:
            raise ValueError(f"node_gpu_types names {unknown} missing from gpu_types")
        if len(set(self.node_names)) != self.num_nodes:
            raise ValueError("node_names must be distinct")
        if self.node_groups is not None and min(self.node_groups, default=0) < 0:
            raise ValueError(f"node_groups must be >= 0, got {min(self.node_groups)}")
        return self

    @model_validator(mode="after")
    def _matrix_is_sane(self) -> ClusterSpec:
        if (self.bandwidth_bytes_per_s is None) == (self.fabric is None):
            raise ValueError("give exactly one of bandwidth_bytes_per_s (a GPU x GPU matrix) "
                             "and fabric (switch levels and exceptions)")  # fmt: skip
        if self.fabric is not None:
            return self._fabric_matches(self.fabric)
        matrix = self.matrix
        n = self.num_gpus
        if matrix.shape != (n, n):
            raise ValueError(
                f"bandwidth matrix is {matrix.shape[0]}x{matrix.shape[1]} but the cluster has "
                f"{self.num_nodes} nodes x {self.gpus_per_node} GPUs = {n} GPUs"
            )
        if not np.isfinite(matrix).all():
            i, j = np.argwhere(~np.isfinite(matrix))[0]
            raise ValueError(f"bandwidth[{i}][{j}]={matrix[i, j]} is not a finite number")
        if (matrix < 0).any():
            i, j = np.argwhere(matrix < 0)[0]
            raise ValueError(f"bandwidth[{i}][{j}]={matrix[i, j]} is negative")
        low, high = MIN_LINK_BYTES_PER_S, MAX_LINK_BYTES_PER_S
        if np.min(matrix, where=matrix > 0, initial=np.inf) < low or matrix.max() > high:
            for bad, why in (
                ((matrix > 0) & (matrix < low),
                 f"is below {low:g} bytes/s (1 MB/s); give 0 for a failed pair"),
                (matrix > high, f"is above {high:g} bytes/s (1 PB/s): a unit mistake?"),
            ):  # fmt: skip
                np.fill_diagonal(bad, False)  # the diagonal is ignored
                if bad.any():
                    i, j = np.argwhere(bad)[0]
                    raise ValueError(f"bandwidth[{i}][{j}]={matrix[i, j]:g} {why}")
        if np.diagonal(matrix).any():
            fixed = matrix.copy()
            np.fill_diagonal(fixed, 0.0)
            fixed.flags.writeable = False
            object.__setattr__(self, "bandwidth_bytes_per_s", fixed)
        check_no_isolated_node(self.matrix, self.gpus_per_node, self.node_names)
        return self

    def _fabric_matches(self, fabric: HierarchicalFabric) -> ClusterSpec:
        for field in ("num_nodes", "gpus_per_node"):
            if getattr(fabric, field) != getattr(self, field):
                raise ValueError(f"fabric.{field}={getattr(fabric, field)} but the cluster's "
                                 f"{field} is {getattr(self, field)}")  # fmt: skip
        if self.nodes_per_nvlink_domain > 1:
            raise ValueError("a hierarchical fabric has one NVLink domain per node: "
                             "nodes_per_nvlink_domain must be 1")  # fmt: skip
        check_no_cut_off_node(fabric, self.node_names)
        return self

    @property
    def links(self) -> np.ndarray:
        """The GPU x GPU bandwidth, bytes/s, for indexing: the dense matrix, or a
        :class:`~pipette_cp.specs.hierarchy.LinkView` of the fabric (same indexing)."""
        if self.fabric is not None:
            return self.fabric.view()  # type: ignore[return-value]
        return self.bandwidth_bytes_per_s  # type: ignore[return-value]

    @property
    def matrix(self) -> np.ndarray:
        """The dense GPU x GPU bandwidth matrix, for what needs all of it (statistics,
        comparisons, files): a hierarchical fabric's is built up to 4,096 GPUs."""
        if self.bandwidth_bytes_per_s is not None:
            return self.bandwidth_bytes_per_s
        return np.asarray(self.links)

    @property
    def is_hierarchical(self) -> bool:
        """Whether the links are a :class:`HierarchicalFabric` (no dense matrix)."""
        return self.fabric is not None

    def __eq__(self, other: object) -> bool:
        # pydantic compares __dict__, which is ambiguous for the numpy matrix.
        if not isinstance(other, ClusterSpec):
            return NotImplemented
        mine, theirs = dict(self.__dict__), dict(other.__dict__)
        matrix, other_matrix = (
            mine.pop("bandwidth_bytes_per_s"),
            theirs.pop("bandwidth_bytes_per_s"),
        )
        if (matrix is None) != (other_matrix is None):
            return False
        return mine == theirs and (matrix is None or np.array_equal(matrix, other_matrix))

    def __hash__(self) -> int:
        links = self.bandwidth_bytes_per_s
        return hash((self.name, self.num_nodes, self.gpus_per_node,
                     float(links.sum()) if links is not None else hash(self.fabric)))  # fmt: skip

    # ----------------------------------------------------------------- helpers
    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    def node_of(self, gpu: int) -> int:
        """Node holding ``gpu``."""
        return gpu // self.gpus_per_node

    @property
    def gpus_per_domain(self) -> int:
        """GPUs of one NVLink domain: ``nodes_per_nvlink_domain x gpus_per_node``."""
        return self.nodes_per_nvlink_domain * self.gpus_per_node

    @property
    def num_domains(self) -> int:
        return self.num_nodes // self.nodes_per_nvlink_domain

    def domain_of(self, gpu: int) -> int:
        """NVLink domain holding ``gpu``."""
        return gpu // self.gpus_per_domain

    def domain_of_node(self, node: int) -> int:
        """NVLink domain holding ``node``."""
        return node // self.nodes_per_nvlink_domain

    def gpus_of_node(self, node: int) -> range:
        """GPU indices of ``node``."""
        return range(node * self.gpus_per_node, (node + 1) * self.gpus_per_node)

    def gpu_of_node(self, node: int) -> GpuSpec:
        """GPU type installed in ``node``."""
        return self.gpu_types[self.node_gpu_types[node]]

    @property
    def failed_mask(self) -> np.ndarray:
        """Boolean GPU x GPU matrix, True where an off-diagonal pair has failed (dense
        clusters; :meth:`pair_failed` asks about given pairs on any cluster)."""
        mask = np.asarray(self.links) <= 0
        np.fill_diagonal(mask, False)
        return mask

    @property
    def has_failed_pairs(self) -> bool:
        """Whether some off-diagonal GPU pair has failed."""
        if self.fabric is not None:
            return bool((self.fabric.node_pairs.bandwidth_bytes_per_s <= 0).any()
                        or (self.fabric.gpu_pairs.bandwidth_bytes_per_s <= 0).any())  # fmt: skip
        return bool(self.failed_mask.any())

    def pair_failed(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Whether each ordered GPU pair ``src[i] -> dst[i]`` (i != j) has failed."""
        src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        return (self.links[src, dst] <= 0) & (src != dst)

    def failed_pairs(self) -> list[tuple[int, int]]:
        """Ordered GPU pairs (i, j), i != j, that must not carry traffic."""
        if self.fabric is not None:
            f, g = self.fabric, self.gpus_per_node
            nodes = f.node_pairs.bandwidth_bytes_per_s <= 0
            local = np.arange(g)
            src = (f.node_pairs.src[nodes, None, None] * g + local[:, None]).repeat(g, axis=2)
            dst = (f.node_pairs.dst[nodes, None, None] * g + local[None, :]).repeat(g, axis=1)
            gpus = f.gpu_pairs.bandwidth_bytes_per_s <= 0
            pairs = {(int(a), int(b)) for a, b in zip(src.ravel(), dst.ravel(), strict=True)}
            pairs |= {(int(a), int(b)) for a, b in
                      zip(f.gpu_pairs.src[gpus], f.gpu_pairs.dst[gpus], strict=True)}  # fmt: skip
            return sorted(p for p in pairs if self.links[p[0], p[1]] <= 0)
        return [(int(i), int(j)) for i, j in np.argwhere(self.failed_mask)]

    def fastest_link_bytes_per_s(self) -> float:
        """The fastest GPU pair's bandwidth, bytes/s (1 for a single GPU)."""
        if self.fabric is not None:
            f = self.fabric
            values = [lv.bandwidth_bytes_per_s for lv in f.levels]
            values += [f.nvlink_bandwidth_bytes_per_s] * (f.gpus_per_node > 1)
            for pairs in (f.node_pairs, f.gpu_pairs):
                values += [float(pairs.bandwidth_bytes_per_s.max(initial=0.0))]
            return max(values) if self.num_gpus > 1 else 1.0
        bandwidth = self.bandwidth_bytes_per_s
        assert bandwidth is not None
        return float(bandwidth.max()) if bandwidth.size > 1 else 1.0

    def slowest_link_bytes_per_s(self) -> float:
        """A lower bound on every working GPU pair's bandwidth, bytes/s (the slowest
        working pair of a matrix; a fabric's bound without building one; 1 for none)."""
        if self.fabric is not None:
            return self.fabric.slowest_working_bytes_per_s()
        bandwidth = self.bandwidth_bytes_per_s
        assert bandwidth is not None
        working = bandwidth[bandwidth > 0]
        return float(working.min()) if working.size else 1.0

    def fastest_links_bytes_per_s(self) -> tuple[float, float]:
        """The fastest GPU pair inside a node and between two nodes, bytes/s (0: none;
        the inter-node value falls back to the intra-node one on one node)."""
        g = self.gpus_per_node
        if self.fabric is not None:
            f = self.fabric
            intra = f.nvlink_bandwidth_bytes_per_s if g > 1 else 0.0
            inter = max([lv.bandwidth_bytes_per_s for lv in f.levels] if self.num_nodes > 1
                        else [0.0])  # fmt: skip
            inter = max(inter, float(f.node_pairs.bandwidth_bytes_per_s.max(initial=0.0)))
            gp = f.gpu_pairs
            same = gp.src // g == gp.dst // g
            intra = max(intra, float(gp.bandwidth_bytes_per_s[same].max(initial=0.0)))
            inter = max(inter, float(gp.bandwidth_bytes_per_s[~same].max(initial=0.0)))
        else:
            bw = np.asarray(self.bandwidth_bytes_per_s)
            node = np.arange(self.num_gpus) // g
            same = node[:, None] == node[None, :]
            intra = float(bw[same].max(initial=0.0))
            inter = float(bw[~same].max(initial=0.0))
        return intra, inter or intra

    def node_matrix(self) -> np.ndarray:
        """Node x node bandwidth: the mean over the healthy GPU pairs of each node pair
        (0 where all failed); the diagonal holds the mean intra-node bandwidth."""
        if self.fabric is not None:
            raise SpecError("cluster.fabric", f"{self.num_nodes} nodes", "the node x node "
                            "matrix of a hierarchical fabric is not built (N^2 memory): a "
                            "method that needs it (amp, pipette-sa) takes a dense matrix")  # fmt: skip
        g, n = self.gpus_per_node, self.num_nodes
        blocks = self.matrix.reshape(n, g, n, g).transpose(0, 2, 1, 3)
        healthy = blocks > 0
        counts = healthy.sum(axis=(2, 3))
        sums = np.where(healthy, blocks, 0.0).sum(axis=(2, 3))
        return np.divide(sums, counts, out=np.zeros((n, n)), where=counts > 0)

    @property
    def is_homogeneous(self) -> bool:
        return len(set(self.node_gpu_types)) == 1

    def describe(self) -> str:
        """One line: '16 x 8 A100-SXM4-80GB, 4 NICs x 25 GB/s' (and, with domains of
        several nodes, ', NVLink domains of 18 nodes')."""
        types = "+".join(sorted(set(self.node_gpu_types)))
        domains = self.nodes_per_nvlink_domain
        return (
            f"{self.num_nodes} x {self.gpus_per_node} {types}, "
            f"{self.nics_per_node} NICs x {self.nic_bandwidth_bytes_per_s / GB:.1f} GB/s"
            + (f", NVLink domains of {domains} nodes" if domains > 1 else "")
        )
