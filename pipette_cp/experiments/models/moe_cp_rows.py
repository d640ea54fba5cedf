"""One MoE / context-parallel calibration row's result, and a row that was not predicted
(:mod:`pipette_cp.experiments.models.moe_cp_accuracy` makes them,
:mod:`pipette_cp.experiments.models.torchtitan_rows` reports the torchtitan ones)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RowResult:
    """One row: measured and predicted step time (s) and peak memory (GiB); ``attention``:
    the share of the predicted time the fused attention adds when it runs at half speed
    (its share of the step)."""

    index: int
    family: str
    gpu: str
    side: str
    moe: bool
    cp: int
    fp8: bool
    name: str
    layout: str
    measured_from: str
    measured_s: float
    predicted_s: float
    fits: bool
    shares: tuple[float, ...]
    attention: float
    measured_mem_gib: float
    predicted_mem_gib: float

    @property
    def error(self) -> float:
        """(predicted - measured) / measured step time."""
        return self.predicted_s / self.measured_s - 1.0

    @property
    def groups(self) -> tuple[str, ...]:
        """``MoE`` and / or ``CP``."""
        return (("MoE",) if self.moe else ()) + (("CP",) if self.cp > 1 else ())


@dataclass(frozen=True)
class Skipped:
    """A row the models cannot express, and why."""

    index: int
    family: str
    name: str
    reason: str
