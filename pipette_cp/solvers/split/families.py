"""The layer-split master's constraint families, one small object each, in one list.

The same pattern as the placement master's families
(:mod:`pipette_cp.solvers.placement.families`), lighter: a family writes its rows over
the master (:class:`SplitMaster`: the layer counts ``n_v``, the backend and the cost
tables), says whether a split satisfies it (:meth:`SplitFamily.admits`) and names the
checker function (:data:`pipette_cp.checker.CHECKS`) that refuses a plan breaking it.
The built-in families (:data:`BUILTIN`):

- ``split_covers_layers``: ``sum_v n_v = L`` (with ``n_v >= 1`` from the variables);
- ``split_contiguous``: holds by construction (the variables are counts in
  virtual-stage order), no row;
- ``memory_limit``: the integer facets of every chunk's memory row
  (:meth:`~pipette_cp.solvers.split.cost.MemoryModel.facets`);
- ``chunk_balance`` (vpp > 1): the chunks of a stage within ``chunk_spread`` layers.

A user's :class:`~pipette_cp.solvers.extensions.ConstraintFamily` is the same kind
(:class:`UserSplitFamily`): its rows through
:class:`~pipette_cp.solvers.extensions.SplitContext`, its check its own ``violations``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from pipette_cp.solvers.extensions import (
    ConstraintFamily,
    LinearTerms,
    SplitContext,
    family_violations,
)
from pipette_cp.solvers.split.cost import SplitCost
from pipette_cp.specs import Instance, Plan


class SplitMaster(Protocol):
    """What a family sees of the split master
    (:class:`~pipette_cp.solvers.split.model.SplitModel`): the cost tables, the integer
    layer counts ``n[v]``, the backend's rows (named as given) and ``add_linear`` (named
    with a running count, as user rows are)."""

    cost: SplitCost
    n: list[Any]

    def add_row(self, terms: LinearTerms, sense: str, rhs: int, name: str) -> None: ...

    def add_linear(self, terms: LinearTerms, sense: str, rhs: int, name: str) -> None: ...


class SplitFamily:
    """One constraint family of the split master (module docstring)."""

    name: str = ""
    check: str | None = None

    def add_rows(self, m: SplitMaster) -> None:
        """Its rows."""

    def admits(self, cost: SplitCost, split: np.ndarray) -> bool:
        """Whether ``split`` satisfies it."""
        del cost, split
        return True


class SplitCoversLayers(SplitFamily):
    """Every layer in exactly one chunk: ``sum_v n_v = L``."""

    name = check = "split_covers_layers"

    def add_rows(self, m: SplitMaster) -> None:
        m.add_row([(1, n) for n in m.n], "==", m.cost.num_layers, "split_covers_layers")

    def admits(self, cost: SplitCost, split: np.ndarray) -> bool:
        return int(np.sum(split)) == cost.num_layers and int(np.min(split)) >= 1


class SplitContiguous(SplitFamily):
    """Chunks hold contiguous layer ranges: true of every split the variables express."""

    name = check = "split_contiguous"


class SplitMemoryLimit(SplitFamily):
    """Per stage ``s``: ``k_s <= K_s`` and, for each chunk ``c``, the integer facets
    ``a k_s + b n_{c,s} <= r`` of ``W_s k_s + X_s n_{c,s} <= R_s`` (bytes)
    (:meth:`~pipette_cp.solvers.split.cost.MemoryModel.facets`: the same integer points)."""

    name = check = "memory_limit"

    def add_rows(self, m: SplitMaster) -> None:
        c = m.cost
        for s in range(c.pp):
            chunks = [m.n[k * c.pp + s] for k in range(c.vpp)]
            top, rows = c.memory_facets(s)
            m.add_row([(1, x) for x in chunks], "<=", top, f"memory_limit_{s}")
            for k, chunk in enumerate(chunks):
                for i, (a, b, r) in enumerate(rows):
                    terms = [(a + (b if x is chunk else 0), x) for x in chunks]
                    m.add_row(terms, "<=", r, f"memory_limit_{s}_{k}_{i}")

    def admits(self, cost: SplitCost, split: np.ndarray) -> bool:
        return cost.fits(split)


class ChunkBalance(SplitFamily):
    """With ``vpp > 1``: the chunks of a stage differ by at most ``cost.chunk_spread``."""

    name = "chunk_balance"

    def add_rows(self, m: SplitMaster) -> None:
        c, spread = m.cost, m.cost.chunk_spread
        if spread is None or c.vpp == 1:
            return
        for s in range(c.pp):
            for a, b in itertools.permutations(range(c.vpp), 2):
                terms = [(1, m.n[a * c.pp + s]), (-1, m.n[b * c.pp + s])]
                m.add_row(terms, "<=", spread, f"chunk_balance_{s}_{a}_{b}")

    def admits(self, cost: SplitCost, split: np.ndarray) -> bool:
        return cost.balanced(split)


class UserSplitFamily(SplitFamily):
    """A user's constraint family in the split master: its ``split`` rows and its
    ``violations`` of ``plan`` with the split."""

    def __init__(self, family: ConstraintFamily, instance: Instance, plan: Plan) -> None:
        self.family, self.instance, self.plan = family, instance, plan
        self.name = family.name

    def add_rows(self, m: SplitMaster) -> None:
        self.family.split(SplitContext(self.instance, self.plan, list(m.n), m))

    def admits(self, cost: SplitCost, split: np.ndarray) -> bool:
        del cost
        plan = self.plan.model_copy(update={"layer_split": tuple(int(n) for n in split)})
        return not family_violations([self.family], self.instance, plan)


#: The built-in families, in the order their rows are written.
BUILTIN: tuple[SplitFamily, ...] = (
    SplitCoversLayers(),
    SplitContiguous(),
    SplitMemoryLimit(),
    ChunkBalance(),
)


def split_families(
    instance: Instance, plan: Plan, constraints: Sequence[ConstraintFamily] = ()
) -> tuple[SplitFamily, ...]:
    """A problem's families: the built-in ones, then the user's."""
    return (*BUILTIN, *(UserSplitFamily(c, instance, plan) for c in constraints))
