"""Heuristic baselines, scored by the same evaluator as the exact methods.

``megatron_default`` (Megatron-LM's own order and even split), ``random_method``
(a seeded random placement), ``greedy`` (a walk along the fastest links),
``pipette_sa`` (Pipette's simulated annealing, re-implemented), ``amp`` (AMP's
cost model and partition); ``common`` holds what they share.  They may use the
placement data and its local search (:mod:`pipette_cp.solvers.placement`), never
the exact solvers.
"""

from pipette_cp.solvers.baselines.common import best_of, finish_plan, require_layout_fits
from pipette_cp.solvers.baselines.megatron_default import node_packed_placements
from pipette_cp.solvers.baselines.random_method import random_placement

# the methods themselves are reached through their modules (the registry names them)
__all__ = [
    "best_of",
    "finish_plan",
    "node_packed_placements",
    "random_placement",
    "require_layout_fits",
]
