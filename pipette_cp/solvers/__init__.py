"""Layer split and placement: exact models (CP-SAT, MILP) and heuristic baselines.

Every method has the signature of :data:`pipette_cp.solvers.base.Method` and is
chosen by name from :data:`pipette_cp.solvers.base.METHODS`.  Solver objects
never leave this package; results come back as :class:`~pipette_cp.specs.Plan`
with a :class:`~pipette_cp.specs.SolveInfo`.
"""

# Importing the method modules registers them in METHODS.
from pipette_cp.solvers import amp, baselines, greedy, pipette_sa, placement, split
from pipette_cp.solvers.base import METHODS, Method, SolveOptions, get_method

__all__ = [
    "METHODS",
    "Method",
    "SolveOptions",
    "amp",
    "baselines",
    "get_method",
    "greedy",
    "pipette_sa",
    "placement",
    "split",
]
