"""Build a GPU-level :class:`ClusterSpec` from node-level measurements."""

from __future__ import annotations

import numpy as np

from pipette_cp.specs._base import validate_spec
from pipette_cp.specs.cluster import ClusterSpec
from pipette_cp.specs.gpu import GpuSpec


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
            "bandwidth_bytes_per_s": expand_node_matrix(node_bandwidth, intra_node, gpus_per_node),
            "intra_node_latency_s": intra_node_latency_s,
            "inter_node_latency_s": inter_node_latency_s,
            "source": source,
            "nodes_per_nvlink_domain": nodes_per_nvlink_domain,
        },
        "cluster",
    )
