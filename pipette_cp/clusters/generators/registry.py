"""Seeded synthetic clusters G1-G6 of docs/design.md, section 5, by name.

>>> from pipette_cp.clusters.generators.registry import generate
>>> cluster = generate("degraded", nodes=16, seed=7)
>>> cluster.name, cluster.num_gpus
('g3-degraded-n16-s7', 128)

Every generator draws from ``numpy.random.default_rng(seed)`` only, so the same
kind, size, seed and parameters give the identical cluster.  The generators
themselves (documented parameters and defaults, with their sources) are
:func:`~pipette_cp.clusters.generators.healthy.healthy_a100` (G1),
:func:`~pipette_cp.clusters.generators.healthy.h100_multileaf` (G2),
:func:`~pipette_cp.clusters.generators.faults.degraded` (G3),
:func:`~pipette_cp.clusters.generators.faults.oversubscribed` (G4),
:func:`~pipette_cp.clusters.generators.healthy.v100_cube` (G5) and
:func:`~pipette_cp.clusters.generators.failslow.failslow` (G6); the statistics each must
reach are :attr:`GeneratorInfo.targets` (checked by :func:`check_targets`).  Rack-scale
systems whose NVLink domains span several nodes are registered beside them in
:data:`RACK_GENERATORS`: :func:`~pipette_cp.clusters.generators.nvlink.gb200_nvl72` (G7, alias
``nvl72``) and :func:`~pipette_cp.clusters.generators.nvlink.gb300_nvl72` (G8), racks of
18 GB200 or GB300 trays x 4 GPUs (or a Slurm segment of each, ``segment_trays``);
:data:`ALL_GENERATORS` holds both.
:func:`generate` also builds the fabrics of :mod:`~pipette_cp.clusters.generators.trees` (fat-tree).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from pipette_cp.clusters.generators import nvlink
from pipette_cp.clusters.generators.fabric import Fabric
from pipette_cp.clusters.generators.failslow import failslow
from pipette_cp.clusters.generators.faults import (
    DEGRADED_BASES,
    cross_pod_factor,
    degraded,
    oversubscribed,
)
from pipette_cp.clusters.generators.healthy import h100_multileaf, healthy_a100, v100_cube
from pipette_cp.clusters.generators.params import call_builder, integer, parameters_of
from pipette_cp.clusters.generators.targets import Range, Targets, measure, measure_timeline
from pipette_cp.clusters.generators.trees import TREE_GENERATORS, generate_tree, nodes_of, tree_info
from pipette_cp.errors import SpecError
from pipette_cp.specs.cluster import MAX_GPUS, ClusterSpec

_DESIGN = "docs/design.md, section 5"
_XX00 = (
    "xxrjun/nccl-tests-cluster@455de4f example-cluster00 "
    "(17 x 8 H100, pairwise sendrecv/alltoall; degraded and failed pairs)"
)
_XX01 = (
    "xxrjun/nccl-tests-cluster@455de4f example-cluster01 "
    "(10 x 8 H100, leaves of 7/2/1 nodes; pairwise and single-node sendrecv)"
)
_SUPERBENCH = (
    "microsoft/superbench-results@5e77aa7 v0.4.0 Azure-NDv4-A100 / NDmv4-A100 "
    "baseline.json (per-NIC ib_write, 8-GPU all-reduce busbw)"
)
_DGX1 = "NVIDIA DGX-1 with Tesla V100 System Architecture whitepaper (2017): hybrid cube-mesh"
_PIPETTE = "Pipette (DATE 2024) mpiGraph snapshots of a 16-node A100 cluster (via docs/design.md)"


@dataclass(frozen=True)
class GeneratorInfo:
    """One registered generator.

    Attributes
    ----------
    kind : str
        Registry name, e.g. ``degraded``.
    alias : str
        Short name ``g1`` ... ``g6`` (also accepted by :func:`generate`).
    title : str
        One line for listings.
    builder : Callable[..., Fabric]
        The generator function; its keyword parameters and docstring document it.
    sources : tuple[str, ...]
        Where its numbers come from.
    targets_of : Callable[[Mapping[str, Any]], Targets]
        Target ranges of its statistics given the parameters passed.
    base_kinds : Mapping[str, Callable[..., Fabric]]
        Generators it builds on, whose parameters it forwards.
    name_params : tuple[tuple[str, str], ...]
        Parameters shown in the cluster name, with their prefix (G4: ``-o7``).
    """

    kind: str
    alias: str
    title: str
    builder: Callable[..., Fabric]
    sources: tuple[str, ...]
    targets_of: Callable[[Mapping[str, Any]], Targets]
    base_kinds: Mapping[str, Callable[..., Fabric]] = field(default_factory=dict)
    name_params: tuple[tuple[str, str], ...] = ()

    @property
    def defaults(self) -> dict[str, Any]:
        """Parameter defaults of the generator itself (base parameters not included)."""
        return parameters_of(self.builder)

    def targets(self, **params: Any) -> Targets:
        """Target ranges for a cluster generated with ``params``.

        The ranges are docs/design.md's for the default parameters; those set by a
        parameter (a cross-leaf factor, G4's ``min(1, 1/(o u))``, G6's
        ``correlation``) follow it.
        """
        return self.targets_of(params)


def _around(params: Mapping[str, Any], name: str, default: float) -> Range:
    value = float(params.get(name, default))
    return (value - 0.02, value + 0.02)


def _targets_g1(params: Mapping[str, Any]) -> Targets:
    return Targets(
        cross_group_ratio=_around(params, "cross_leaf_factor", 0.95),
        notes="cross-leaf ~0.95 (docs/design.md)",
    )


def _targets_g2(params: Mapping[str, Any]) -> Targets:
    return Targets(
        healthy_cv=(0.002, 0.05),
        cross_group_ratio=_around(params, "cross_leaf_factor", 0.93),
        notes="cross-leaf ~0.93; healthy CV includes the leaf structure, as in "
        "example-cluster01 (4.1 % from its leaves alone), hence up to 5 %",
    )


def _targets_g3(params: Mapping[str, Any]) -> Targets:
    base = params.get("base", "healthy-a100")
    healthy = _targets_g2(params) if base == "h100-multileaf" else _targets_g1(params)
    return replace(
        healthy,
        degraded_fraction=(0.05, 0.15),
        degraded_ratio=(0.55, 0.70),
        failed_fraction=(0.02, 0.06),
        notes="degraded 5-15 % at 0.55-0.70 x, ~4 % failed (docs/design.md)",
    )


def _targets_g4(params: Mapping[str, Any]) -> Targets:
    factor = cross_pod_factor(
        float(params.get("oversubscription", 2.8)), float(params.get("load_fraction", 0.5))
    )
    return Targets(
        healthy_cv=None,
        degraded_fraction=None,
        cross_group_ratio_all=(0.97 * factor, 1.03 * factor),
        notes=f"cross-pod ratio min(1, 1/(o u)) = {factor:.3f} (docs/design.md), within 3 %",
    )


def _targets_g6(params: Mapping[str, Any]) -> Targets:
    rho = float(params.get("correlation", 0.55))
    return replace(
        _targets_g1(params),
        healthy_cv=(0.002, 0.05),
        noise_cv=(0.002, 0.05),
        degraded_fraction=(0.0, 0.15),
        snapshot_correlation=(rho - 0.15, rho + 0.15),
        min_nodes=32,
        notes="mean consecutive-snapshot correlation ~0.55 (docs/design.md); transient "
        "slow-link events count as degraded pairs; below 32 nodes the few events make "
        "the mean of a 12-snapshot timeline range 0.3-0.65",
    )


#: The generators by kind (docs/design.md, section 5).
GENERATORS: dict[str, GeneratorInfo] = {
    info.kind: info
    for info in (
        GeneratorInfo(
            "healthy-a100",
            "g1",
            "G1 healthy A100 + HDR fat tree",
            healthy_a100,
            (_DESIGN, _SUPERBENCH, _PIPETTE),
            _targets_g1,
        ),
        GeneratorInfo(
            "h100-multileaf",
            "g2",
            "G2 H100 + NDR, uneven leaves",
            h100_multileaf,
            (_DESIGN, _XX01),
            _targets_g2,
        ),
        GeneratorInfo(
            "degraded",
            "g3",
            "G3 degraded production: slow pairs, straggler NICs, failures",
            degraded,
            (_DESIGN, _XX00, _SUPERBENCH, _XX01),
            _targets_g3,
            DEGRADED_BASES,
        ),
        GeneratorInfo(
            "oversubscribed",
            "g4",
            "G4 pods behind an oversubscribed spine",
            oversubscribed,
            (_DESIGN, _SUPERBENCH),
            _targets_g4,
            name_params=(("oversubscription", "o"),),
        ),
        GeneratorInfo(
            "v100-cube",
            "g5",
            "G5 V100 DGX-1 cube mesh + EDR",
            v100_cube,
            (_DESIGN, _DGX1),
            _targets_g1,
        ),
        GeneratorInfo(
            "failslow",
            "g6",
            "G6 fail-slow timeline (drifting noise, slow links)",
            failslow,
            (_DESIGN, _PIPETTE, _XX00, _SUPERBENCH),
            _targets_g6,
            {"healthy-a100": healthy_a100},
        ),
    )
}


#: Rack-scale systems: NVLink domains of several nodes (``nodes_per_nvlink_domain``).
RACK_GENERATORS: dict[str, GeneratorInfo] = {
    info.kind: info
    for info in (
        GeneratorInfo(
            "gb200-nvl72",
            "nvl72",
            "G7 GB200 NVL72 racks: 18 trays x 4 GPUs per NVLink domain, ConnectX-7 across",
            nvlink.gb200_nvl72,
            (*nvlink.NVL72_SOURCES, nvlink.SEGMENT_SOURCE),
            nvlink.rack_targets(40.0),
        ),
        GeneratorInfo(
            "gb300-nvl72",
            "g8",
            "G8 GB300 NVL72 racks: 18 trays x 4 GPUs per NVLink domain, ConnectX-8 across",
            nvlink.gb300_nvl72,
            nvlink.GB300_NVL72_SOURCES,
            nvlink.rack_targets(80.0),
        ),
    )
}
#: Every registered generator.
ALL_GENERATORS: dict[str, GeneratorInfo] = {**GENERATORS, **RACK_GENERATORS}

_BY_ALIAS = {info.alias: info for info in ALL_GENERATORS.values()}


def generator_info(kind: str) -> GeneratorInfo:
    """The registered generator called ``kind`` or its alias (``g1`` ... ``g6``, ``nvl72``,
    ``g8``)."""
    key = kind.strip().lower() if isinstance(kind, str) else None  # a list is no kind either
    info = (ALL_GENERATORS.get(key) or _BY_ALIAS.get(key)) if key is not None else None
    if info is None:
        kinds = [*ALL_GENERATORS.values(), *TREE_GENERATORS.values()]
        known = ", ".join(f"{i.kind} ({i.alias})" for i in kinds)  # type: ignore[attr-defined]
        if tree_info(kind) is not None:
            raise SpecError("generator.kind", kind, "a hierarchical cluster: no dense matrix, "
                            "no timeline and no statistics targets")  # fmt: skip
        raise SpecError("generator.kind", kind, f"unknown generator; known: {known}")
    return info


def _fabric(
    kind: str, nodes: int, seed: int, gpus_per_node: int | None, params: dict[str, Any]
) -> tuple[GeneratorInfo, Fabric, np.random.Generator]:
    info = generator_info(kind)
    integer("nodes", nodes, 1)
    integer("seed", seed, 0)
    if gpus_per_node is not None:
        params = {**params, "gpus_per_node": gpus_per_node}
    gpn = params.get("gpus_per_node", info.defaults.get("gpus_per_node", 8))
    if isinstance(gpn, int) and nodes * gpn > MAX_GPUS:  # before any matrix is allocated
        raise SpecError("nodes", nodes, f"{nodes} nodes x gpus_per_node={gpn} = {nodes * gpn} "
                        f"GPUs; a dense matrix holds at most {MAX_GPUS} (larger: kind fat-tree)")  # fmt: skip
    extra = tuple(sorted({p for b in info.base_kinds.values() for p in parameters_of(b)}))
    rng = np.random.default_rng(seed)
    fabric = call_builder(info.kind, info.builder, rng, nodes, params, extra)
    shown = {**info.defaults, **params}
    suffix = "".join(f"-{prefix}{shown[name]:g}" for name, prefix in info.name_params)
    fabric.label = f"{info.alias}-{info.kind}{suffix}-n{nodes}-s{seed}"
    settings = ", ".join(f"{k}={v}" for k, v in shown.items())
    fabric.source = (
        f"pipette_cp generator {info.kind} ({info.alias.upper()}), nodes={nodes}, seed={seed}; "
        f"{settings}; numbers from: {'; '.join(info.sources)}"
    )
    return info, fabric, rng


def generate(
    kind: str,
    *,
    nodes: int | None = None,
    seed: int,
    gpus_per_node: int | None = None,
    gpus: int | None = None,
    **params: Any,
) -> ClusterSpec:
    """A seeded synthetic cluster.

    Parameters
    ----------
    kind : str
        A key of :data:`ALL_GENERATORS` or its alias (``g1`` ... ``g6``, ``nvl72``, ``g8``).
    nodes : int
        Number of servers (>= 1: one node is a single NVLink domain with no node pairs;
        ``oversubscribed`` needs two pods; statistics match their targets from ~16).
    gpus : int, optional
        Instead of ``nodes``: GPUs, a multiple of the GPUs per node (fat-tree: either).
    seed : int
        Seed of ``numpy.random.default_rng``; same seed, same cluster.
    gpus_per_node : int, optional
        GPUs per server (the generator's default if None).
    **params
        The generator's own parameters (see its function); unknown names are an error.

    Returns
    -------
    ClusterSpec
        Named ``<alias>-<kind>-n<nodes>-s<seed>``; ``source`` records the parameters.
        For ``failslow`` this is the first snapshot of :func:`generate_timeline`.

    Raises
    ------
    SpecError
        Unknown kind or parameter, or a value out of range.
    """
    if tree_info(kind) is not None:
        return generate_tree(kind, seed=seed, gpus=gpus, nodes=nodes,
                             gpus_per_node=gpus_per_node, **params)  # fmt: skip
    gpn = gpus_per_node or generator_info(kind).defaults.get("gpus_per_node", 8)
    nodes = nodes_of(nodes, gpus, gpn)
    _, fabric, rng = _fabric(kind, nodes, seed, gpus_per_node, params)
    return fabric.cluster(fabric.node_matrix(rng), fabric.label)


def generate_timeline(
    kind: str = "failslow",
    *,
    nodes: int,
    seed: int,
    snapshots: int,
    gpus_per_node: int | None = None,
    **params: Any,
) -> list[ClusterSpec]:
    """``snapshots`` consecutive measurements of one generated cluster.

    Persistent parts (groups, degraded and failed pairs, persistent noise) are shared;
    each snapshot redraws the transient noise and, for ``failslow`` (G6), steps the
    slow-link events.  Snapshot ``t`` is named ``<name>-t<tt>`` and does not depend on
    ``snapshots`` (a longer timeline extends a shorter one).

    Parameters
    ----------
    kind : str
        Any generator; ``failslow`` is the one made for timelines.
    nodes, seed, gpus_per_node, **params
        As :func:`generate`.
    snapshots : int
        Number of snapshots (>= 1).

    Returns
    -------
    list[ClusterSpec]
        The snapshots in time order.
    """
    integer("snapshots", snapshots, 1)
    _, fabric, rng = _fabric(kind, nodes, seed, gpus_per_node, params)
    return fabric.snapshots(rng, snapshots)


def check_targets(kind: str, clusters: ClusterSpec | list[ClusterSpec], **params: Any) -> list[str]:
    """Statistics of a generated cluster (or timeline) outside its kind's targets.

    ``params`` are the generator parameters it was made with (they move some
    targets, e.g. G4's cross-pod ratio).  An empty list means every target is met.
    """
    info = generator_info(kind)
    if isinstance(clusters, ClusterSpec):
        measured = measure(clusters)
    else:
        measured = measure_timeline(clusters)
    return info.targets(**params).violations(measured)
