"""The exact layer split of a fixed layout and placement.

``cost`` reads the split-dependent costs off the evaluator; ``families`` holds the
master's constraint families (the user's the same kind); ``model`` writes the master
from their list once over a backend (``cpsat``, ``milp``); ``heuristics`` gives the
warm start and the first cuts; ``solve`` runs Kelley's loop
(:func:`solve_split`); ``oracle`` enumerates every split of tiny instances;
``flags`` gives the Megatron-LM arguments of a split.
"""

from pipette_cp.solvers.split.flags import megatron_split_args
from pipette_cp.solvers.split.oracle import brute_force_split
from pipette_cp.solvers.split.solve import (
    CHUNK_SPREAD,
    TOLERANCE,
    SplitResult,
    solve_split,
    with_optimal_split,
)

__all__ = [
    "CHUNK_SPREAD",
    "TOLERANCE",
    "SplitResult",
    "brute_force_split",
    "megatron_split_args",
    "solve_split",
    "with_optimal_split",
]
