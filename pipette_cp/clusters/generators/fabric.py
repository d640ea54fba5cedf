"""A generated cluster before its per-snapshot noise is drawn: the :class:`Fabric`.

A generator (see :mod:`pipette_cp.clusters.generators.registry`) draws everything that
persists across measurement snapshots (switch groups, the persistent part of the
pair noise, degraded and failed pairs) into a :class:`Fabric`; each snapshot then
draws only its transient parts, in a fixed order, from the same random stream.  So
snapshot ``t`` depends on the seed and on ``t`` only, and
``generate(...)`` equals the first snapshot of ``generate_timeline(...)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from pipette_cp.clusters.expand import cluster_from_node_matrix
from pipette_cp.clusters.generators.noise import (
    antisymmetric_normal,
    direction_scale,
    direction_split,
    symmetric_normal,
)
from pipette_cp.specs.cluster import ClusterSpec
from pipette_cp.specs.gpu import GpuSpec


class EventProcess(Protocol):
    """Transient events (slow links, slow NICs) of a timeline, stepped once per snapshot."""

    def step(self, rng: np.random.Generator) -> np.ndarray:
        """Node x node log-factor (<= 0) of the events active in the next snapshot."""
        ...


@dataclass
class Noise:
    """Pair noise of a healthy link, all as lognormal standard deviations (see gen_noise).

    Attributes
    ----------
    sigma : float
        Total standard deviation of a healthy entry's log around its group level
        (symmetric and direction parts together); about the healthy CV of one leaf.
    direction_sigma : float
        Standard deviation of each direction's own log-deviation (mean relative
        asymmetry ``2 direction_sigma / sqrt(pi)``).
    persistent_share : float
        Share of the noise variance that persists from snapshot to snapshot.
    asymmetry_clip : float
        No pair's relative direction asymmetry exceeds this (outlier aside).
    """

    sigma: float
    direction_sigma: float
    persistent_share: float
    asymmetry_clip: float

    @property
    def direction_variance(self) -> float:
        """Variance that the direction part adds to each entry's log."""
        return direction_scale(self.direction_sigma, self.asymmetry_clip)[1]

    @property
    def symmetric_sigma(self) -> float:
        """Standard deviation of the symmetric part: what ``sigma`` leaves after direction."""
        return math.sqrt(max(self.sigma**2 - self.direction_variance, 0.0))


@dataclass
class Fabric:
    """Everything persistent about one generated cluster, plus how to draw a snapshot.

    Attributes
    ----------
    label : str
        Cluster name, e.g. ``g3-degraded-n32-s7``; snapshots append ``-t03``.
    log_level : numpy.ndarray
        Node x node persistent log bandwidth (bytes/s): base level, group factors,
        degradations and the persistent symmetric noise.
    failed : numpy.ndarray
        Symmetric boolean node x node mask of failed pairs (bandwidth 0).
    direction_z : numpy.ndarray
        Persistent antisymmetric standard normals of the direction noise.
    noise : Noise
        The pair-noise model.
    extra_transient_sigma : float
        Additional symmetric per-snapshot noise (the fail-slow timeline uses it).
    outlier : tuple[int, int, float] | None
        One pair (i, j) with a fixed direction split ``a`` (the 31 % outlier).
    events : EventProcess | None
        Transient slow-link events, stepped before each snapshot's noise is drawn.
    ceiling : numpy.ndarray | None
        Node x node cap on a snapshot's bandwidth, bytes/s (a link that noise cannot
        lift above its nominal rate, such as NVLink between the trays of a rack).
    nodes_per_nvlink_domain : int
        Consecutive nodes forming one NVLink domain (``ClusterSpec``'s field).
    """

    label: str
    gpu: GpuSpec
    gpus_per_node: int
    intra_node: float | np.ndarray
    nics_per_node: int
    nic_bandwidth_bytes_per_s: float
    groups: np.ndarray
    log_level: np.ndarray
    failed: np.ndarray
    direction_z: np.ndarray
    noise: Noise
    source: str
    extra_transient_sigma: float = 0.0
    outlier: tuple[int, int, float] | None = None
    events: EventProcess | None = None
    ceiling: np.ndarray | None = None
    nodes_per_nvlink_domain: int = 1

    @property
    def num_nodes(self) -> int:
        return int(self.log_level.shape[0])

    def node_matrix(self, rng: np.random.Generator) -> np.ndarray:
        """Draw the next snapshot's node x node bandwidth (bytes/s; 0 = failed, 0 diagonal).

        Draw order (fixed): events, symmetric transient noise, direction transient noise.
        """
        n, rho = self.num_nodes, self.noise.persistent_share
        log = self.log_level.copy()
        if self.events is not None:
            log += self.events.step(rng)
        transient = math.sqrt(
            (1.0 - rho) * self.noise.symmetric_sigma**2 + self.extra_transient_sigma**2
        )
        log += transient * symmetric_normal(rng, n)
        z = self.direction_z + math.sqrt(1.0 - rho) * antisymmetric_normal(rng, n)
        split = direction_split(z, self.noise.direction_sigma, self.noise.asymmetry_clip)
        if self.outlier is not None:
            i, j, a = self.outlier
            split[i, j], split[j, i] = a, -a
        log += split / 2.0
        matrix = np.exp(log)
        if self.ceiling is not None:
            matrix = np.minimum(matrix, self.ceiling)
        matrix[self.failed] = 0.0
        np.fill_diagonal(matrix, 0.0)
        return matrix

    def cluster(self, node_bandwidth: np.ndarray, name: str) -> ClusterSpec:
        """The GPU-level :class:`ClusterSpec` of one snapshot."""
        return cluster_from_node_matrix(
            node_bandwidth=node_bandwidth,
            intra_node=self.intra_node,
            gpus_per_node=self.gpus_per_node,
            gpu=self.gpu,
            nics_per_node=self.nics_per_node,
            nic_bandwidth_bytes_per_s=self.nic_bandwidth_bytes_per_s,
            name=name,
            node_groups=tuple(int(g) for g in self.groups),
            source=self.source,
            nodes_per_nvlink_domain=self.nodes_per_nvlink_domain,
        )

    def snapshots(self, rng: np.random.Generator, count: int) -> list[ClusterSpec]:
        """``count`` consecutive snapshots named ``<label>-t00``, ``<label>-t01``, ..."""
        return [self.cluster(self.node_matrix(rng), f"{self.label}-t{t:02d}") for t in range(count)]


def persistent_noise(
    rng: np.random.Generator, nodes: int, noise: Noise
) -> tuple[np.ndarray, np.ndarray]:
    """Draw the persistent symmetric log noise and direction normals (in this order)."""
    rho = noise.persistent_share
    symmetric = math.sqrt(rho) * noise.symmetric_sigma * symmetric_normal(rng, nodes)
    direction = math.sqrt(rho) * antisymmetric_normal(rng, nodes)
    return symmetric, direction
