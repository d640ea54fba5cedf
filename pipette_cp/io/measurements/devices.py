"""The catalogue GPU of a device name as nccl-tests prints it in its ``# Rank`` lines."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from pipette_cp.errors import SpecError
from pipette_cp.specs.gpu import GpuSpec, resolve_gpu


def gpu_from_device_name(devices: Sequence[str]) -> GpuSpec:
    """The catalogue GPU of the most common nccl-tests device name
    (``NVIDIA H100 80GB HBM3`` -> H100-SXM5-80GB, ``NVIDIA GB200`` -> GB200-NVL72-186GB,
    ``NVIDIA GH200 480GB`` -> GH200-96GB, ``NVIDIA GH200 144G HBM3e`` -> GH200-144GB,
    ``AMD Instinct MI300X`` -> MI300X-OAM-192GB).  PCIe cards and unknown models
    raise :class:`SpecError`: pass the GPU explicitly then."""
    if not devices:
        raise SpecError("gpu", None, "the logs name no device; pass the GPU type explicitly")
    name = Counter(devices).most_common(1)[0][0]
    model = re.search(
        r"\b(G[BH]\d{3}|MI\d{3}X?|[VAHB]\d{2,3})\b", name.replace("-", " "), re.IGNORECASE
    )
    memory = re.search(r"(\d+)\s*GB", name, re.IGNORECASE)
    if model is None or "pcie" in name.lower():
        raise SpecError(
            "gpu", name, "cannot map this device to a catalogue GPU; pass it explicitly"
        )
    key = model.group(1).lower()
    if key == "gh200":  # the name gives the superchip's CPU memory (480GB): HBM by type
        return resolve_gpu("gh200-144gb" if "144" in name or "HBM3E" in name.upper() else "gh200")
    return resolve_gpu(f"{key}-{memory.group(1)}gb" if memory else key)
