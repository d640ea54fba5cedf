"""Where each input of the placement master sits in its input vector ``x``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipette_cp.solvers.placement.groups import GroupTables


@dataclass(frozen=True)
class XIndex:
    """Positions of the master's inputs in ``x`` (all times in s, all >= 0).

    ``hf[s]``, ``hb[s]``: activation / gradient hop of boundary ``s`` (slowest
    replica and tp rank); ``ring[s]``: bandwidth part of stage ``s``'s DP
    gradient sync, ``2 (D-1)/D bytes / slowest ring link`` (reduce-scatter:
    half); ``cross[s]`` (0/1): whether that ring leaves a node (its latency is
    then the inter-node one); ``emb``: tied-embedding all-reduce;
    ``worse[s, c]`` (0/1): stage ``s`` holds a unit on a place of compute
    class ``<= c`` (classes sorted slowest first); ``a2a[s]``, ``cps[s]``,
    ``ering[k]``, ``ecross[k]`` (0/1): the expert all-to-all, context-parallel ring step
    and expert ring inputs of :mod:`~pipette_cp.solvers.placement.groups` (empty where
    the layout has none).
    """

    hf: np.ndarray
    hb: np.ndarray
    ring: np.ndarray
    cross: np.ndarray
    emb: int | None
    worse: np.ndarray
    size: int
    a2a: np.ndarray
    cps: np.ndarray
    ering: np.ndarray
    ecross: np.ndarray

    @classmethod
    def make(
        cls, hops: int, stages: int, rings: bool, emb: bool, classes: int,
        groups: GroupTables | None = None,
    ) -> XIndex:  # fmt: skip
        pos = 0

        def take(n: int) -> np.ndarray:
            nonlocal pos
            out = np.arange(pos, pos + n)
            pos += n
            return out

        hf, hb = take(hops), take(hops)
        ring, cross = take(stages if rings else 0), take(stages if rings else 0)
        e = int(take(1)[0]) if emb else None
        worse = take(stages * (classes - 1)).reshape(stages, classes - 1)
        g = groups
        a2a = take(stages if g is not None and g.a2a else 0)
        cps = take(stages if g is not None and g.cp else 0)
        eclasses = stages * g.ering_classes if g is not None else 0
        ering, ecross = take(eclasses), take(eclasses)
        return cls(hf, hb, ring, cross, e, worse, pos, a2a, cps, ering, ecross)

    @property
    def booleans(self) -> np.ndarray:
        """Positions holding 0/1 indicators (their cut coefficients are in s)."""
        return np.concatenate((self.cross, self.worse.ravel(), self.ecross)).astype(int)
