"""Exact GPU placement: units (the tp ranks of one stage of one replica) onto GPU blocks.

``data`` / ``build`` hold the placement-dependent costs read off the evaluator;
``families`` holds the master's families, one module each, all implementing the
protocol of ``family`` (inputs, tables, rows, value, bounds, check); ``model`` writes
the master from their list once over a ``backend`` (``cpsat``, ``milp``);
``kelley`` runs the cutting-plane loop and its bounds; ``lns`` re-solves small
neighbourhoods on large clusters; ``local_search`` polishes seeds without a
solver; ``solve`` composes them (:func:`solve_placement`); ``oracle`` enumerates
every placement of tiny instances for the tests.
"""

from pipette_cp.solvers.placement.solve import (
    BACKENDS,
    PlainSeeder,
    Seeder,
    solve_placement,
    two_level_possible,
)

__all__ = ["BACKENDS", "PlainSeeder", "Seeder", "solve_placement", "two_level_possible"]
