"""Typed, frozen specs: the vocabulary every other module speaks."""

from pipette_cp.specs._base import FrozenSpec, validate_spec
from pipette_cp.specs.cluster import ClusterSpec
from pipette_cp.specs.gpu import GPU_CATALOG, GpuSpec, resolve_gpu
from pipette_cp.specs.instance import BestKnown, Instance
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Evaluation, Plan, SolveInfo, TimeBreakdown
from pipette_cp.specs.profile import LayerProfile, LayerProfileEntry
from pipette_cp.specs.search_space import SearchSpace
from pipette_cp.specs.training import Recompute, TrainingSpec

__all__ = [
    "GPU_CATALOG",
    "BestKnown",
    "ClusterSpec",
    "Evaluation",
    "FrozenSpec",
    "GpuSpec",
    "Instance",
    "LayerProfile",
    "LayerProfileEntry",
    "ModelSpec",
    "Plan",
    "Recompute",
    "SearchSpace",
    "SolveInfo",
    "TimeBreakdown",
    "TrainingSpec",
    "resolve_gpu",
    "validate_spec",
]

#: Every spec with a published JSON schema (``pipette-cp schema`` writes them to pipette_cp/schemas).
SCHEMA_SPECS = (
    ModelSpec,
    GpuSpec,
    ClusterSpec,
    TrainingSpec,
    SearchSpace,
    Plan,
    Evaluation,
    Instance,
    LayerProfile,
)
