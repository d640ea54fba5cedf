"""Layer split and placement: exact models (CP-SAT, MILP) and heuristic baselines.

The sub-packages are the architecture:

- :mod:`~pipette_cp.solvers.split`: the exact layer split (cost, one master over a
  CP-SAT or MILP backend, Kelley's loop, the oracle, Megatron's flags);
- :mod:`~pipette_cp.solvers.placement`: the exact GPU placement (data, one master
  over a backend, Kelley's loop and bounds, LNS, local search, the oracle);
- :mod:`~pipette_cp.solvers.baselines`: Megatron's defaults, random, greedy,
  Pipette's annealer, AMP;
- :mod:`~pipette_cp.solvers.methods`: ``cpsat`` and ``milp``, composing the split,
  the placement and the baselines as warm starts;
- :mod:`~pipette_cp.solvers.registry`: every method by name.

Shared below them: :mod:`~pipette_cp.solvers.options` (the method signature),
:mod:`~pipette_cp.solvers.cuts` (Kelley cuts), :mod:`~pipette_cp.solvers.extensions`
(user constraint families), :mod:`~pipette_cp.solvers.milp_engine`.  Every method
has the signature of :data:`~pipette_cp.solvers.options.Method`; solver objects
never leave this package; results come back as :class:`~pipette_cp.specs.Plan`
with a :class:`~pipette_cp.specs.SolveInfo`.
"""

from pipette_cp.solvers.options import Method, SolveOptions
from pipette_cp.solvers.registry import METHODS, get_method

__all__ = ["METHODS", "Method", "SolveOptions", "get_method"]
