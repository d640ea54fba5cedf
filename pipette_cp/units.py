"""Unit constants.  Everything inside the package is SI (bytes, seconds, FLOP/s).

Decimal prefixes follow the vendors and nccl-tests (GB/s = 1e9 bytes/s);
binary ones are spelled out (GiB = 2**30 bytes).
"""

from __future__ import annotations

KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12
KiB = 2**10
MiB = 2**20
GiB = 2**30

TFLOPS = 1e12
PFLOPS = 1e15

US = 1e-6
MS = 1e-3

#: Bytes of one element of the tensors the layers exchange (activations between stages,
#: gathered weights) under each training precision: fp8 and fp4 training keep them bf16,
#: FP8 and NVFP4 exist only inside the GEMMs (Megatron without --fp8-param-gather).
BYTES_PER_ELEMENT = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 2, "fp4": 2}
#: Bytes of one FP8 element (E4M3 or E5M2).
FP8_BYTES = 1
