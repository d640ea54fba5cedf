"""A benchmark instance: model + cluster + training + search space (+ best known)."""

from __future__ import annotations

from pydantic import Field, model_validator

from pipette_cp.specs._base import FrozenSpec
from pipette_cp.specs.cluster import ClusterSpec
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.profile import LayerProfile
from pipette_cp.specs.search_space import SearchSpace
from pipette_cp.specs.training import TrainingSpec


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
    def _profile_matches(self) -> Instance:
        """A measured profile belongs to its model and its kind of device."""
        prof = self.profile
        if prof is None:
            return self
        if prof.model and prof.model != self.model.name:
            raise ValueError(
                f"profile.model={prof.model!r}: measured on another model than {self.model.name!r}"
            )
        if prof.device == "cpu" or prof.gpu.lower() == "cpu":
            raise ValueError(
                "profile.device='cpu': a CPU measurement does not stand for GPU times "
                "(profile on the cluster's GPUs with --device cuda)"
            )
        measured = _family(prof.gpu)
        ours = {_family(g.name) for g in self.cluster.gpu_types.values()}
        if measured and ours and measured not in ours:
            raise ValueError(
                f"profile.gpu={prof.gpu!r}: measured on {measured}, the cluster has "
                f"{', '.join(sorted(ours))}"
            )
        return self

    @model_validator(mode="after")
    def _lora_on_dense_layers(self) -> Instance:
        """LoRA's adapters are modelled on dense layers with standard attention (the
        four linears of :data:`~pipette_cp.specs.lora.LORA_TARGETS`)."""
        model = self.model
        if self.training.lora is None or not (model.is_moe or model.is_mla):
            return self
        what = "a mixture-of-experts" if model.is_moe else "a latent-attention (MLA)"
        raise ValueError(
            f"training.lora: LoRA on {what} model ({model.name!r}) is not modelled; "
            "dense models with standard attention only"
        )

    @model_validator(mode="after")
    def _one_vendor(self) -> Instance:
        """One job runs on one vendor's GPUs: NCCL (NVIDIA) and RCCL (AMD) form no
        communicator together, and the frameworks build for one of them."""
        cluster, excluded = self.cluster, set(self.search_space.exclude_nodes)
        kinds: dict[str, set[str]] = {}
        for node, kind in enumerate(cluster.node_gpu_types):
            if cluster.node_names[node] not in excluded:
                kinds.setdefault(cluster.gpu_types[kind].vendor, set()).add(kind)
        if len(kinds) > 1:
            found = "; ".join(f"{v}: {', '.join(sorted(k))}" for v, k in sorted(kinds.items()))
            raise ValueError(
                f"cluster.node_gpu_types: nodes of two vendors ({found}); one job runs on one "
                "vendor's GPUs (NCCL and RCCL form no communicator together): exclude the "
                "other's nodes (search_space.exclude_nodes) or plan each part as its own job"
            )
        return self

    @model_validator(mode="after")
    def _bf16_layers_within_the_model(self) -> Instance:
        t, layers = self.training, self.model.num_layers
        if t.bf16_first_layers + t.bf16_last_layers > layers:
            raise ValueError(
                f"training.bf16_first_layers={t.bf16_first_layers} + bf16_last_layers="
                f"{t.bf16_last_layers} exceed the model's {layers} layers"
            )
        return self

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


#: GPU families a device name may carry, a family before any family its name contains
#: ('GB300' before 'B300', 'GH200' before 'H200', 'H200' before 'H20').
_FAMILIES = ("GB300", "GB200", "GH200", "B300", "B200", "H200", "H100", "H800", "H20", "A100",
             "A800", "V100", "MI300X", "L40S")  # fmt: skip


def _family(name: str) -> str:
    """The GPU family in a device or GPU name ('NVIDIA H100 80GB HBM3' -> 'H100'), '' if none."""
    upper = name.upper()
    return next((f for f in _FAMILIES if f in upper), "")
