"""Rack-scale NVLink generators: GB200 NVL72 (racks of 18 compute trays x 4 GPUs).

Each compute tray is a node (a host with its own NICs); the 18 trays of a rack form
one NVLink domain (``ClusterSpec.nodes_per_nvlink_domain``), so a tensor group may
span trays of one rack, and traffic between two trays of a rack runs over NVLink,
not over their NICs.  Call it through :func:`pipette_cp.clusters.generators.registry.generate`.
"""

from __future__ import annotations

import numpy as np

from pipette_cp.clusters.generators.fabric import Fabric
from pipette_cp.clusters.generators.noise import filled_groups
from pipette_cp.clusters.generators.params import (
    Common,
    bandwidth,
    integer,
    leaf_fabric,
    leaf_generator,
)
from pipette_cp.errors import SpecError
from pipette_cp.units import GB

#: Where the numbers of :func:`gb200_nvl72` come from.
NVL72_SOURCES = (
    "NVIDIA GB200 NVL Multi-Node Tuning Guide (docs.nvidia.com/multi-node-nvlink-systems, "
    "2025), 'Understanding Your Grace-Blackwell Systems': the 72x1 configuration is 18 1RU "
    "compute trays of 4 GPUs and 9 NVLink Switch trays, one NVLink domain; ConnectX-7 NICs "
    "on the compute trays",
    "NVIDIA GB200 NVL72 datasheet (2024): fifth-generation NVLink, 1.8 TB/s per GPU "
    "(bidirectional, 900 GB/s each way), 130 TB/s per rack",
    "NVIDIA ConnectX-7 datasheet: 400 Gb/s NDR InfiniBand per port (one per GPU of a GB200 "
    "tray; MLCommons inference v6.1, Crusoe GB200-NVL72 system: 4 ConnectX-7 per 4-GPU "
    "node); NVIDIA ConnectX-8 SuperNIC firmware release notes v40.44.0208: 800 Gb/s XDR "
    "(the GB300 NVL72 trays)",
)


@leaf_generator("gb200-nvl72", gpu="gb200", gpus_per_node=4, nics_per_node=4, nic_gbytes_per_s=40.0)
def gb200_nvl72(
    rng: np.random.Generator,
    common: Common,
    *,
    trays_per_rack: int = 18,
    nvlink_gbytes_per_s: float = 900.0,
) -> Fabric:
    """G7: GB200 NVL72 racks, one NVLink domain of 18 trays x 4 GPUs each, on InfiniBand.

    A node is a compute tray: 4 GPUs (GB200-NVL72-186GB; two GB200 superchips of one
    Grace CPU and two Blackwell GPUs each, GB200 NVL Multi-Node Tuning Guide;
    ``gpus_per_node`` must be 4) and 4 NICs for the traffic between racks, one 400 Gb/s
    ConnectX-7 per GPU.  A stream between two racks gets 40 GB/s under load, as the same
    NDR 400 Gb/s class of NIC delivers on H100 clusters (docs/design.md, section 5:
    39.9 GB/s median pairwise ``sendrecv_perf``) out of its 50 GB/s line rate;
    ``nic_gbytes_per_s=80`` models GB300-class ConnectX-8 trays (800 Gb/s XDR).

    Parameters
    ----------
    {common}
    trays_per_rack : int
        Compute trays in one NVLink domain: 18 (NVL72; a smaller value models a partly
        populated rack, or NVL36-like domains); ``nodes`` must be a multiple of it
        (whole racks; 36 = 2 racks).
    nvlink_gbytes_per_s : float
        GPU-to-GPU NVLink 5 bandwidth inside a rack, inside a tray and between trays
        alike (every NVLink goes through the switch trays), GB/s: 900, the nominal rate
        each way (1.8 TB/s per GPU bidirectional).  Pairs of trays draw the noise below
        it, never above: the nominal rate is the ceiling.
    {noise}

    Returns
    -------
    Fabric
        Node groups = rack ids; ``nodes_per_nvlink_domain = trays_per_rack``.
    """
    kind = common.kind
    if common.gpus_per_node != 4:
        raise SpecError("gpus_per_node", common.gpus_per_node,
                        f"must be 4 for {kind} (a GB200 compute tray holds 4 GPUs)")  # fmt: skip
    trays = integer(f"{kind}.trays_per_rack", trays_per_rack, 1)
    if common.nodes % trays:
        raise SpecError("nodes", common.nodes,
                        f"must be a multiple of trays_per_rack={trays} (whole racks)")  # fmt: skip
    nvlink = bandwidth(f"{kind}.nvlink_gbytes_per_s", nvlink_gbytes_per_s) * GB
    nic = common.nic_gbytes_per_s * GB
    if nic > nvlink:
        raise SpecError(f"{kind}.nic_gbytes_per_s", common.nic_gbytes_per_s,
                        f"must not exceed nvlink_gbytes_per_s={nvlink_gbytes_per_s:g}")  # fmt: skip
    racks = filled_groups(common.nodes, trays)
    fabric = leaf_fabric(
        rng, common, groups=racks, level_bytes_per_s=nvlink, cross_group_factor=nic / nvlink,
        intra_node=nvlink,
    )  # fmt: skip
    fabric.ceiling = np.where(racks[:, None] == racks[None, :], nvlink, np.inf)
    fabric.nodes_per_nvlink_domain = trays
    return fabric
