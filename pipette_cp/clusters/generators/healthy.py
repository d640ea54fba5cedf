"""Healthy-fabric generators: G1 (A100 + HDR), G2 (H100 + NDR multi-leaf), G5 (V100 DGX-1).

Each returns a :class:`~pipette_cp.clusters.generators.fabric.Fabric`; call them through
:func:`pipette_cp.clusters.generators.registry.generate`, which seeds the random stream,
names the cluster and records the parameters in its ``source``.
"""

from __future__ import annotations

import numpy as np

from pipette_cp.clusters.generators.fabric import Fabric
from pipette_cp.clusters.generators.noise import filled_groups, uneven_groups
from pipette_cp.clusters.generators.params import (
    Common,
    bandwidth,
    choice,
    factor,
    integer,
    leaf_fabric,
    leaf_generator,
    number,
)
from pipette_cp.errors import SpecError
from pipette_cp.units import GB

#: NVLinks between GPU pairs of a DGX-1 with V100 (hybrid cube-mesh): two quads
#: {0,1,2,3} and {4,5,6,7}, each fully connected, plus the links 0-4, 1-5, 2-6, 3-7;
#: every GPU has 6 links: 2 neighbours with 2 links, 2 with 1, 3 reached over PCIe/QPI.
#: Source: NVIDIA DGX-1 with Tesla V100 System Architecture whitepaper (2017), Fig. 2
#: ("cube with GPUs at its corners ... all twelve edges connected through NVLink (some
#: edges have two NVLink connections), and with two of the six faces having their
#: diagonals connected"); matches ``nvidia-smi topo -m`` on a DGX-1V and the NCCL
#: topology dump of NVIDIA/nccl issue #671 (GPU0: 1 link to GPU1, GPU2; 2 to GPU3, GPU4).
DGX1_NVLINKS = np.array(
    [
        [0, 1, 1, 2, 2, 0, 0, 0],
        [1, 0, 2, 1, 0, 2, 0, 0],
        [1, 2, 0, 2, 0, 0, 1, 0],
        [2, 1, 2, 0, 0, 0, 0, 1],
        [2, 0, 0, 0, 0, 1, 1, 2],
        [0, 2, 0, 0, 1, 0, 2, 1],
        [0, 0, 1, 0, 1, 2, 0, 2],
        [0, 0, 0, 1, 2, 1, 2, 0],
    ],
    dtype=np.int64,
)


def filled_fabric(
    rng: np.random.Generator,
    common: Common,
    group_size: int,
    cross_group_factor: float,
    intra_node: float | np.ndarray,
) -> Fabric:
    """Switch groups of ``group_size`` nodes filled in hostfile order, the NIC bandwidth
    inside a group and ``cross_group_factor`` x that across (G1, G4, G5)."""
    return leaf_fabric(
        rng,
        common,
        groups=filled_groups(common.nodes, group_size),
        level_bytes_per_s=common.nic_gbytes_per_s * GB,
        cross_group_factor=cross_group_factor,
        intra_node=intra_node,
    )


def filled_leaves(
    rng: np.random.Generator,
    common: Common,
    leaf_size: int,
    cross_leaf_factor: float,
    intra_node: float | np.ndarray,
) -> Fabric:
    """:func:`filled_fabric` on leaves of ``leaf_size`` nodes (G1, G5); checks the two
    parameters."""
    leaf = integer(f"{common.kind}.leaf_size", leaf_size, 1)
    cross = factor(f"{common.kind}.cross_leaf_factor", cross_leaf_factor)
    return filled_fabric(rng, common, leaf, cross, intra_node)


@leaf_generator("healthy-a100", gpu="a100", nics_per_node=8, nic_gbytes_per_s=18.8)
def healthy_a100(
    rng: np.random.Generator,
    common: Common,
    *,
    intra_node_gbytes_per_s: float = 235.0,
    leaf_size: int = 20,
    cross_leaf_factor: float = 0.95,
) -> Fabric:
    """G1: a healthy A100 cluster on an HDR InfiniBand fat tree.

    Servers as Azure NDv4/NDmv4: 8 GPUs (A100-SXM4-80GB as NDmv4) and 8 HDR NICs (4 or
    8 allowed, docs/design.md, section 5), each stream 18.8 GB/s under load
    (docs/design.md, section 5; an idle HDR NIC reaches 23.7 GB/s: SuperBench
    Azure-NDv4-A100 baseline.json, ``ib-loopback/ib_write_8388608_ib0_bw``).

    Parameters
    ----------
    {common}
    intra_node_gbytes_per_s : float
        GPU-to-GPU NVSwitch bandwidth inside a node, GB/s: 235, the 8-GPU NCCL
        all-reduce bus bandwidth at 8 GiB (SuperBench Azure-NDv4-A100 baseline.json,
        ``nccl-bw/allreduce_8589934592_busbw`` = 235.05; NDmv4: 235.65).
    leaf_size : int
        Nodes per leaf switch, filled in hostfile order (docs/design.md: up to 20).
    cross_leaf_factor : float
        Bandwidth across leaves relative to within a leaf (docs/design.md: 0.95).
    {noise}

    Returns
    -------
    Fabric
        Node groups = leaf ids; the level is ``nic_gbytes_per_s`` inside a leaf.
    """
    kind = common.kind
    choice(f"{kind}.nics_per_node", common.nics_per_node, (4, 8), "(HDR A100 servers)")
    intra = bandwidth(f"{kind}.intra_node_gbytes_per_s", intra_node_gbytes_per_s)
    return filled_leaves(rng, common, leaf_size, cross_leaf_factor, intra * GB)


@leaf_generator(
    "h100-multileaf", gpu="h100", nics_per_node=8, nic_gbytes_per_s=40.0, noise_sigma=0.025
)
def h100_multileaf(
    rng: np.random.Generator,
    common: Common,
    *,
    leaf_pair_gbytes_per_s: float = 46.0,
    intra_node_gbytes_per_s: float = 367.0,
    mean_leaf_size: float = 8.0,
    leaf_concentration: float = 1.0,
    cross_leaf_factor: float = 0.93,
    dense_cross_leaf_factor: float = 0.77,
) -> Fabric:
    """G2: an H100 cluster on an NDR fabric with several leaves of uneven size.

    Servers as xxrjun/nccl-tests-cluster example-cluster01: 8 GPUs (H100 80GB HBM3, as
    the logs of that cluster state) and NDR NICs, 8 (one per GPU: not stated upstream,
    assumed), each stream 40 GB/s under load (docs/design.md, section 5;
    example-cluster01 pairwise ``sendrecv_perf`` at G=1: median 39.9 GB/s).

    Parameters
    ----------
    {common}
    leaf_pair_gbytes_per_s : float
        Point-to-point GPU pair bandwidth between two nodes of one leaf, GB/s: 46
        (docs/design.md; example-cluster01 ``sendrecv_perf`` at G=8: 45.8-46.3 GB/s).
    intra_node_gbytes_per_s : float
        NVSwitch pair bandwidth, GB/s: 367 (example-cluster01 single-node
        ``sendrecv_perf`` at G=8, median peak bus bandwidth of 10 nodes 367.2).
    mean_leaf_size : float
        Leaves = ``ceil(nodes / mean_leaf_size)`` (at least 2 from two nodes on).
    leaf_concentration : float
        Dirichlet concentration of the leaf sizes; small = very uneven (the real
        10-node cluster has leaves of 7, 2 and 1 nodes).
    cross_leaf_factor : float
        Point-to-point bandwidth across leaves relative to within (docs/design.md: 0.93;
        example-cluster01 at G=8: 42-43 vs 46 GB/s).
    dense_cross_leaf_factor : float
        The same factor when all GPUs of both nodes send at once (docs/design.md: 0.77).
        Not in the matrix (which is point-to-point): recorded in ``source`` for the
        cost model's NIC-sharing term.
    {noise}

    Returns
    -------
    Fabric
        Node groups = leaf ids.

    Notes
    -----
    ``noise_sigma`` defaults to 0.025 here (0.026 elsewhere): the pairs of one leaf
    of example-cluster01 vary by under 1 % (45.8-46.3 GB/s), so nearly all of the
    noise is the direction part.  The leaf structure alone puts the healthy CV of
    the whole cluster near 4 % (example-cluster01: 4.1 %), so G2's target is <= 5 %.
    """
    kind = common.kind
    pair = bandwidth(f"{kind}.leaf_pair_gbytes_per_s", leaf_pair_gbytes_per_s)
    intra = bandwidth(f"{kind}.intra_node_gbytes_per_s", intra_node_gbytes_per_s)
    mean = number(f"{kind}.mean_leaf_size", mean_leaf_size, 1.0, 1e6)
    conc = number(f"{kind}.leaf_concentration", leaf_concentration, 0.0, 1e3, open_low=True)
    cross = factor(f"{kind}.cross_leaf_factor", cross_leaf_factor)
    factor(f"{kind}.dense_cross_leaf_factor", dense_cross_leaf_factor)
    return leaf_fabric(
        rng,
        common,
        groups=uneven_groups(rng, common.nodes, mean, conc),
        level_bytes_per_s=pair * GB,
        cross_group_factor=cross,
        intra_node=intra * GB,
    )


def dgx1_intra_node(two_links: float, one_link: float, pcie: float) -> np.ndarray:
    """8 x 8 GPU bandwidth of a DGX-1V (bytes/s) from the per-link-count values.

    >>> m = dgx1_intra_node(45e9, 22.5e9, 10e9)
    >>> [int((m[0] == v).sum()) for v in (45e9, 22.5e9, 10e9)]
    [2, 2, 3]
    """
    matrix = np.choose(DGX1_NVLINKS, [pcie, one_link, two_links]).astype(np.float64)
    np.fill_diagonal(matrix, 0.0)
    return matrix


@leaf_generator("v100-cube", gpu="v100", nics_per_node=4, nic_gbytes_per_s=9.4)
def v100_cube(
    rng: np.random.Generator,
    common: Common,
    *,
    two_link_gbytes_per_s: float = 45.0,
    one_link_gbytes_per_s: float = 22.5,
    pcie_gbytes_per_s: float = 10.0,
    leaf_size: int = 18,
    cross_leaf_factor: float = 0.95,
) -> Fabric:
    """G5: V100 DGX-1 servers (hybrid cube-mesh NVLink) on EDR InfiniBand.

    Inside a node the GPU pairs differ (2 NVLinks / 1 NVLink / PCIe), so where a
    tensor-parallel group sits inside the node matters.  A DGX-1 holds 8 GPUs
    (V100-SXM2-32GB; ``gpus_per_node`` must be 8: the cube mesh is an 8-GPU topology)
    and 4 EDR NICs (DGX-1 whitepaper: four 100 Gb/s InfiniBand EDR ports); a GPU pair
    between nodes gets 9.4 GB/s (docs/design.md, section 5; EDR line rate 12.5 GB/s).

    Parameters
    ----------
    {common}
    two_link_gbytes_per_s, one_link_gbytes_per_s, pcie_gbytes_per_s : float
        Intra-node pair bandwidth for GPUs joined by 2 NVLinks, 1 NVLink, or only
        PCIe/QPI, GB/s: 45 / 22.5 / 10 (docs/design.md, section 5; NVLink 2 is 25 GB/s
        per link and direction, DGX-1 whitepaper).
    leaf_size : int
        Nodes per EDR leaf switch: 18 (a 36-port switch with half its ports down;
        an assumption, the sources give no leaf size).
    cross_leaf_factor : float
        Across leaves vs within a leaf: 0.95, assumed equal to G1 (docs/design.md).
    {noise}

    Returns
    -------
    Fabric
        The intra-node matrix is the 8 x 8 :func:`dgx1_intra_node` (no noise).
    """
    kind, gpus = common.kind, common.gpus_per_node
    if gpus != 8:
        raise SpecError(
            "gpus_per_node", gpus, f"must be 8 for {kind} (the DGX-1 cube mesh has 8 GPUs)"
        )
    values = [
        bandwidth(f"{kind}.{name}", value) * GB
        for name, value in (
            ("two_link_gbytes_per_s", two_link_gbytes_per_s),
            ("one_link_gbytes_per_s", one_link_gbytes_per_s),
            ("pcie_gbytes_per_s", pcie_gbytes_per_s),
        )
    ]
    return filled_leaves(rng, common, leaf_size, cross_leaf_factor, dgx1_intra_node(*values))
