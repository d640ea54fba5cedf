"""Training frameworks: state bytes per parameter and compute speed, by name.

Every framework keeps Megatron's mixed-precision layout unless a source says
otherwise: bf16 weights (2 B), fp32 gradient buffer (4 B), fp32 master weights
(4 B) and two fp32 Adam moments (8 B) per parameter
(``megatron/training/theoretical_memory_usage.py``: 18 B, or 6 + 12/dp with the
distributed optimizer).  ``compute_efficiency`` scales the calibrated compute
model (fitted on Megatron-LM and Megatron-Core runs, so 1.0 for both); for the
others it is the one parameter fitted per framework:
``1 / median(predicted / measured throughput)`` over the fit side of the published
runs (``python -m pipette_cp.experiments.published_runs_report --fit``), the median so that
outliers do not move it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipette_cp.cost.calibration import GpuCalibration
from pipette_cp.errors import SpecError
from pipette_cp.specs.training import FrameworkProfile, TrainingSpec


@dataclass(frozen=True)
class Framework:
    """A framework with every value resolved (bytes per parameter; speed relative to 1.0)."""

    name: str
    compute_efficiency: float
    weight_bytes: float
    gradient_bytes: float
    master_weight_bytes: float
    optimizer_state_bytes: float
    provenance: str = ""


_MEGATRON = {"weight_bytes": 2.0, "gradient_bytes": 4.0, "master_weight_bytes": 4.0,
             "optimizer_state_bytes": 8.0}  # fmt: skip
_FIT = "fitted: 1 / median(predicted / measured) on the fit side of published_runs_more.csv"

#: The frameworks by name.
FRAMEWORKS: dict[str, Framework] = {
    "megatron-core": Framework(
        "megatron-core", 1.0, **_MEGATRON, provenance="the compute calibration's own runs"
    ),
    "megatron-lm": Framework(
        "megatron-lm", 1.0, **_MEGATRON, provenance="the compute calibration's own runs (SC21)"
    ),
    # NVIDIA DGX Cloud benchmarking recipes v24.11.1 (NeMo on Megatron-Core, H100):
    # step times include what the recipes' timers include.
    "nemo": Framework("nemo", 0.926, **_MEGATRON, provenance=f"{_FIT} (DGX Cloud, 5 rows)"),
    # BigScience BLOOM layout search (Megatron-DeepSpeed, ZeRO-1, fp16 optimizer).
    "megatron-deepspeed": Framework(
        "megatron-deepspeed", 0.978, **_MEGATRON, provenance=f"{_FIT} (BLOOM, 26 rows)"
    ),
    # Hagemann et al. 2023: Aleph Alpha's Megatron-style trainer on A100.
    "aleph-alpha": Framework(
        "aleph-alpha", 0.916, **_MEGATRON, provenance=f"{_FIT} (Hagemann et al., 99 rows)"
    ),
}

_FIELDS = ("compute_efficiency", "weight_bytes", "gradient_bytes", "master_weight_bytes",
           "optimizer_state_bytes")  # fmt: skip


def resolve_framework(profile: FrameworkProfile) -> Framework:
    """The named framework with the profile's non-None fields applied.

    Raises
    ------
    SpecError
        An unknown name without every field given.
    """
    given = {f: getattr(profile, f) for f in _FIELDS if getattr(profile, f) is not None}
    base = FRAMEWORKS.get(profile.name)
    if base is None:
        missing = [f for f in _FIELDS if f not in given]
        if missing:
            raise SpecError(
                "training.framework.name",
                profile.name,
                f"unknown framework; known: {', '.join(FRAMEWORKS)} (or give "
                f"{', '.join(missing)} too)",
            )
        return Framework(name=profile.name, provenance="user-defined", **given)
    return replace(base, **given) if given else base


def framework_calibration(cal: GpuCalibration, training: TrainingSpec) -> GpuCalibration:
    """``cal`` with every compute rate (GEMM ceiling, HBM, fused attention) scaled by the
    framework's ``compute_efficiency``: every layer kernel's time divides by it."""
    eff = resolve_framework(training.framework).compute_efficiency
    if eff == 1.0:
        return cal
    return replace(
        cal,
        gemm_efficiency_max=cal.gemm_efficiency_max * eff,
        hbm_efficiency=cal.hbm_efficiency * eff,
        flash_attention_efficiency=cal.flash_attention_efficiency * eff,
    )
