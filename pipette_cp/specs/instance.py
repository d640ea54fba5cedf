"""A benchmark instance: model + cluster + training + search space (+ best known)."""

from __future__ import annotations

from pydantic import Field, model_validator

from pipette_cp.specs._base import FrozenSpec
from pipette_cp.specs.cluster import ClusterSpec
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.profile import LayerProfile
from pipette_cp.specs.training import SearchSpace, TrainingSpec


class BestKnown(FrozenSpec):
    """The best objective known for an instance, and who found it."""

    iteration_time_s: float = Field(gt=0, description="Best predicted iteration time, s.")
    method: str = Field(description="Method that found it.")
    layout: str = Field(default="", description="Plan.layout() of that plan.")
    proven_optimal: bool = Field(default=False, description="Whether a solver proved it optimal.")
    package_version: str = Field(default="", description="pipette_cp version that measured it.")
    predictor: str = Field(
        default="", description="Predictor of iteration_time_s (analytic, simulator)."
    )
    analytic_time_s: float | None = Field(
        default=None, gt=0, description="The analytic model's iteration time of that plan, s."
    )
    date: str = Field(default="", description="When it was found (ISO 8601 date).")


class Instance(FrozenSpec):
    """Everything needed to choose a layout."""

    name: str = Field(description="Instance identifier (file stem).")
    description: str = Field(default="", description="What this instance exercises.")
    family: str = Field(
        default="", description="Instance family for reports (healthy, degraded, real, ...)."
    )
    model: ModelSpec = Field(description="The model trained.")
    cluster: ClusterSpec = Field(description="The cluster it runs on.")
    training: TrainingSpec = Field(description="Batch, sequence, precision, optimizer.")
    search_space: SearchSpace = Field(
        default_factory=SearchSpace, description="Allowed values of the layout knobs."
    )
    best_known: BestKnown | None = Field(default=None, description="Best objective known so far.")
    profile: LayerProfile | None = Field(
        default=None,
        description="Measured per-layer times that replace the analytic compute estimate.",
    )

    @model_validator(mode="after")
    def _headroom_leaves_memory(self) -> Instance:
        headroom = self.training.memory_headroom_bytes
        smallest = min(self.cluster.gpu_types.values(), key=lambda g: g.memory_bytes)
        if headroom is not None and headroom >= smallest.memory_bytes:
            raise ValueError(
                f"training.memory_headroom_bytes={headroom:.4g} leaves no memory on the "
                f"{smallest.name} ({smallest.memory_bytes / 1e9:.1f} GB)"
            )
        return self
