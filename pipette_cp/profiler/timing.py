"""Time a forward and a backward pass: warm-up, repetitions, medians, peak memory.

On a GPU the passes are bracketed by CUDA events (``torch.cuda.Event(
enable_timing=True)``), which time the device's work and not the host's
launch loop, and every event is read after one ``torch.cuda.synchronize()``
at the end, so the host runs ahead as in training.  Peak memory is
``torch.cuda.max_memory_allocated()`` after ``reset_peak_memory_stats()``.  On
the CPU, kernels run synchronously and ``time.perf_counter_ns`` brackets them;
peak memory is not measured (None).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch

T = TypeVar("T")


class Timer(Protocol):
    """Marks points in a device's stream of work and reads the time between them."""

    def mark(self) -> Any:
        """A point in time, read later by :meth:`seconds`."""

    def wait(self) -> None:
        """Block until all work marked so far has run."""

    def seconds(self, start: Any, end: Any) -> float:
        """Time between two marks, s (after :meth:`wait`)."""

    def reset_peak_memory(self) -> None:
        """Start a new peak-memory window."""

    def peak_memory_bytes(self) -> int | None:
        """Peak allocated memory since :meth:`reset_peak_memory`, or None."""


class CpuTimer:
    """Host clock; CPU kernels are synchronous."""

    def mark(self) -> int:
        return time.perf_counter_ns()

    def wait(self) -> None:
        return None

    def seconds(self, start: int, end: int) -> float:
        return (end - start) / 1e9

    def reset_peak_memory(self) -> None:
        return None

    def peak_memory_bytes(self) -> int | None:
        return None


class CudaTimer:
    """CUDA events on the current stream of ``device``."""

    def __init__(self, device: torch.device | str = "cuda") -> None:
        self.device = torch.device(device)

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def wait(self) -> None:
        torch.cuda.synchronize(self.device)

    def seconds(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        return float(start.elapsed_time(end)) / 1e3  # elapsed_time is in ms

    def reset_peak_memory(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak_memory_bytes(self) -> int | None:
        return int(torch.cuda.max_memory_allocated(self.device))


def timer_for(device: torch.device | str) -> Timer:
    """The timer of a device type (``cuda`` or ``cpu``)."""
    return CudaTimer(device) if torch.device(device).type == "cuda" else CpuTimer()


@dataclass(frozen=True)
class Measurement:
    """Median pass times over ``repetitions`` runs, and the peak memory."""

    forward_s: float
    backward_s: float
    peak_memory_bytes: int | None
    repetitions: int


def measure(
    forward: Callable[[], T],
    backward: Callable[[T], None],
    timer: Timer,
    *,
    warmup: int = 3,
    reps: int = 10,
) -> Measurement:
    """Run ``warmup`` untimed forward + backward passes, then time ``reps`` of each.

    ``forward()`` returns what ``backward`` consumes.  The medians are reported
    (robust to the odd slow repetition); the peak memory covers the timed runs.
    """
    if reps < 1 or warmup < 0:
        raise ValueError(f"need reps >= 1 and warmup >= 0, got reps={reps}, warmup={warmup}")
    for _ in range(warmup):
        backward(forward())
    timer.wait()
    timer.reset_peak_memory()
    marks = []
    for _ in range(reps):
        start = timer.mark()
        out = forward()
        middle = timer.mark()
        backward(out)
        del out
        marks.append((start, middle, timer.mark()))
    timer.wait()
    fwd = [timer.seconds(a, b) for a, b, _ in marks]
    bwd = [timer.seconds(b, c) for _, b, c in marks]
    return Measurement(
        statistics.median(fwd), statistics.median(bwd), timer.peak_memory_bytes(), reps
    )
