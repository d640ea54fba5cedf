"""The sweep: one measured entry per (tp, micro-batch, recompute, FlashAttention).

Each entry is the median forward and backward time of one layer's tp-rank shard
(:mod:`pipette_cp.profiler.layer`) for one micro-batch, on one device, without
the tensor-parallel collectives (``includes_tp_comm: false``: the cost model
adds them).  The backward is timed on its own: run the forward, then
``out.backward(grad)`` with a fixed random output gradient; the input needs a
gradient too (a pipeline stage sends it on) and the weight gradients accumulate
across repetitions as over the micro-batches of an iteration.
"""

from __future__ import annotations

import datetime
import platform
from collections.abc import Callable
from dataclasses import dataclass
from itertools import product
from typing import Literal

import torch

from pipette_cp.errors import SpecError
from pipette_cp.profiler.layer import RankLayer, build_layer, shard_problem
from pipette_cp.profiler.timing import Measurement, measure, timer_for
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.profile import LayerProfile, LayerProfileEntry
from pipette_cp.specs.training import Recompute

Device = Literal["cpu", "cuda"]
Dtype = Literal["bf16", "fp32"]
DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass(frozen=True)
class ProfileRequest:
    """What to measure (the command line's options)."""

    model: ModelSpec
    seq_length: int
    tp: tuple[int, ...] = (1,)
    micro_batch_size: tuple[int, ...] = (1,)
    recompute: tuple[Recompute, ...] = ("none",)
    flash_attention: tuple[bool, ...] = (True,)
    device: Device = "cpu"
    dtype: Dtype = "bf16"
    warmup: int = 3
    reps: int = 10
    dropout: float = 0.0
    seed: int = 0
    threads: int | None = None  # CPU threads (torch.set_num_threads); None = torch's default

    def check(self) -> None:
        """Raise :class:`SpecError` for a value that cannot be measured."""
        self.model.require_dense()
        for name, values in (("tp", self.tp), ("micro_batch_size", self.micro_batch_size)):
            if not values or min(values) < 1:
                raise SpecError(name, values, "expected one or more positive integers")
        for name, value, low in (("seq_length", self.seq_length, 1), ("reps", self.reps, 1),
                                 ("warmup", self.warmup, 0)):  # fmt: skip
            if value < low:
                raise SpecError(name, value, f"must be at least {low}")
        if self.threads is not None and self.threads < 1:
            raise SpecError("threads", self.threads, "must be at least 1")
        if not 0.0 <= self.dropout < 1.0:
            raise SpecError("dropout", self.dropout, "must be in [0, 1)")
        if self.dtype not in DTYPES:
            raise SpecError("dtype", self.dtype, f"expected one of {sorted(DTYPES)}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise SpecError(
                "device",
                self.device,
                f"torch.cuda.is_available() is False (torch {torch.__version__}, "
                f"CUDA build {torch.version.cuda}); use --device cpu",
            )
        if self.device not in ("cpu", "cuda"):
            raise SpecError("device", self.device, "expected 'cpu' or 'cuda'")


@dataclass(frozen=True)
class ProfileResult:
    """The profile and what was left out of it, and why."""

    profile: LayerProfile
    notes: tuple[str, ...]


def device_name(device: Device) -> str:
    """``torch.cuda.get_device_name()`` on a GPU, ``"cpu"`` otherwise."""
    return torch.cuda.get_device_name() if device == "cuda" else "cpu"


def describe(request: ProfileRequest) -> str:
    """The profile's description: what, how, with which software, when."""
    where = device_name(request.device)
    if request.device == "cpu":
        where += (
            f" ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
        )
    return (
        f"pipette-cp profile: one {request.model.name} layer, the shard of one tp rank, "
        f"compute only (no TP collectives); {request.dtype}, dropout {request.dropout}, "
        f"median of {request.reps} reps after {request.warmup} warm-up; device {where}; "
        f"torch {torch.__version__}, CUDA {torch.version.cuda}; "
        f"{datetime.datetime.now(datetime.UTC).date().isoformat()}"
    )


def measure_layer(
    layer: RankLayer,
    micro_batch_size: int,
    seq_length: int,
    *,
    warmup: int,
    reps: int,
) -> Measurement:
    """Median forward and backward time of ``layer`` on one random micro-batch."""
    param = next(layer.parameters())
    shape = (micro_batch_size, seq_length, layer.shape.hidden)
    x = torch.randn(shape, device=param.device, dtype=param.dtype, requires_grad=True)
    grad = torch.randn(shape, device=param.device, dtype=param.dtype)

    def forward() -> torch.Tensor:
        x.grad = None
        return layer.step(x)

    def backward(out: torch.Tensor) -> None:
        out.backward(grad)

    return measure(forward, backward, timer_for(param.device), warmup=warmup, reps=reps)


def _out_of_memory() -> type[BaseException]:
    return getattr(torch.cuda, "OutOfMemoryError", RuntimeError)


def profile_layer(
    request: ProfileRequest, on_entry: Callable[[LayerProfileEntry], None] | None = None
) -> ProfileResult:
    """Measure every combination of ``request`` (``on_entry`` is told of each entry).

    Raises
    ------
    SpecError
        A bad request (:meth:`ProfileRequest.check`), or no combination could be
        measured (every tp leaves a remainder, every run ran out of memory).
    """
    request.check()
    if request.threads is not None:
        torch.set_num_threads(request.threads)
    entries: list[LayerProfileEntry] = []
    notes: list[str] = []
    for tp in sorted(set(request.tp)):
        if (problem := shard_problem(request.model, tp)) is not None:
            notes.append(f"tp={tp} skipped: {problem}")
            continue
        layer = build_layer(
            request.model, tp, device=request.device, dtype=DTYPES[request.dtype],
            dropout=request.dropout, seed=request.seed,
        )  # fmt: skip
        combos = product(
            sorted(set(request.micro_batch_size)), request.recompute, request.flash_attention
        )
        for mb, recompute, flash in combos:
            layer.recompute, layer.flash = recompute, flash
            m: Measurement | None
            try:
                m = measure_layer(
                    layer, mb, request.seq_length, warmup=request.warmup, reps=request.reps
                )
            except _out_of_memory():  # a GPU too small for this micro-batch
                if request.device != "cuda":
                    raise
                m = None
            if m is None:  # outside the handler, so its traceback's tensors are freed
                notes.append(f"tp={tp} mb={mb} recompute={recompute} skipped: out of memory")
                torch.cuda.empty_cache()
                continue
            entry = LayerProfileEntry(
                tp=tp, micro_batch_size=mb, recompute=recompute, flash_attention=flash,
                forward_s=max(m.forward_s, 1e-9), backward_s=max(m.backward_s, 1e-9),
                peak_memory_bytes=m.peak_memory_bytes, repetitions=m.repetitions,
            )  # fmt: skip
            entries.append(entry)
            if on_entry is not None:
                on_entry(entry)
        del layer
        if request.device == "cuda":
            torch.cuda.empty_cache()
    if not entries:
        raise SpecError("tp", request.tp, "nothing could be measured: " + "; ".join(notes))
    profile = LayerProfile(
        description=describe(request),
        gpu=device_name(request.device),
        model=request.model.name,
        device=request.device,
        seq_length=request.seq_length,
        includes_tp_comm=False,
        entries=tuple(entries),
    )
    return ProfileResult(profile, tuple(notes))
