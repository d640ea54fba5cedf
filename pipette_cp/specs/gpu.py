"""GPU types: a small catalogue with cited datasheet numbers, or user-defined."""

from __future__ import annotations

from pydantic import Field, field_validator

from pipette_cp.errors import SpecError
from pipette_cp.specs._base import FrozenSpec, validate_spec
from pipette_cp.units import GB, TFLOPS, MiB

#: Physical bounds of a GPU's numbers: far outside any real device on either side, so
#: that a value beyond them is a unit mistake (bytes given as GB, FLOP/s as TFLOP/s).
MEMORY_BYTES_RANGE = (float(MiB), float(2**50))  # 1 MiB .. 1 PiB
FLOPS_RANGE = (1e9, 1e18)  # 1 GFLOP/s .. 1 EFLOP/s
BANDWIDTH_RANGE = (1e6, 1e15)  # 1 MB/s .. 1 PB/s


class GpuSpec(FrozenSpec):
    """One GPU model.  Peak numbers are dense (no sparsity) datasheet values."""

    name: str = Field(description="Catalogue name, e.g. 'A100-SXM-80GB'.")
    memory_bytes: float = Field(
        ge=MEMORY_BYTES_RANGE[0],
        le=MEMORY_BYTES_RANGE[1],
        description="Device memory (HBM) capacity, bytes.",
    )
    peak_flops_per_s: float = Field(
        ge=FLOPS_RANGE[0],
        le=FLOPS_RANGE[1],
        description="Dense bf16/fp16 tensor-core peak, FLOP/s (no sparsity).",
    )
    hbm_bandwidth_bytes_per_s: float = Field(
        ge=BANDWIDTH_RANGE[0],
        le=BANDWIDTH_RANGE[1],
        description="Device memory bandwidth, bytes/s.",
    )
    nvlink_bandwidth_bytes_per_s: float = Field(
        ge=0,
        le=BANDWIDTH_RANGE[1],
        description="NVLink bandwidth per GPU, one direction, bytes/s (datasheet totals are "
        "bidirectional and are halved here); 0 for PCIe-only GPUs.",
    )
    source: str = Field(default="", description="Datasheet the numbers come from.")

    @field_validator("nvlink_bandwidth_bytes_per_s")
    @classmethod
    def _nvlink_zero_or_real(cls, value: float) -> float:
        if 0 < value < BANDWIDTH_RANGE[0]:
            raise ValueError(
                f"must be 0 (no NVLink) or at least {BANDWIDTH_RANGE[0]:g} bytes/s (1 MB/s)"
            )
        return value


def _gpu(
    name: str, mem_mib: float, tflops: float, hbm_gbs: float, nvlink_bidir_gbs: float, source: str
) -> GpuSpec:
    return GpuSpec(
        name=name,
        memory_bytes=mem_mib * MiB,
        peak_flops_per_s=tflops * TFLOPS,
        hbm_bandwidth_bytes_per_s=hbm_gbs * GB,
        nvlink_bandwidth_bytes_per_s=nvlink_bidir_gbs * GB / 2,
        source=source,
    )


_V100 = "NVIDIA Tesla V100 datasheet (2020): 125 TFLOP/s tensor, 900 GB/s HBM2, NVLink 300 GB/s"
_A100 = "NVIDIA A100 datasheet (2021): 312 TFLOP/s dense bf16, NVLink 600 GB/s"
_H100 = "NVIDIA H100 datasheet (2023), SXM5: 989 TFLOP/s dense bf16, 3.35 TB/s, NVLink 900 GB/s"
_H200 = "NVIDIA H200 datasheet (2024), SXM: 989 TFLOP/s dense bf16, 4.8 TB/s, NVLink 900 GB/s"

#: Built-in GPU types.  Memory is the total that nvidia-smi reports for the device
#: (MiB), i.e. what the CUDA allocator can actually draw from, not the marketing GB.
GPU_CATALOG: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        _gpu("V100-SXM2-16GB", 16160, 125, 900, 300, _V100),
        _gpu("V100-SXM2-32GB", 32510, 125, 900, 300, _V100),
        _gpu("A100-SXM4-40GB", 40536, 312, 1555, 600, _A100 + ", 1555 GB/s HBM2"),
        _gpu("A100-SXM4-80GB", 81920, 312, 2039, 600, _A100 + ", 2039 GB/s HBM2e"),
        _gpu("H100-SXM5-80GB", 81559, 989, 3350, 900, _H100),
        _gpu("H200-SXM-141GB", 143771, 989, 4800, 900, _H200),
    )
}

_ALIASES = {
    "v100": "V100-SXM2-32GB",
    "v100-16gb": "V100-SXM2-16GB",
    "v100-32gb": "V100-SXM2-32GB",
    "a100": "A100-SXM4-80GB",
    "a100-40gb": "A100-SXM4-40GB",
    "a100-80gb": "A100-SXM4-80GB",
    "a100-sxm4": "A100-SXM4-80GB",
    "h100": "H100-SXM5-80GB",
    "h100-80gb": "H100-SXM5-80GB",
    "h100-sxm": "H100-SXM5-80GB",
    "h200": "H200-SXM-141GB",
}


def resolve_gpu(value: str | dict | GpuSpec, field: str = "gpu") -> GpuSpec:
    """A GPU from a catalogue name (case-insensitive, aliases allowed) or inline fields.

    >>> resolve_gpu("h100").name
    'H100-SXM5-80GB'
    """
    if isinstance(value, GpuSpec):
        return value
    if isinstance(value, dict):
        return validate_spec(GpuSpec, value, field)
    if not isinstance(value, str):
        raise SpecError(field, value, "expected a GPU name or a mapping of GpuSpec fields")
    by_lower = {name.lower(): name for name in GPU_CATALOG}
    key = value.strip().lower()
    name = by_lower.get(key) or _ALIASES.get(key)
    if name is None:
        known = ", ".join(GPU_CATALOG)
        raise SpecError(field, value, f"unknown GPU; known: {known} (or define one inline)")
    return GPU_CATALOG[name]
