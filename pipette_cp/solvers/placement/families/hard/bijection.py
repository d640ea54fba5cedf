"""``placement_bijection``: every unit on exactly one place, no place over its slots.

Rows: ``sum_p place[u, p] = 1`` for every unit with a choice, and ``sum_u place[u, p] <=
capacity[p]`` (minus the units fixed there) wherever more units could go to ``p``.
"""

from __future__ import annotations

from typing import Any

from pipette_cp.errors import InfeasibleError
from pipette_cp.solvers.placement.data import Family, MasterView
from pipette_cp.solvers.placement.families.rows import const


class PlacementBijection(Family):
    """One place per unit, and each place's capacity (module docstring)."""

    name = "placement_bijection"
    check = "placement_bijection"

    def add_rows(self, m: MasterView) -> None:
        """Every unit on exactly one place; a place holds at most its free slots."""
        users: dict[int, list[Any]] = {}
        for u, lits in enumerate(m.place):
            free = [lit for lit in lits.values() if not const(lit)]
            if free:
                m.b.add_linear([(1, x) for x in free], "==", 1, f"one_place_{u}")
            for p, lit in lits.items():
                users.setdefault(p, []).append(lit)
        for p, held in users.items():
            fixed = sum(1 for x in held if const(x))
            terms = [(1, x) for x in held if not const(x)]
            cap = int(m.data.capacity[p]) - fixed
            if cap < 0:  # units whose only place it is (e.g. the only GPU with the memory)
                raise InfeasibleError(
                    f"{fixed} units can only go to place {p}, which has room for "
                    f"{int(m.data.capacity[p])} (memory or failed links)"
                )
            if terms and len(terms) > cap:
                m.b.add_linear(terms, "<=", cap, f"capacity_{p}")
