"""GPU types: a small catalogue with cited datasheet numbers, or user-defined.

Every GPU carries its architecture (:data:`Architecture`), and every decision that
depends on the chip reads that field, never the name: the FP8 recipes it runs, the
kernels (FlashAttention 3 on Hopper only, NVIDIA-only kernels by vendor) and Megatron's
launch rules (compute capability below 10).  A user GPU that does not give it gets the
architecture its name tells (:func:`architecture_of_name`: ``"H100-PCIe"`` is Hopper,
``"B200"`` Blackwell), else ``"unknown"``: it loads, runs every recipe and kernel that
needs no particular architecture, and a Hopper- or Blackwell-only one is refused with a
message that says to set ``architecture``.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from pipette_cp.errors import SpecError
from pipette_cp.specs._base import FrozenSpec, validate_spec
from pipette_cp.units import GB, TFLOPS, MiB

#: Physical bounds of a GPU's numbers: far outside any real device on either side, so
#: that a value beyond them is a unit mistake (bytes given as GB, FLOP/s as TFLOP/s).
MEMORY_BYTES_RANGE = (float(MiB), float(2**50))  # 1 MiB .. 1 PiB
FLOPS_RANGE = (1e9, 1e18)  # 1 GFLOP/s .. 1 EFLOP/s
BANDWIDTH_RANGE = (1e6, 1e15)  # 1 MB/s .. 1 PB/s

#: GPU architectures.  NVIDIA: volta (V100), turing (T4), ampere (A100, A800, A10, A30,
#: A40), ada (L4, L40, L40S), hopper (H100, H200, H800, H20, GH200), blackwell (B200,
#: GB200, B300, GB300: the data-centre parts, compute capability 10.x); AMD Instinct:
#: cdna2 (MI250X), cdna3 (MI300X, MI325X), cdna4 (MI350X, MI355X); unknown: none of
#: these, so no feature that needs a particular architecture.
Architecture = Literal[
    "volta", "turing", "ampere", "ada", "hopper", "blackwell", "cdna2", "cdna3", "cdna4",
    "unknown",
]  # fmt: skip
#: CUDA compute capability of each NVIDIA architecture's data-centre parts (B300 and
#: GB300 report 10.3, B200 and GB200 10.0: only the major version decides anything here).
COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    "volta": (7, 0), "turing": (7, 5), "ampere": (8, 0), "ada": (8, 9), "hopper": (9, 0),
    "blackwell": (10, 0),
}  # fmt: skip
#: The AMD Instinct architectures.
AMD_ARCHITECTURES: tuple[Architecture, ...] = ("cdna2", "cdna3", "cdna4")


def _optional_peak(description: str) -> Any:
    """An optional tensor-core peak field, FLOP/s, in :data:`FLOPS_RANGE`."""
    return Field(default=None, ge=FLOPS_RANGE[0], le=FLOPS_RANGE[1], description=description)


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
    peak_fp8_flops_per_s: float | None = _optional_peak(
        "Dense fp8 tensor-core peak, FLOP/s (no sparsity); None for GPUs without fp8 tensor "
        "cores (V100, A100)."
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
    peak_fp4_flops_per_s: float | None = _optional_peak(
        "Dense fp4 (NVFP4) tensor-core peak, FLOP/s (no sparsity), where the catalogue "
        "gives it (Blackwell); the layer GEMMs of precision fp4 run at it."
    )
    architecture: Architecture = Field(
        default="unknown",
        description="GPU architecture, which decides the FP8 recipes (blockwise: hopper, "
        "blackwell; mxfp8: blackwell), FlashAttention 3 (hopper), the NVIDIA-only kernels "
        "(not on cdna*) and Megatron's launch rules (compute capability < 10 before "
        "blackwell).  Not given: the architecture the name tells (H100, H200, H800, H20, "
        "GH200: hopper; B200, GB200, B300, GB300: blackwell; A100: ampere; MI300X: cdna3; "
        "...), else unknown, which runs no architecture-specific feature.",
    )
    source: str = Field(default="", description="Datasheet the numbers come from.")

    @model_validator(mode="before")
    @classmethod
    def _architecture_from_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("architecture") is None:
            name = data.get("name")
            arch = architecture_of_name(name) if isinstance(name, str) else "unknown"
            return {**data, "architecture": arch}
        return data

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
        """``'AMD'`` for an AMD Instinct architecture (cdna2, cdna3, cdna4), ``'NVIDIA'``
        for the others; a GPU of unknown architecture is AMD when its name says so (``AMD
        Instinct ...``, ``MI300X-...``), else NVIDIA.

        >>> resolve_gpu("mi300x").vendor, resolve_gpu("b200").vendor
        ('AMD', 'NVIDIA')
        """
        if self.architecture in AMD_ARCHITECTURES:
            return "AMD"
        if self.architecture != "unknown":
            return "NVIDIA"
        return "AMD" if _AMD_NAME.search(self.name) else "NVIDIA"

    @property
    def compute_capability(self) -> tuple[int, int] | None:
        """CUDA compute capability of the architecture (:data:`COMPUTE_CAPABILITY`); None
        for AMD and unknown architectures.

        >>> resolve_gpu("h800").compute_capability, resolve_gpu("mi300x").compute_capability
        ((9, 0), None)
        """
        return COMPUTE_CAPABILITY.get(self.architecture)


#: Names of AMD parts: an Instinct model number (MI250X, MI300X, ...) or the brand.
_AMD_NAME = re.compile(r"(^|[^A-Za-z])MI\d{3}|(^|[^A-Za-z])(AMD|INSTINCT)($|[^A-Za-z])", re.I)
#: AMD Instinct model numbers by architecture.
_CDNA: tuple[tuple[Architecture, re.Pattern[str]], ...] = (
    ("cdna4", re.compile(r"MI35\d", re.I)),
    ("cdna3", re.compile(r"MI30\d|MI325", re.I)),
    ("cdna2", re.compile(r"MI2\d\d", re.I)),
)
#: NVIDIA names by architecture, tried in this order.  Blackwell: B100, B200, GB200, B300,
#: GB300, ... (compute capability >= 10) or the word; Hopper: H100, H200 (and GH200), H800,
#: H20; the others by their data-centre model numbers or the architecture's name.
_NVIDIA: tuple[tuple[Architecture, re.Pattern[str]], ...] = (
    ("blackwell", re.compile(r"(^|[^A-Za-z])G?B[1-9]\d{2}($|[^0-9])|blackwell", re.I)),
    ("hopper", re.compile(r"H100|H200|H800|(^|[^A-Za-z0-9])H20($|[^0-9])|hopper", re.I)),
    ("ada", re.compile(r"(^|[^A-Za-z0-9])L(4|40S?)($|[^0-9A-Za-z])|(^|[^A-Za-z])ada($|[^A-Za-z])", re.I)),
    ("ampere", re.compile(r"(^|[^A-Za-z0-9])A(100|800|10G?|30|40)($|[^0-9])|ampere", re.I)),
    ("turing", re.compile(r"(^|[^A-Za-z0-9])T4($|[^0-9])|turing", re.I)),
    ("volta", re.compile(r"V100|volta", re.I)),
)  # fmt: skip


def architecture_of_name(name: str) -> Architecture:
    """The architecture a GPU name tells (the rule for a GPU that does not give its
    ``architecture``): an AMD name by its Instinct model number, an NVIDIA one by
    :data:`_NVIDIA`; ``"unknown"`` when neither matches.

    >>> [architecture_of_name(n) for n in ("NVIDIA H800", "GB300", "MI250X", "X1")]
    ['hopper', 'blackwell', 'cdna2', 'unknown']
    """
    if _AMD_NAME.search(name):
        return next((arch for arch, pattern in _CDNA if pattern.search(name)), "unknown")
    return next((arch for arch, pattern in _NVIDIA if pattern.search(name)), "unknown")


def _gpu(
    name: str,
    mem_mib: float,
    tflops: float,
    hbm_gbs: float,
    nvlink_bidir_gbs: float,
    source: str,
    architecture: Architecture,
    fp8_tflops: float | None = None,
    fp4_tflops: float | None = None,
) -> GpuSpec:
    return GpuSpec(
        name=name,
        memory_bytes=mem_mib * MiB,
        peak_flops_per_s=tflops * TFLOPS,
        peak_fp8_flops_per_s=fp8_tflops * TFLOPS if fp8_tflops is not None else None,
        peak_fp4_flops_per_s=fp4_tflops * TFLOPS if fp4_tflops is not None else None,
        hbm_bandwidth_bytes_per_s=hbm_gbs * GB,
        nvlink_bandwidth_bytes_per_s=nvlink_bidir_gbs * GB / 2,
        architecture=architecture,
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
    "fp8 (half of 36 and 72 PFLOP/s with sparsity per 8 GPUs), 9000 TFLOP/s dense fp4 "
    "(half of 144 PFLOP/s with sparsity per 8 GPUs), 8 TB/s HBM3e, NVLink 5 1.8 TB/s "
    "(bidirectional)"
)
_GB200 = (
    "NVIDIA GB200 NVL72 datasheet (2024), per GPU of the 72: 186 GB HBM3e (13.4 TB per "
    "rack), 2500 TFLOP/s dense bf16 and 5000 TFLOP/s dense fp8 (half of 360 and 720 "
    "PFLOP/s with sparsity per rack), 10000 TFLOP/s dense fp4 (half of 1440 PFLOP/s with "
    "sparsity per rack), 8 TB/s HBM3e (576 TB/s per rack), NVLink 5 1.8 TB/s "
    "(bidirectional; 130 TB/s per rack)"
)
_H800 = (
    "NVIDIA H800 Tensor Core GPU datasheet (2023), SXM: 80 GB HBM3, 989 TFLOP/s dense bf16, "
    "1979 TFLOP/s dense fp8 (1979 and 3958 with sparsity), 3.35 TB/s, NVLink 400 GB/s "
    "(bidirectional; the H100's 900 GB/s, cut for export), FP64 1 TFLOP/s"
)
_H20 = (
    "NVIDIA H20 (Hopper, 2024), no public NVIDIA datasheet: the partner specification as "
    "the press published it, 96 GB HBM3, 148 TFLOP/s dense bf16, 296 TFLOP/s dense fp8 "
    "(assumption: read as dense, as no sparsity figure is given and 148 is 15 % of the "
    "H100's 989 dense), 4.0 TB/s, NVLink 900 GB/s, 400 W; 78 SMs (Geekbench 6 listing)"
)
_GH200 = (
    "NVIDIA GH200 Grace Hopper Superchip datasheet (2024), its Hopper GPU: 989 TFLOP/s "
    "dense bf16, 1979 TFLOP/s dense fp8 (1979 and 3958 with sparsity), 96 GB HBM3 at "
    "4 TB/s or 144 GB HBM3e at 4.9 TB/s, NVLink 900 GB/s to other GPUs (bidirectional; "
    "NVLink-C2C, 900 GB/s to its own Grace CPU, is no GPU link), module 450-1000 W; a "
    "node of four GH200 shares the 18 links among the peers: give measured intra-node "
    "pair bandwidths"
)
_B300 = (
    "NVIDIA HGX B300 specifications and DGX B300 datasheet (2025), per GPU of the 8: "
    "288 GB HBM3e (2.3 TB per system), 2250 TFLOP/s dense bf16 and 4500 TFLOP/s dense fp8 "
    "(half of 36 and 72 PFLOP/s with sparsity per 8 GPUs), 13500 TFLOP/s dense fp4 "
    "(108 PFLOP/s dense, 144 with sparsity, per 8 GPUs), FP64 1.25 TFLOP/s (10 TFLOP/s "
    "per 8 GPUs, cut from the B200's 37 per GPU), 8 TB/s HBM3e, NVLink 5 1.8 TB/s "
    "(bidirectional); NVIDIA Technical Blog 'Inside NVIDIA Blackwell Ultra' (2025): "
    "288 GB HBM3e at 8 TB/s per GPU, 160 SMs in the full chip (the shipping part's SM "
    "count is not published)"
)
_GB300 = (
    "NVIDIA GB300 NVL72 specifications (2025), per GPU of the 72: 288 GB HBM3e (about "
    "20 TB per rack), 2500 TFLOP/s dense bf16 and 5000 TFLOP/s dense fp8 (half of 360 and "
    "720 PFLOP/s with sparsity per rack), 15000 TFLOP/s dense fp4 (1080 PFLOP/s dense, "
    "1440 with sparsity, per rack; 15 PFLOP/s dense NVFP4 per GPU in 'Inside NVIDIA "
    "Blackwell Ultra'), 8 TB/s HBM3e (576 TB/s per rack), NVLink 5 1.8 TB/s "
    "(bidirectional; 130 TB/s per rack), one ConnectX-8 800 Gb/s SuperNIC per GPU"
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
#: ``nvidia-smi --query-gpu=name,memory.total`` prints 81559 MiB (H100 80GB HBM3, and
#: H800), 97871 MiB (H20; GH200 480GB, the 96 GB HBM3 part), 143771 MiB (H200),
#: 146831 MiB (GH200 144G HBM3e), 183359 MiB (B200, HGX), 189471 MiB (GB200, NVL72
#: compute tray), 275040 MiB (B300 SXM6 AC, HGX) and 284208 MiB (GB300, NVL72 compute
#: tray); ``rocm-smi --showmeminfo vram`` prints 205822885888 B = 196288 MiB (MI300X).
GPU_CATALOG: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        _gpu("V100-SXM2-16GB", 16160, 125, 900, 300, _V100, "volta"),
        _gpu("V100-SXM2-32GB", 32510, 125, 900, 300, _V100, "volta"),
        _gpu("A100-SXM4-40GB", 40536, 312, 1555, 600, _A100 + ", 1555 GB/s HBM2", "ampere"),
        _gpu("A100-SXM4-80GB", 81920, 312, 2039, 600, _A100 + ", 2039 GB/s HBM2e", "ampere"),
        _gpu("H100-SXM5-80GB", 81559, 989, 3350, 900, _H100, "hopper", 1979),
        _gpu("H200-SXM-141GB", 143771, 989, 4800, 900, _H200, "hopper", 1979),
        _gpu("B200-SXM-180GB", 183359, 2250, 8000, 1800, _B200, "blackwell", 4500, 9000),
        _gpu("GB200-NVL72-186GB", 189471, 2500, 8000, 1800, _GB200, "blackwell", 5000, 10000),
        _gpu("MI300X-OAM-192GB", 196288, 1307.4, 5300, 896, _MI300X, "cdna3", 2614.9),
        _gpu("H800-SXM5-80GB", 81559, 989, 3350, 400, _H800, "hopper", 1979),
        _gpu("H20-96GB", 97871, 148, 4000, 900, _H20, "hopper", 296),
        _gpu("GH200-96GB", 97871, 989, 4000, 900, _GH200, "hopper", 1979),
        _gpu("GH200-144GB", 146831, 989, 4900, 900, _GH200, "hopper", 1979),
        _gpu("B300-SXM-288GB", 275040, 2250, 8000, 1800, _B300, "blackwell", 4500, 13500),
        _gpu("GB300-NVL72-288GB", 284208, 2500, 8000, 1800, _GB300, "blackwell", 5000, 15000),
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
    "h800": "H800-SXM5-80GB",
    "h800-80gb": "H800-SXM5-80GB",
    "h20": "H20-96GB",
    "gh200": "GH200-96GB",
    "gh200-144gb": "GH200-144GB",
    "b300": "B300-SXM-288GB",
    "b300-288gb": "B300-SXM-288GB",
    "gb300": "GB300-NVL72-288GB",
    "gb300-288gb": "GB300-NVL72-288GB",
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
