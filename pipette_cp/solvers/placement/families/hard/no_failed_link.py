"""``no_failed_link``: no flow of any family over a failed GPU pair.

Rows, for every unit pair ``(u, v)`` of every family with flows (but rings NCCL
reorders, whose families forbid their own links) and every place ``p`` of ``u``:
``place[u, p] + sum of the places q of v with a failed p-q link <= 1`` (one way for
rings, either way for the others).
"""

from __future__ import annotations

import numpy as np

from pipette_cp.solvers.placement.data import Family, MasterView
from pipette_cp.solvers.placement.families.rows import const


class NoFailedLink(Family):
    """No flow over a failed pair (module docstring)."""

    name = "no_failed_link"
    check = "no_failed_link"

    def add_rows(self, m: MasterView) -> None:
        d = m.data
        bad_dir = ~np.isfinite(d.inv_bw)
        bad_any = bad_dir | bad_dir.T
        for family, edges in d.flows():
            if family.reordered(d):
                continue  # its own rows forbid the links NCCL's ring would take
            bad = bad_dir if family.one_way else bad_any
            for k, (_, u, v) in enumerate(edges):
                for p, lit in m.place[u].items():
                    worse = [x for q, x in m.place[v].items() if bad[p, q] and q != p]
                    if not worse:
                        continue
                    terms = [(1, x) for x in [lit, *worse] if not const(x)]
                    rhs = 1 - sum(1 for x in [lit, *worse] if const(x))
                    name = f"no_failed_link_{family.name}_{k}_{p}"
                    m.b.add_linear(terms, "<=", rhs, name)
