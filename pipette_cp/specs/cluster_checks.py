"""Checks of a cluster's structure that need no :class:`~pipette_cp.specs.cluster.ClusterSpec`.

:func:`nodes_per_domain` turns an explicit NVLink domain map (one id per node or per
GPU) into the run length ``ClusterSpec.nodes_per_nvlink_domain`` holds, refusing a map
that splits a node or whose domains overlap or differ in size;
:func:`check_no_isolated_node` and :func:`check_no_cut_off_node` refuse a node whose
every inter-node link has failed (a dense matrix, a hierarchical fabric), as the
cluster's validators call them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipette_cp.errors import SpecError
from pipette_cp.specs.hierarchy import HierarchicalFabric


def check_no_isolated_node(
    matrix: np.ndarray, gpus_per_node: int, node_names: Sequence[str]
) -> None:
    """Raise ``ValueError`` naming the first node of the GPU x GPU ``matrix`` whose every
    outgoing or every incoming inter-node link has failed (0)."""
    num_gpus = matrix.shape[0]
    num_nodes = num_gpus // gpus_per_node
    if num_nodes < 2:
        return
    ok = matrix > 0
    for node in range(num_nodes):
        rows = np.arange(node * gpus_per_node, (node + 1) * gpus_per_node)
        outside = np.ones(num_gpus, dtype=bool)
        outside[rows] = False
        if not (ok[np.ix_(rows, outside)].any() and ok[np.ix_(outside, rows)].any()):
            raise ValueError(
                f"node {node} ({node_names[node]}) has every inter-node link failed; "
                "drop it from the cluster"
            )


def check_no_cut_off_node(fabric: HierarchicalFabric, node_names: Sequence[str]) -> None:
    """Raise ``ValueError`` naming the first node of ``fabric`` whose failed node pairs
    cover every other node, outgoing or incoming."""
    n = fabric.num_nodes
    failed = fabric.node_pairs.bandwidth_bytes_per_s <= 0
    for ends, side in ((fabric.node_pairs.src, "outgoing"),
                       (fabric.node_pairs.dst, "incoming")):  # fmt: skip
        cut = np.flatnonzero(np.bincount(ends[failed], minlength=n) >= max(n - 1, 1))
        if n > 1 and cut.size:
            k = int(cut[0])
            raise ValueError(f"node {k} ({node_names[k]}) has every {side} inter-node "
                             "link failed; drop it from the cluster")  # fmt: skip


def nodes_per_domain(domains: object, num_nodes: int, gpus_per_node: int, field: str) -> int:
    """``nodes_per_nvlink_domain`` of an explicit NVLink domain map: one domain id per
    node, or per GPU (as ``nvidia-smi -q`` reports a GPU's NVLink clique).

    A domain must be one run of consecutive whole nodes, every domain as long.

    Raises
    ------
    SpecError
        Naming ``field`` and the map: a wrong length or a non-integer id; a node whose
        GPUs lie in two domains (the map splits a node); a domain whose nodes are not
        consecutive (domains overlap); domains of different sizes.

    >>> nodes_per_domain([0, 0, 1, 1], 4, 8, "nvlink_domains")
    2
    >>> nodes_per_domain([7, 7, 7, 7, 3, 3, 3, 3], 2, 4, "nvlink_domains")
    1
    """
    n, g = num_nodes, gpus_per_node
    if not isinstance(domains, list | tuple) or not all(
        isinstance(d, int | np.integer) and not isinstance(d, bool) and d >= 0 for d in domains
    ):
        raise SpecError(field, domains, "expected a list of integer domain ids >= 0")
    if len(domains) not in (n, n * g):
        raise SpecError(field, domains, f"expected {n} domain ids (one per node) or {n * g} "
                        "(one per GPU)")  # fmt: skip
    ids = np.asarray(domains, dtype=np.int64)
    if len(ids) == n * g and n * g != n:
        per_node = ids.reshape(n, g)
        split = np.flatnonzero((per_node != per_node[:, :1]).any(axis=1))
        if split.size:
            k = int(split[0])
            raise SpecError(field, domains, f"node {k} has GPUs in domains "
                            f"{sorted(set(per_node[k].tolist()))}: a domain must hold whole "
                            "nodes")  # fmt: skip
        ids = per_node[:, 0]
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    runs = ids[starts]
    if len(set(runs.tolist())) < len(runs):
        again = int(runs[next(i for i, d in enumerate(runs) if d in runs[:i])])
        nodes = np.flatnonzero(ids == again).tolist()
        raise SpecError(field, domains, f"domain {again} holds nodes {nodes}, not consecutive: "
                        "domains overlap; a domain must be a run of consecutive whole nodes")  # fmt: skip
    sizes = sorted(set(np.diff(np.r_[starts, n]).tolist()))
    if len(sizes) > 1:
        raise SpecError(field, domains, f"domains of {' and '.join(map(str, sizes))} nodes: "
                        f"every domain must hold as many nodes, a divisor of num_nodes={n}")  # fmt: skip
    return sizes[0]
