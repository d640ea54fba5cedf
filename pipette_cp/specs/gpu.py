"""GPU types: a small catalogue with cited datasheet numbers, or user-defined."""

from __future__ import annotations

import re

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
    peak_fp8_flops_per_s: float | None = Field(
        default=None,
        ge=FLOPS_RANGE[0],
        le=FLOPS_RANGE[1],
        description="Dense fp8 tensor-core peak, FLOP/s (no sparsity); None for GPUs "
        "without fp8 tensor cores (V100, A100).",
    )
    hbm_bandwidth_bytes_per_s: float = Field(
        ge=BANDWIDTH_RANGE[0],
        le=BANDWIDTH_RANGE[1],
        description="Device memory bandwidth, bytes/s.",
    )
    nvlink_bandwidth_bytes_per_s: float = Field(
        ge=0,
        le=BANDWIDTH_RANGE[1],
        description="NVLink (AMD: Infinity Fabric) bandwidth per GPU, one direction, bytes/s "
        "(datasheet totals are bidirectional and are halved here); 0 for PCIe-only GPUs.",
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

    @property
    def vendor(self) -> str:
        """``'AMD'`` for an AMD Instinct part (a name such as ``MI300X-...`` or ``AMD
        Instinct MI300X``), else ``'NVIDIA'`` (every other catalogue GPU; a user-defined
        GPU counts as NVIDIA unless its name says otherwise).

        >>> resolve_gpu("mi300x").vendor, resolve_gpu("b200").vendor
        ('AMD', 'NVIDIA')
        """
        return "AMD" if _AMD_NAME.search(self.name) else "NVIDIA"


#: Names of AMD parts: an Instinct model number (MI250X, MI300X, ...) or the brand.
_AMD_NAME = re.compile(r"(^|[^A-Za-z])MI\d{3}|(^|[^A-Za-z])(AMD|INSTINCT)($|[^A-Za-z])", re.I)


def _gpu(
    name: str,
    mem_mib: float,
    tflops: float,
    hbm_gbs: float,
    nvlink_bidir_gbs: float,
    source: str,
    fp8_tflops: float | None = None,
) -> GpuSpec:
    return GpuSpec(
        name=name,
        memory_bytes=mem_mib * MiB,
        peak_flops_per_s=tflops * TFLOPS,
        peak_fp8_flops_per_s=fp8_tflops * TFLOPS if fp8_tflops is not None else None,
        hbm_bandwidth_bytes_per_s=hbm_gbs * GB,
        nvlink_bandwidth_bytes_per_s=nvlink_bidir_gbs * GB / 2,
        source=source,
    )


_V100 = "NVIDIA Tesla V100 datasheet (2020): 125 TFLOP/s tensor, 900 GB/s HBM2, NVLink 300 GB/s"
_A100 = "NVIDIA A100 datasheet (2021): 312 TFLOP/s dense bf16, NVLink 600 GB/s"
_H100 = (
    "NVIDIA H100 datasheet (2023), SXM5: 989 TFLOP/s dense bf16, 1979 TFLOP/s dense fp8 "
    "(3958 with sparsity), 3.35 TB/s, NVLink 900 GB/s"
)
_H200 = (
    "NVIDIA H200 datasheet (2024), SXM: 989 TFLOP/s dense bf16, 1979 TFLOP/s dense fp8 "
    "(3958 with sparsity), 4.8 TB/s, NVLink 900 GB/s"
)
_B200 = (
    "NVIDIA HGX B200 specifications and DGX B200 datasheet (2024), per GPU of the 8: "
    "180 GB HBM3e (1,440 GB per system), 2250 TFLOP/s dense bf16 and 4500 TFLOP/s dense "
    "fp8 (half of 36 and 72 PFLOP/s with sparsity per 8 GPUs), 8 TB/s HBM3e, NVLink 5 "
    "1.8 TB/s (bidirectional)"
)
_GB200 = (
    "NVIDIA GB200 NVL72 datasheet (2024), per GPU of the 72: 186 GB HBM3e (13.4 TB per "
    "rack), 2500 TFLOP/s dense bf16 and 5000 TFLOP/s dense fp8 (half of 360 and 720 "
    "PFLOP/s with sparsity per rack), 8 TB/s HBM3e (576 TB/s per rack), NVLink 5 1.8 TB/s "
    "(bidirectional; 130 TB/s per rack)"
)
_MI300X = (
    "AMD Instinct MI300X datasheet (2023), OAM: 192 GB HBM3, 1307.4 TFLOP/s dense bf16, "
    "2614.9 TFLOP/s dense fp8, 5.3 TB/s HBM3; Infinity Fabric: 7 links x 128 GB/s = 896 "
    "GB/s peak aggregate (bidirectional, to the 7 peers of an 8-GPU platform together; "
    "one peer pair has one link, 64 GB/s each way: give measured intra-node pair "
    "bandwidths for point-to-point traffic)"
)

#: Built-in GPU types.  Memory is the total that nvidia-smi / rocm-smi reports for the
#: device (MiB), i.e. what the allocator can actually draw from, not the marketing GB:
#: ``nvidia-smi --query-gpu=name,memory.total`` prints 81559 MiB (H100 80GB HBM3),
#: 143771 MiB (H200), 183359 MiB (B200, HGX) and 189471 MiB (GB200, NVL72 compute
#: tray); ``rocm-smi --showmeminfo vram`` prints 205822885888 B = 196288 MiB (MI300X).
GPU_CATALOG: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        _gpu("V100-SXM2-16GB", 16160, 125, 900, 300, _V100),
        _gpu("V100-SXM2-32GB", 32510, 125, 900, 300, _V100),
        _gpu("A100-SXM4-40GB", 40536, 312, 1555, 600, _A100 + ", 1555 GB/s HBM2"),
        _gpu("A100-SXM4-80GB", 81920, 312, 2039, 600, _A100 + ", 2039 GB/s HBM2e"),
        _gpu("H100-SXM5-80GB", 81559, 989, 3350, 900, _H100, fp8_tflops=1979),
        _gpu("H200-SXM-141GB", 143771, 989, 4800, 900, _H200, fp8_tflops=1979),
        _gpu("B200-SXM-180GB", 183359, 2250, 8000, 1800, _B200, fp8_tflops=4500),
        _gpu("GB200-NVL72-186GB", 189471, 2500, 8000, 1800, _GB200, fp8_tflops=5000),
        _gpu("MI300X-OAM-192GB", 196288, 1307.4, 5300, 896, _MI300X, fp8_tflops=2614.9),
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
    "h200-141gb": "H200-SXM-141GB",
    "b200": "B200-SXM-180GB",
    "b200-180gb": "B200-SXM-180GB",
    "gb200": "GB200-NVL72-186GB",
    "gb200-186gb": "GB200-NVL72-186GB",
    "mi300x": "MI300X-OAM-192GB",
    "mi300x-192gb": "MI300X-OAM-192GB",
    "mi300": "MI300X-OAM-192GB",
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
