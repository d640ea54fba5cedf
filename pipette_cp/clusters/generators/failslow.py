"""G6: a fail-slow timeline, snapshots of one cluster whose slow links come and go.

Plans made on one snapshot and run on the next meet (a) the pair noise that did
not persist and (b) slow-link and slow-NIC events that started or ended in
between.  docs/design.md, section 5 asks for a pair correlation of about 0.55 between
consecutive snapshots (Pipette's two mpiGraph snapshots of a 16-node A100
cluster).  Every source of change is given that same lag-one correlation:

- pair noise: ``persistent_share = correlation`` of its variance persists;
- switch-group structure and the asymmetry outlier never change, so an extra
  transient noise of variance ``V_structure (1 - rho) / rho`` is added;
- events survive from one snapshot to the next with probability ``rho``.

So the expected correlation of consecutive snapshots is about ``rho`` whatever
the event rates.  Single snapshot pairs scatter around it, the more so the larger
the share of the variance the (few, strong) events carry: with the defaults the
standard deviation is about 0.2 at 16 nodes, 0.1 at 32 and 0.05 at 64 nodes, and
the mean is 0.51-0.55.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipette_cp.clusters.generators.fabric import Fabric
from pipette_cp.clusters.generators.healthy import healthy_a100
from pipette_cp.clusters.generators.noise import group_log_factor, upper_pairs
from pipette_cp.clusters.generators.params import (
    call_builder,
    factor,
    factor_range,
    number,
    parameters_of,
)
from pipette_cp.errors import SpecError


@dataclass
class SlowEvents:
    """Slow-link and slow-NIC events: a stationary birth-death process over snapshots.

    On average ``link_fraction`` of the node pairs are slow at any snapshot and
    ``nic_fraction`` of the nodes have a slow NIC (which slows ``nic_pair_fraction``
    of the node's pairs, as G3's stragglers); each event survives to the next
    snapshot with probability ``persistence`` (mean life ``1 / (1 - persistence)``
    snapshots) and slows its pairs to ``U(factor_low, factor_high)`` x.
    """

    nodes: int
    link_fraction: float
    nic_fraction: float
    nic_pair_fraction: float
    persistence: float
    factor_low: float
    factor_high: float
    _pairs: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    _pair_log: np.ndarray = field(default_factory=lambda: np.zeros(0))
    _nics: list[tuple[int, np.ndarray, np.ndarray]] = field(default_factory=list)
    _started: bool = False

    def step(self, rng: np.random.Generator) -> np.ndarray:
        """Advance one snapshot; the node x node log-factor (<= 0) of the active events.

        Draw order: survivals of link events, of NIC events, new link events, new NIC events.
        """
        n = self.nodes
        rows, cols = upper_pairs(n)
        births = 1.0 if not self._started else 1.0 - self.persistence
        if self._started:
            keep = rng.random(self._pairs.size) < self.persistence
            self._pairs, self._pair_log = self._pairs[keep], self._pair_log[keep]
            keep_nic = rng.random(len(self._nics)) < self.persistence
            self._nics = [e for e, k in zip(self._nics, keep_nic, strict=True) if k]
        self._started = True
        new_links = int(rng.poisson(self.link_fraction * rows.size * births))
        self._pairs = np.concatenate([self._pairs, rng.integers(rows.size, size=new_links)])
        self._pair_log = np.concatenate([self._pair_log, self._log_factors(rng, new_links)])
        for _ in range(int(rng.poisson(self.nic_fraction * n * births))):
            node = int(rng.integers(n))
            others = np.delete(np.arange(n), node)
            count = round(self.nic_pair_fraction * (n - 1))
            partners = np.sort(rng.choice(others, size=count, replace=False))
            self._nics.append((node, partners, self._log_factors(rng, count)))
        penalty = np.zeros((n, n))
        np.minimum.at(penalty, (rows[self._pairs], cols[self._pairs]), self._pair_log)
        for node, partners, logs in self._nics:
            np.minimum.at(penalty, (np.full(partners.size, node), partners), logs)
        return np.minimum(penalty, penalty.T)

    def _log_factors(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return np.log(rng.uniform(self.factor_low, self.factor_high, size=count))


def failslow(
    rng: np.random.Generator,
    *,
    nodes: int,
    gpus_per_node: int = 8,
    correlation: float = 0.55,
    slow_link_fraction: float = 0.02,
    slow_nic_fraction: float = 0.0,
    slow_nic_pair_fraction: float = 0.7,
    slow_factor_low: float = 0.55,
    slow_factor_high: float = 0.70,
    **base_params: Any,
) -> Fabric:
    """G6: a G1 (healthy A100 + HDR) cluster whose snapshots drift and suffer slow links.

    Parameters
    ----------
    rng : numpy.random.Generator
        The random stream.
    nodes : int
        Number of servers (>= 1).  One node has no node pair to slow or to drift:
        every snapshot is the base generator's node.
    gpus_per_node : int
        GPUs per server, passed to the base generator.
    correlation : float
        Expected correlation of the per-pair log-deviations of consecutive snapshots,
        in (0, 1] (docs/design.md, section 5: ~0.55).  Also the probability that an event
        lasts into the next snapshot, and the base noise's ``persistent_share``.
    slow_link_fraction : float
        Mean share of node pairs inside a slow-link event at a snapshot (0.02: an
        assumption, below G3's 5-15 % of persistently degraded pairs).
    slow_nic_fraction : float
        Mean share of nodes with a slow NIC at a snapshot; 0 by default because one
        slow NIC outweighs all other changes, so the correlation of a snapshot pair
        then swings between ~0.05 and ~0.95 as it appears or goes (0.06, one per 17
        nodes as G3's stragglers, is a harsher setting).
    slow_nic_pair_fraction : float
        Share of a slow NIC's pairs that are slowed (G3 / docs/design.md: ~70 %).
    slow_factor_low, slow_factor_high : float
        A slowed pair keeps ``U(low, high)`` x its bandwidth; docs/design.md's degraded
        range 0.55-0.70 (xxrjun example-cluster00).
    **base_params
        Parameters of :func:`~pipette_cp.clusters.generators.healthy.healthy_a100`, except
        ``persistent_share`` (set by ``correlation``).

    Returns
    -------
    Fabric
        With :class:`SlowEvents` attached and the extra transient noise set.
    """
    kind = "failslow"
    rho = factor(f"{kind}.correlation", correlation)
    if "persistent_share" in base_params:
        raise SpecError(
            f"{kind}.persistent_share",
            base_params["persistent_share"],
            "is set by correlation for failslow; set correlation instead",
        )
    link = number(f"{kind}.slow_link_fraction", slow_link_fraction, 0.0, 0.5)
    nic = number(f"{kind}.slow_nic_fraction", slow_nic_fraction, 0.0, 0.5)
    nic_pair = number(f"{kind}.slow_nic_pair_fraction", slow_nic_pair_fraction, 0.0, 1.0)
    low, high = factor_range(kind, "slow_factor", slow_factor_low, slow_factor_high)
    events = SlowEvents(nodes, link, nic, nic_pair, rho, low, high)
    params = {"gpus_per_node": gpus_per_node, **base_params, "persistent_share": rho}
    fabric = call_builder(kind, healthy_a100, rng, nodes, params)
    cross = {**parameters_of(healthy_a100), **base_params}["cross_leaf_factor"]
    structure = group_log_factor(fabric.groups, cross)
    if fabric.outlier is not None:
        i, j, a = fabric.outlier
        structure[i, j] += a / 2.0
        structure[j, i] -= a / 2.0
    off = structure[~np.eye(nodes, dtype=bool)]  # empty for one node: no structure to vary
    variance = float(off.var()) if off.size else 0.0
    fabric.extra_transient_sigma = math.sqrt(variance * (1.0 - rho) / rho)
    fabric.events = events
    return fabric
