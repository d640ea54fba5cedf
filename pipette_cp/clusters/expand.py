"""Build a GPU-level :class:`ClusterSpec` from node-level measurements.

Up to :data:`~pipette_cp.specs.hierarchy.MAX_DENSE_VIEW_GPUS` GPUs (and where NVLink
domains span several nodes) the node matrix is expanded to the GPU x GPU matrix;
beyond, it is held exactly as a fabric
(:func:`node_matrix_fabric`: one level over every node plus an exception for each pair
off that level), so a 16,384-GPU cluster never builds its 2 GB GPU matrix.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipette_cp.specs._base import validate_spec
from pipette_cp.specs.cluster import MIN_LINK_BYTES_PER_S, ClusterSpec
from pipette_cp.specs.gpu import GpuSpec
from pipette_cp.specs.hierarchy import MAX_DENSE_VIEW_GPUS, HierarchicalFabric


def expand_node_matrix(
    node_bandwidth: np.ndarray, intra_node: float | np.ndarray, gpus_per_node: int
) -> np.ndarray:
    """GPU x GPU matrix from a node x node one.

    Every GPU pair across nodes a, b gets ``node_bandwidth[a, b]`` (one stream
    between two nodes; NIC sharing is modelled separately by the cost model).
    Inside a node, pairs get ``intra_node``: a scalar, or a G x G matrix for
    non-uniform fabrics (e.g. the DGX-1 cube mesh).  The diagonal is 0.
    """
    g = gpus_per_node
    matrix = np.repeat(np.repeat(np.asarray(node_bandwidth, dtype=np.float64), g, 0), g, 1)
    intra = np.broadcast_to(np.asarray(intra_node, dtype=np.float64), (g, g))
    for node in range(node_bandwidth.shape[0]):
        block = slice(node * g, (node + 1) * g)
        matrix[block, block] = intra
    np.fill_diagonal(matrix, 0.0)
    return matrix


def node_matrix_fabric(
    node_bandwidth: np.ndarray,
    intra_node: float | np.ndarray | Sequence[float],
    gpus_per_node: int,
    *,
    intra_node_latency_s: float = 5e-6,
    inter_node_latency_s: float = 10e-6,
) -> HierarchicalFabric:
    """The node matrix as a fabric with the same links: one level over every node at the
    median working node pair, every other node pair an exception (0: failed), and the
    intra-node pairs that differ from the median intra-node value as GPU-pair exceptions.

    ``intra_node``: one value, a G x G matrix for every node, or one value per node.
    """
    node = np.asarray(node_bandwidth, dtype=np.float64)
    n, g = node.shape[0], gpus_per_node
    off = ~np.eye(n, dtype=bool)
    working = node[off & (node > 0)]
    level = float(np.median(working)) if working.size else MIN_LINK_BYTES_PER_S
    src, dst = np.nonzero(off & (node != level))
    intra = np.asarray(intra_node, dtype=np.float64)
    local = ~np.eye(g, dtype=bool)
    if intra.ndim == 2:  # one G x G matrix for every node
        per_gpu = np.broadcast_to(intra, (n, g, g))
    else:  # one value, or one per node
        per_gpu = np.broadcast_to(np.broadcast_to(intra, (n,))[:, None, None], (n, g, g))
    values = per_gpu[:, local] if g > 1 else np.zeros((n, 0))
    nvlink = float(np.median(values)) if values.size else max(level, MIN_LINK_BYTES_PER_S)
    k, pair = np.nonzero(values != nvlink)
    i, j = np.nonzero(local)
    return validate_spec(HierarchicalFabric, {
        "num_nodes": n, "gpus_per_node": g, "nvlink_bandwidth_bytes_per_s": nvlink,
        "nvlink_latency_s": intra_node_latency_s,
        "levels": [{"name": "all", "nodes": n, "bandwidth_bytes_per_s": level,
                    "latency_s": inter_node_latency_s}],
        "node_pairs": {"src": src, "dst": dst, "bandwidth_bytes_per_s": node[src, dst]},
        "gpu_pairs": {"src": k * g + i[pair], "dst": k * g + j[pair],
                      "bandwidth_bytes_per_s": values[k, pair]},
    }, "cluster.fabric")  # fmt: skip


def cluster_from_node_matrix(
    *,
    node_bandwidth: np.ndarray,
    intra_node: float | np.ndarray,
    gpus_per_node: int,
    gpu: GpuSpec,
    nics_per_node: int,
    nic_bandwidth_bytes_per_s: float,
    name: str = "cluster",
    node_names: tuple[str, ...] | None = None,
    node_groups: tuple[int, ...] | None = None,
    source: str = "",
    intra_node_latency_s: float = 5e-6,
    inter_node_latency_s: float = 10e-6,
    nodes_per_nvlink_domain: int = 1,
) -> ClusterSpec:
    """A homogeneous cluster whose GPU pairs inherit their node pair's bandwidth
    (``nodes_per_nvlink_domain``: consecutive nodes of one NVLink domain)."""
    num_nodes = int(node_bandwidth.shape[0])
    width = max(3, len(str(num_nodes - 1)))
    # the same links without the GPU matrix (a fabric's NVLink domain is one node)
    if num_nodes * gpus_per_node > MAX_DENSE_VIEW_GPUS and nodes_per_nvlink_domain == 1:
        links: dict = {"fabric": node_matrix_fabric(
            node_bandwidth, intra_node, gpus_per_node, intra_node_latency_s=intra_node_latency_s,
            inter_node_latency_s=inter_node_latency_s)}  # fmt: skip
    else:
        links = {"bandwidth_bytes_per_s": expand_node_matrix(node_bandwidth, intra_node,
                                                             gpus_per_node)}  # fmt: skip
    return validate_spec(
        ClusterSpec,
        {
            "name": name,
            "num_nodes": num_nodes,
            "gpus_per_node": gpus_per_node,
            "gpu_types": {gpu.name: gpu},
            "node_gpu_types": (gpu.name,) * num_nodes,
            "node_names": node_names or tuple(f"node{i:0{width}d}" for i in range(num_nodes)),
            "node_groups": node_groups,
            "nics_per_node": nics_per_node,
            "nic_bandwidth_bytes_per_s": nic_bandwidth_bytes_per_s,
            **links,
            "intra_node_latency_s": intra_node_latency_s,
            "inter_node_latency_s": inter_node_latency_s,
            "source": source,
            "nodes_per_nvlink_domain": nodes_per_nvlink_domain,
        },
        "cluster",
    )
