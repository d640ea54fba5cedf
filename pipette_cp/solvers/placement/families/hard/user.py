"""A user's constraint family (:class:`~pipette_cp.solvers.extensions.ConstraintFamily`)
as a family of the master: the hard-only case, with rows and a check and nothing else.

Its rows go in through :class:`~pipette_cp.solvers.extensions.PlacementContext` (the
user's API, unchanged); its check is the family's own ``violations`` (an assignment
that breaks it is worth ``inf``).  Its rows need not be replica-symmetric, so the
symmetry breaking is dropped where a user family is present.
"""

from __future__ import annotations

import numpy as np

from pipette_cp.solvers.extensions import ConstraintFamily, PlacementContext, family_violations
from pipette_cp.solvers.placement.data import Family, MasterView, PlacementData


class UserFamily(Family):
    """``family``'s placement rows and violations (module docstring)."""

    symmetric = False

    def __init__(self, family: ConstraintFamily) -> None:
        self.family = family
        self.name = family.name

    def add_rows(self, m: MasterView) -> None:
        self.family.placement(PlacementContext(m))

    def admits(self, data: PlacementData, assign: np.ndarray) -> bool:
        plan = data.plan.model_copy(update={"placement": data.placement(assign)})
        return not family_violations([self.family], data.instance, plan)
