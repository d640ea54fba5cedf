"""The families of the placement master, one module each, in one list.

Every family implements :class:`~pipette_cp.solvers.placement.family.PlacementFamily`
(specialised as :data:`~pipette_cp.solvers.placement.data.Family`); the problem's list
(:func:`placement_families`) gives the master's input vector ``x``
(:class:`~pipette_cp.solvers.placement.family.XIndex`), its variables and rows
(:class:`~pipette_cp.solvers.placement.model.PlacementModel`), the value of an assignment
(:meth:`~pipette_cp.solvers.placement.data.PlacementData.x_of`,
:meth:`~pipette_cp.solvers.placement.data.PlacementData.total_time_s`), Kelley's bounds
(:mod:`~pipette_cp.solvers.placement.kelley`) and, through each hard family's ``check``,
the checker's functions that refuse what it forbids.  The order is the order of the
inputs in ``x`` and of the rows in the master.

A new family is a module here with a subclass of ``Family`` and a test under
``tests/solvers/placement/families/``; it joins every problem through :data:`BUILTIN`
(one line), or one problem through ``build_placement_data(..., families=...)``.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipette_cp.solvers.extensions import ConstraintFamily
from pipette_cp.solvers.placement.data import Family
from pipette_cp.solvers.placement.families.alltoall import ExpertAllToAll
from pipette_cp.solvers.placement.families.compute_classes import ComputeClasses
from pipette_cp.solvers.placement.families.context_rings import ContextParallelRings
from pipette_cp.solvers.placement.families.dp_rings import DataParallelRings
from pipette_cp.solvers.placement.families.embedding import TiedEmbedding
from pipette_cp.solvers.placement.families.expert_rings import ExpertRings
from pipette_cp.solvers.placement.families.hard.bijection import PlacementBijection
from pipette_cp.solvers.placement.families.hard.memory import MemoryLimit
from pipette_cp.solvers.placement.families.hard.no_failed_link import NoFailedLink
from pipette_cp.solvers.placement.families.hard.tensor_group import TensorGroupWithinNode
from pipette_cp.solvers.placement.families.hard.user import UserFamily
from pipette_cp.solvers.placement.families.hops import PipelineHops
from pipette_cp.solvers.placement.families.nic_sharing import NicSharing
from pipette_cp.solvers.placement.families.symmetry import ReplicaSymmetry

#: The built-in families of every problem, in order: hard families, then cost families.
BUILTIN: tuple[Family, ...] = (
    PlacementBijection(),
    TensorGroupWithinNode(),
    MemoryLimit(),
    NoFailedLink(),
    PipelineHops(),
    DataParallelRings(),
    TiedEmbedding(),
    NicSharing(),
    ExpertAllToAll(),
    ContextParallelRings(),
    ExpertRings(),
    ComputeClasses(),
)
#: Last in every list: its rows hold only where every other family is symmetric.
SYMMETRY = ReplicaSymmetry()


def placement_families(
    constraints: Sequence[ConstraintFamily] = (), extra: Sequence[Family] = ()
) -> tuple[Family, ...]:
    """A problem's families: the built-in ones, ``extra`` ones, the user's constraint
    families (:class:`UserFamily`) and the symmetry breaking."""
    return (*BUILTIN, *extra, *(UserFamily(c) for c in constraints), SYMMETRY)


__all__ = ["BUILTIN", "SYMMETRY", "UserFamily", "placement_families"]
