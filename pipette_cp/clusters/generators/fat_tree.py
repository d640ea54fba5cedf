"""Generated H100 fat trees of any size as a :class:`~pipette_cp.specs.hierarchy.HierarchicalFabric`.

``fat_tree(gpus, seed)``: 8-GPU H100 nodes on NDR, ``leaf_nodes`` nodes per leaf
switch, ``pod_leaves`` leaves per pod, pods joined by the spine (a rail-optimised
fat tree has the same levels: every GPU's NIC on its rail's leaf).  Bandwidths of one
stream are those measured on the H100 clusters the other generators follow
(:func:`~pipette_cp.clusters.generators.healthy.h100_multileaf`): 367 GB/s over NVSwitch,
46 GB/s inside a leaf, 0.93 x that across leaves; across pods a further
``spine_factor`` (0.9, an assumption: a 2:1-free spine costs a hop's contention).
Exceptions at measured rates: ``slow_nic_rate`` of the nodes with NICs at half speed,
``degraded_pair_rate`` of the node pairs at ``degraded_factor`` (0.5) of their level,
``failed_pair_rate`` of the node pairs failed; drawn without building any pair table,
so memory is O(nodes + exceptions) (a 100,000-GPU tree with 2 % of node pairs
degraded holds 3.1 million exceptions, 75 MB).
"""

from __future__ import annotations

import numpy as np

from pipette_cp.errors import SpecError
from pipette_cp.specs import ClusterSpec, resolve_gpu
from pipette_cp.specs.hierarchy import (
    FabricLevel,
    HierarchicalFabric,
    NodeExceptions,
    PairExceptions,
)

GB = 1e9


def _pairs(rng: np.random.Generator, nodes: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` distinct ordered node pairs (no node with itself), drawn uniformly."""
    keys = np.zeros(0, dtype=np.int64)
    while keys.size < count:
        need = int(1.1 * (count - keys.size)) + 16
        src = rng.integers(0, nodes, need, dtype=np.int64)
        dst = rng.integers(0, nodes, need, dtype=np.int64)
        fresh = src[src != dst] * nodes + dst[src != dst]
        keys = np.unique(np.concatenate((keys, fresh)))
    keys = rng.permutation(keys)[:count]
    return keys // nodes, keys % nodes


def fat_tree(
    gpus: int,
    seed: int = 0,
    *,
    leaf_nodes: int = 32,
    pod_leaves: int = 16,
    slow_nic_rate: float = 0.01,
    degraded_pair_rate: float = 0.02,
    degraded_factor: float = 0.5,
    failed_pair_rate: float = 0.0,
    spine_factor: float = 0.9,
) -> HierarchicalFabric:
    """An H100 fat tree of ``gpus`` GPUs (a multiple of 8; see the module docstring)."""
    if gpus <= 0 or gpus % 8:
        raise SpecError("gpus", gpus, "must be a positive multiple of 8 (8-GPU nodes)")
    for name, rate in (("slow_nic_rate", slow_nic_rate), ("degraded_pair_rate", degraded_pair_rate),
                       ("failed_pair_rate", failed_pair_rate)):  # fmt: skip
        if not 0 <= rate <= 1:
            raise SpecError(name, rate, "must be a share in [0, 1]")
    if degraded_pair_rate + failed_pair_rate > 1:
        raise SpecError("failed_pair_rate", failed_pair_rate, "with degraded_pair_rate above 1")
    rng = np.random.default_rng(seed)
    nodes = gpus // 8
    leaf = 46 * GB
    sizes = []
    if nodes > leaf_nodes:
        sizes.append(("leaf", leaf_nodes, leaf, 5e-6))
    pod = leaf_nodes * pod_leaves
    if nodes > pod and nodes % pod == 0:
        sizes.append(("pod", pod, 0.93 * leaf, 7e-6))
        sizes.append(("spine", nodes, 0.93 * spine_factor * leaf, 9e-6))
    else:
        sizes.append(("spine", nodes, 0.93 * leaf if sizes else leaf, 7e-6))
    if any(nodes % n for _, n, _, _ in sizes):
        raise SpecError("gpus", gpus, f"{nodes} nodes do not fill whole leaves of {leaf_nodes}")
    levels = tuple(FabricLevel(name=n, nodes=k, bandwidth_bytes_per_s=bw, latency_s=lat)
                   for n, k, bw, lat in sizes)  # fmt: skip
    slow = rng.permutation(nodes)[: round(slow_nic_rate * nodes)]
    total = nodes * (nodes - 1)
    degraded = round(degraded_pair_rate * total)
    failed = round(failed_pair_rate * total)
    src, dst = _pairs(rng, nodes, degraded + failed)
    common = {
        "num_nodes": nodes, "gpus_per_node": 8, "nvlink_bandwidth_bytes_per_s": 367 * GB,
        "nvlink_latency_s": 2e-6, "levels": levels,
        "slow_nics": NodeExceptions(node=np.sort(slow), nic_factor=np.full(slow.size, 0.5)),
    }  # fmt: skip
    # a degraded pair runs at degraded_factor of what its level (and NICs) give it
    nominal = HierarchicalFabric(**common)  # type: ignore[arg-type]
    base = nominal.bandwidth(src[:degraded] * 8, dst[:degraded] * 8) * degraded_factor
    bw = np.concatenate((base, np.zeros(failed)))
    pairs = PairExceptions(src=src, dst=dst, bandwidth_bytes_per_s=bw)
    return HierarchicalFabric(**common, node_pairs=pairs)  # type: ignore[arg-type]


def fat_tree_cluster(gpus: int, seed: int = 0, **fabric: float | int) -> ClusterSpec:
    """A :class:`ClusterSpec` on :func:`fat_tree` (keywords: its parameters): H100 SXM
    nodes, 8 NDR NICs of 40 GB/s under load (the measured per-GPU figure of
    :func:`~pipette_cp.clusters.generators.healthy.h100_multileaf`), node ``k`` named
    ``node{k:05d}``, node groups = leaves; the cost model's one inter-node latency is
    the outermost level's."""
    tree = fat_tree(gpus, seed, **fabric)  # type: ignore[arg-type]
    gpu = resolve_gpu("h100")
    nodes = tree.num_nodes
    leaf = tree.levels[0].nodes if len(tree.levels) > 1 else nodes
    return ClusterSpec(
        name=f"fat-tree-{gpus}-s{seed}",
        num_nodes=nodes,
        gpus_per_node=tree.gpus_per_node,
        gpu_types={gpu.name: gpu},
        node_gpu_types=(gpu.name,) * nodes,
        node_names=tuple(f"node{k:05d}" for k in range(nodes)),
        node_groups=tuple(k // leaf for k in range(nodes)),
        nics_per_node=8,
        nic_bandwidth_bytes_per_s=40 * GB,
        fabric=tree,
        intra_node_latency_s=tree.nvlink_latency_s,
        inter_node_latency_s=tree.levels[-1].latency_s,  # the outermost: no plan looks faster
        source=f"fat_tree(gpus={gpus}, seed={seed}, {fabric})",
    )
