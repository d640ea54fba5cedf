"""The report's numbers, computed on the results of :func:`.evaluate.run` (duplicate rows,
the same runs as another row, are left out of every metric)."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from pipette_cp.experiments.models.modern_runs.evaluate import (
    ModernResult,
    ModernSkipped,
    RowInfo,
)
from pipette_cp.experiments.models.modern_runs.features import PRECISIONS

#: The report's groupings: title and a row's label.
GROUPINGS: dict[str, Callable[[RowInfo], str]] = {
    "GPU family": lambda i: i.gpu_family,
    "precision": lambda i: i.precision,
    "experts": lambda i: i.expert,
    "kind": lambda i: i.kind,
    "source": lambda i: i.source,
}


def counted(results: Iterable[ModernResult]) -> list[ModernResult]:
    """The results the metrics count: duplicates of another row's runs left out."""
    return [r for r in results if not r.info.duplicate]


@dataclass(frozen=True)
class Cell:
    """Rows of one group and side: all, representable (predicted), skipped; throughput
    MAPE and median predicted / measured throughput of the predicted ones."""

    rows: int
    predicted: int
    mape: float
    median_ratio: float
    worst: float


def cell(results: Sequence[ModernResult], skipped: int = 0) -> Cell:
    """The :class:`Cell` of ``results`` (``skipped``: rows of the group not predicted)."""
    ratios = np.array([r.ratio for r in results])
    if not len(ratios):
        return Cell(skipped, 0, math.nan, math.nan, math.nan)
    errors = np.abs(ratios - 1.0)
    return Cell(len(ratios) + skipped, len(ratios), float(errors.mean()),
                float(np.median(ratios)), float(errors.max()))  # fmt: skip


def cells(
    results: Sequence[ModernResult], skipped: Sequence[ModernSkipped], label: Callable
) -> dict[tuple[str, str], Cell]:
    """One :class:`Cell` per (label, side)."""
    groups: dict[tuple[str, str], list[ModernResult]] = defaultdict(list)
    skips: Counter[tuple[str, str]] = Counter()
    for r in counted(results):
        groups[(label(r.info), r.info.side)].append(r)
    for s in skipped:
        if not s.info.duplicate:
            skips[(label(s.info), s.info.side)] += 1
    keys = sorted(set(groups) | set(skips))
    return {k: cell(groups.get(k, []), skips[k]) for k in keys}


# ------------------------------------------------------------------ coverage
def reasons(skipped: Iterable[ModernSkipped]) -> Counter[str]:
    """Skipped rows per first reason (the field and feature)."""
    return Counter(s.reason for s in skipped)


def sole_blockers(skipped: Iterable[ModernSkipped]) -> Counter[str]:
    """Rows whose only reason is this one (they become representable once it is lifted),
    per reason with the row's field value (``gpu_type=GB300: ...``)."""
    return Counter(s.reasons[0] for s in skipped if len(s.reasons) == 1)


# ------------------------------------------------------------------- memory
@dataclass(frozen=True)
class MemoryFit:
    """Runs that ran, predicted not to fit: count and the memory bound over the usable
    memory (median and largest over every predicted run)."""

    rows: int
    not_fit: int
    median_bound: float
    max_bound: float


def memory_fit(results: Sequence[ModernResult]) -> MemoryFit:
    """The :class:`MemoryFit` of ``results`` (every one of them ran)."""
    bounds = [r.bound_over_usable for r in results]
    if not bounds:
        return MemoryFit(0, 0, math.nan, math.nan)
    return MemoryFit(len(bounds), sum(not r.fits for r in results),
                     float(np.median(bounds)), float(max(bounds)))  # fmt: skip


# -------------------------------------------------------------------- pairs
@dataclass(frozen=True)
class Pair:
    """Two runs of one source release, model, GPU count and layout in two precisions:
    speed-up of ``to`` over ``base``, measured and predicted."""

    base: ModernResult
    to: ModernResult

    @property
    def transition(self) -> str:
        """``bf16 -> mxfp8`` and the like."""
        return f"{self.base.info.precision} -> {self.to.info.precision}"

    @property
    def measured(self) -> float:
        """Measured speed-up (tokens/s/GPU of ``to`` over ``base``)."""
        return self.to.measured_tokens_per_gpu / self.base.measured_tokens_per_gpu

    @property
    def predicted(self) -> float:
        """Predicted speed-up."""
        return self.to.predicted_tokens_per_gpu / self.base.predicted_tokens_per_gpu

    @property
    def ratio(self) -> float:
        """Predicted over measured speed-up."""
        return self.predicted / self.measured


#: Precision order of a pair (the base is the earlier one).
_ORDER = PRECISIONS


def _setting(i: RowInfo) -> tuple:
    return (i.source, i.round, i.model, i.gpu_type, i.num_gpus, i.setting)


def pairs(
    results: Sequence[ModernResult], skipped: Sequence[ModernSkipped] = ()
) -> tuple[list[Pair], Counter[str]]:
    """Every matched pair (same source release, model, GPU type and count, stated layout;
    different precision) with both rows predicted, and per transition the matched pairs
    that cannot be scored (a row skipped)."""
    groups: dict[tuple, list[ModernResult | ModernSkipped]] = defaultdict(list)
    every: list[ModernResult | ModernSkipped] = [*counted(results), *skipped]
    for r in every:
        if not r.info.duplicate:
            groups[_setting(r.info)].append(r)
    scored: list[Pair] = []
    unscored: Counter[str] = Counter()
    for group in groups.values():
        ranked = sorted(group, key=lambda r: (_ORDER.index(r.info.precision), r.info.row_id))
        for i, a in enumerate(ranked):
            for b in ranked[i + 1 :]:
                if b.info.precision == a.info.precision:
                    continue
                if isinstance(a, ModernResult) and isinstance(b, ModernResult):
                    scored.append(Pair(a, b))
                else:
                    unscored[f"{a.info.precision} -> {b.info.precision}"] += 1
    return scored, unscored


# --------------------------------------------------------------- best layout
@dataclass(frozen=True)
class Group:
    """Runs of one model on one GPU type and count (one source) in at least two layouts
    or precisions: the measured best and the predicted best configuration."""

    key: tuple[str, str, str, int]
    side: str
    configs: int
    measured_best: str
    predicted_best: str

    @property
    def agrees(self) -> bool:
        """Whether the predicted best is the measured best."""
        return self.measured_best == self.predicted_best


def best_layout_groups(results: Sequence[ModernResult]) -> list[Group]:
    """Per (source, model, GPU type, GPU count): each configuration (layout and precision)
    scored by its best measured tokens/s/GPU over the releases, and by its prediction."""
    groups: dict[tuple, dict[str, list[ModernResult]]] = defaultdict(lambda: defaultdict(list))
    for r in counted(results):
        i = r.info
        groups[(i.source, i.model, i.gpu_type, i.num_gpus)][f"{r.layout} {i.precision}"].append(r)
    out = []
    for key, configs in sorted(groups.items()):
        if len(configs) < 2:
            continue
        measured = max(configs, key=lambda c: max(r.measured_tokens_per_gpu for r in configs[c]))
        predicted = max(configs, key=lambda c: configs[c][0].predicted_tokens_per_gpu)
        side = next(iter(configs.values()))[0].info.side
        out.append(Group(key, side, len(configs), measured, predicted))
    return out


# ------------------------------------------------------------- logged memory
def logged_memory(results: Sequence[ModernResult]) -> list[ModernResult]:
    """The predicted rows with a logged ``measured_mem``."""
    return [r for r in counted(results) if math.isfinite(r.measured_mem_gib)]
