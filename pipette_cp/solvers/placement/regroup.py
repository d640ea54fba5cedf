"""Choose which replicas form the expert groups and context-parallel rings.

An expert group (with ``etp = tp``) and a context-parallel ring are blocks of
consecutive replicas of a stage (:meth:`~pipette_cp.specs.plan.Plan.expert_groups`,
:meth:`~pipette_cp.specs.plan.Plan.cp_groups`).  Renumbering the replicas, the same
permutation on every stage, keeps every unit on its GPUs and every pipeline hop on its
link, and changes only which units share a group (and the order of the data-parallel
rings).  :func:`regroup_replicas` searches these renumberings by pairwise swaps, each
scored with the full evaluator (the all-to-alls and rings on the measured matrix),
first improvement, until no swap helps or the time is up.  The placement masters do
not price these groups; this pass does, on the master's placement.
"""

from __future__ import annotations

import time

import numpy as np

from pipette_cp.cost.evaluate import Evaluator
from pipette_cp.errors import PipetteError
from pipette_cp.specs import Plan


def _renumbered(plan: Plan, units: np.ndarray, order: np.ndarray) -> Plan:
    placement = units[:, order, :].reshape(-1, plan.tp).tolist()
    return plan.model_copy(update={"placement": tuple(map(tuple, placement))})


def regroup_replicas(
    evaluator: Evaluator, plan: Plan, until: float, seed: int = 0
) -> tuple[Plan, float]:
    """``plan`` with its replicas renumbered to the fastest grouping found by pairwise
    swaps before ``until`` (``time.perf_counter()``), and its iteration time; ``plan``
    itself when no swap helps (or it has one replica)."""
    units = np.asarray(plan.placement, dtype=np.int64).reshape(plan.pp, plan.replicas, plan.tp)
    order = np.arange(plan.replicas)
    best_t = evaluator.iteration_time(plan)
    if plan.replicas < 2:
        return plan, best_t
    rng = np.random.default_rng(seed)
    pairs = [(i, j) for i in range(plan.replicas) for j in range(i + 1, plan.replicas)]
    improved = True
    while improved and time.perf_counter() < until:
        improved = False
        for k in rng.permutation(len(pairs)):
            if time.perf_counter() >= until:
                break
            i, j = pairs[k]
            order[[i, j]] = order[[j, i]]
            try:
                t = evaluator.iteration_time(_renumbered(plan, units, order))
            except PipetteError:  # e.g. a data-parallel ring over a failed pair
                t = float("inf")
            if t < best_t * (1 - 1e-9):
                best_t, improved = t, True
            else:
                order[[i, j]] = order[[j, i]]
    if (order == np.arange(plan.replicas)).all():
        return plan, best_t
    return _renumbered(plan, units, order), best_t
