"""Every method by name: heuristics and exact solvers share one signature
(:data:`~pipette_cp.solvers.options.Method`) and are chosen by name."""

from __future__ import annotations

from pipette_cp.errors import SpecError
from pipette_cp.solvers import methods
from pipette_cp.solvers.baselines.amp import amp_method
from pipette_cp.solvers.baselines.greedy import greedy
from pipette_cp.solvers.baselines.megatron_default import megatron_default
from pipette_cp.solvers.baselines.pipette_sa import pipette_sa
from pipette_cp.solvers.baselines.random_method import random_method
from pipette_cp.solvers.options import Method

#: The methods by name (``split-*``: the split alone, on the skeleton's placement).
METHODS: dict[str, Method] = {
    "amp": amp_method,
    "cpsat": methods.cpsat,
    "greedy": greedy,
    "megatron-default": megatron_default,
    "milp": methods.milp,
    "pipette-sa": pipette_sa,
    "random": random_method,
    "split-cpsat": methods.split_cpsat,
    "split-milp": methods.split_milp,
}

#: The methods whose masters run on the MILP engine of ``SolveOptions.milp_solver``.
MILP_METHODS = frozenset({"milp", "split-milp"})


def get_method(name: str) -> Method:
    """The method called ``name``, or a SpecError listing the known ones."""
    if name not in METHODS:
        raise SpecError("method", name, f"unknown method; known: {', '.join(sorted(METHODS))}")
    return METHODS[name]
