"""Rack-scale NVLink generators: GB200 NVL72 and GB300 NVL72 (racks of 18 compute trays x
4 GPUs).

Each compute tray is a node (a host with its own NICs); the 18 trays of a rack form
one NVLink domain (``ClusterSpec.nodes_per_nvlink_domain``), so a tensor group may
span trays of one rack, and traffic between two trays of a rack runs over NVLink,
not over their NICs.  A job may instead hold a Slurm segment of each rack
(``segment_trays``): Slurm's topology/block plugin makes each rack a block and cuts a
job's allocation into segments of ``--segment`` trays, each inside one block, so the
job's NVLink domain is its segment (16 trays = 64 GPUs), and its segments lie in
different racks.  Both generators are one function, :func:`nvl72_generator`, with the
tray's GPU and NIC as its arguments.  Call them through
:func:`pipette_cp.clusters.generators.registry.generate`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

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
from pipette_cp.clusters.generators.targets import Targets
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
#: Where the segments of ``segment_trays`` come from.
SEGMENT_SOURCE = (
    "Slurm topology/block plugin (topology.conf BlockName/BlockSizes; sbatch --segment: "
    "the allocation in segments of that many nodes, each inside one block); CoreWeave "
    "SUNK 'Topology/Block Scheduling in Slurm': one block per GB200/GB300 NVL72 rack, "
    "largest recommended segment 16 trays"
)
#: Where the numbers of :func:`gb300_nvl72` come from.
GB300_NVL72_SOURCES = (
    "NVIDIA GB300 NVL72 specifications (2025): 72 Blackwell Ultra GPUs and 36 Grace CPUs "
    "in one NVLink domain, fifth-generation NVLink 1.8 TB/s per GPU (bidirectional, 900 "
    "GB/s each way; 130 TB/s per rack), one ConnectX-8 SuperNIC of 800 Gb/s per GPU; the "
    "rack of the GB200 NVL72, 18 compute trays of 4 GPUs and 9 NVLink Switch trays",
    "NVIDIA ConnectX-8 SuperNIC firmware release notes v40.44.0208: 800 Gb/s XDR "
    "InfiniBand (100 GB/s line rate)",
    SEGMENT_SOURCE,
)

#: The parameters both rack generators take beyond :data:`~.params.COMMON_DOC`.
RACK_DOC = """
    trays_per_rack : int
        Compute trays in one rack: 18 (NVL72; a smaller value models a partly
        populated rack, or NVL36-like racks); without ``segment_trays``, ``nodes``
        must be a multiple of it (whole racks; 36 = 2 racks).
    segment_trays : int or None
        Trays of each rack the job holds (a Slurm segment, at most ``trays_per_rack``):
        the job's NVLink domain; ``nodes`` must be a multiple of it, one segment per
        rack (16: four 64-GPU domains in 64 nodes).  None: whole racks.
    nvlink_gbytes_per_s : float
        GPU-to-GPU NVLink 5 bandwidth inside a rack, inside a tray and between trays
        alike (every NVLink goes through the switch trays), GB/s: 900, the nominal rate
        each way (1.8 TB/s per GPU bidirectional).  Pairs of trays draw the noise below
        it, never above: the nominal rate is the ceiling."""


def nvl72_generator(
    kind: str, tray: str, nic_gbytes_per_s: float, summary: str
) -> Callable[..., Fabric]:
    """The generator of NVL72 racks of ``tray`` compute trays (catalogue GPU ``tray``, 4
    GPUs and 4 NICs per tray, ``nic_gbytes_per_s`` per stream between racks by default);
    ``summary`` opens its docstring, :data:`RACK_DOC` documents its own parameters."""

    def racks(
        rng: np.random.Generator,
        common: Common,
        *,
        trays_per_rack: int = 18,
        segment_trays: int | None = None,
        nvlink_gbytes_per_s: float = 900.0,
    ) -> Fabric:
        if common.gpus_per_node != 4:
            raise SpecError("gpus_per_node", common.gpus_per_node,
                            f"must be 4 for {kind} (a {tray} compute tray holds 4 GPUs)")  # fmt: skip
        domain = trays = integer(f"{kind}.trays_per_rack", trays_per_rack, 1)
        if segment_trays is not None:
            domain = integer(f"{kind}.segment_trays", segment_trays, 1)
            if domain > trays:
                raise SpecError(f"{kind}.segment_trays", segment_trays,
                                f"must be <= trays_per_rack={trays} (a segment lies in one rack)")  # fmt: skip
            if common.nodes % domain:
                raise SpecError("nodes", common.nodes,
                                f"must be a multiple of segment_trays={domain} (one segment per rack)")  # fmt: skip
        elif common.nodes % trays:
            raise SpecError("nodes", common.nodes,
                            f"must be a multiple of trays_per_rack={trays} (whole racks)")  # fmt: skip
        nvlink = bandwidth(f"{kind}.nvlink_gbytes_per_s", nvlink_gbytes_per_s) * GB
        nic = common.nic_gbytes_per_s * GB
        if nic > nvlink:
            raise SpecError(f"{kind}.nic_gbytes_per_s", common.nic_gbytes_per_s,
                            f"must not exceed nvlink_gbytes_per_s={nvlink_gbytes_per_s:g}")  # fmt: skip
        domains = filled_groups(common.nodes, domain)
        fabric = leaf_fabric(
            rng, common, groups=domains, level_bytes_per_s=nvlink,
            cross_group_factor=nic / nvlink, intra_node=nvlink,
        )  # fmt: skip
        fabric.ceiling = np.where(domains[:, None] == domains[None, :], nvlink, np.inf)
        fabric.nodes_per_nvlink_domain = domain
        return fabric

    racks.__doc__ = f"""{summary}

    Parameters
    ----------
    {{common}}
{RACK_DOC.strip(chr(10))}
    {{noise}}

    Returns
    -------
    Fabric
        Node groups = NVLink domains (racks, or segments); ``nodes_per_nvlink_domain =
        trays_per_rack``, or ``segment_trays``.
    """
    racks.__name__ = racks.__qualname__ = kind.replace("-", "_")
    decorate = leaf_generator(
        kind, gpu=tray.lower(), gpus_per_node=4, nics_per_node=4, nic_gbytes_per_s=nic_gbytes_per_s
    )
    return decorate(racks)


gb200_nvl72 = nvl72_generator(
    "gb200-nvl72",
    "GB200",
    40.0,
    """G7: GB200 NVL72 racks, one NVLink domain of 18 trays x 4 GPUs each, on InfiniBand.

    A node is a compute tray: 4 GPUs (GB200-NVL72-186GB; two GB200 superchips of one
    Grace CPU and two Blackwell GPUs each, GB200 NVL Multi-Node Tuning Guide;
    ``gpus_per_node`` must be 4) and 4 NICs for the traffic between racks, one 400 Gb/s
    ConnectX-7 per GPU.  A stream between two racks gets 40 GB/s under load, as the same
    NDR 400 Gb/s class of NIC delivers on H100 clusters (docs/design.md, section 5:
    39.9 GB/s median pairwise ``sendrecv_perf``) out of its 50 GB/s line rate;
    ``nic_gbytes_per_s=80`` models GB300-class ConnectX-8 trays (800 Gb/s XDR), as
    ``gb300-nvl72`` does.""",
)

gb300_nvl72 = nvl72_generator(
    "gb300-nvl72",
    "GB300",
    80.0,
    """G8: GB300 NVL72 racks (Blackwell Ultra), the GB200 NVL72's rack and NVLink 5 with
    800 Gb/s NICs.

    A node is a compute tray of 4 GB300-NVL72-288GB GPUs (``gpus_per_node`` must be 4)
    with one ConnectX-8 SuperNIC per GPU (800 Gb/s XDR, 100 GB/s line rate).  A stream
    between two racks gets 80 GB/s under load: the same 0.8 of the line rate that NDR
    NICs deliver on H100 clusters (40 of 50 GB/s, docs/design.md, section 5), an
    assumption until XDR measurements are published.""",
)


def rack_targets(nic_gbytes_per_s: float) -> Callable[[Mapping[str, Any]], Targets]:
    """Targets of a rack generator whose NICs deliver ``nic_gbytes_per_s`` by default:
    the pairs across NVLink domains over those inside, ``nic / nvlink`` within 10 %."""

    def targets(params: Mapping[str, Any]) -> Targets:
        nic = float(params.get("nic_gbytes_per_s", nic_gbytes_per_s))
        ratio = nic / float(params.get("nvlink_gbytes_per_s", 900.0))
        return Targets(
            healthy_cv=None,  # NVLink inside a rack, NICs across: two levels 10-20x apart
            degraded_fraction=None,
            cross_group_ratio_all=(0.9 * ratio, 1.1 * ratio),
            min_nodes=36,
            notes=f"across NVLink domains / inside one ~ nic / nvlink ({nic:g} / 900), the "
            "NVLink pairs capped at the nominal rate",
        )

    return targets
