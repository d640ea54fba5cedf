"""``memory_limit``: every unit on GPUs whose usable memory holds its stage.

Nothing to add to the master: a unit's domain holds only places whose GPU type fits
its stage (``allowed``, :func:`~pipette_cp.solvers.placement.build.build_placement_data`);
checked here once per master.
"""

from __future__ import annotations

from pipette_cp.solvers.placement.data import Family, MasterView


class MemoryLimit(Family):
    """Every unit on a place whose GPUs hold its stage (module docstring)."""

    name = "memory_limit"
    check = "memory_limit"

    def add_rows(self, m: MasterView) -> None:
        for u, lits in enumerate(m.place):
            assert all(m.data.allowed[m.data.stage_of(u), p] for p in lits)
