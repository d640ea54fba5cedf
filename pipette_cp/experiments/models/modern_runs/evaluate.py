"""Every row of ``modern_runs.csv`` predicted, or skipped with its reasons."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.errors import LayoutError, SpecError
from pipette_cp.experiments.models.calibration_split import (
    assign_modern_split,
    modern_source,
    modern_sweep_key,
)
from pipette_cp.experiments.models.modern_runs.build import row_setup
from pipette_cp.experiments.models.modern_runs.features import (
    MODERN_CSV,
    Skip,
    blockers,
    gpu_family,
    is_moe,
    kind,
    model_key,
    precision_label,
    read_modern_rows,
)
from pipette_cp.units import GiB


@dataclass(frozen=True)
class RowInfo:
    """What the report groups a row by (every row, representable or not)."""

    row_id: str
    source: str
    round: str
    side: str
    sweep: str
    model: str
    gpu_type: str
    gpu_family: str
    precision: str
    moe: bool
    kind: str
    num_gpus: int
    duplicate: bool
    #: the row's degrees, micro-batch, global batch and sequence, as stated
    setting: str

    @property
    def expert(self) -> str:
        """``MoE`` or ``dense``."""
        return "MoE" if self.moe else "dense"


@dataclass(frozen=True)
class ModernResult:
    """One row predicted: step time (s) and tokens/s/GPU, measured and predicted; whether
    it is predicted to fit, its largest memory bound over the usable memory, predicted
    peak and logged memory (GiB, ``nan`` where not logged), and what is approximated."""

    info: RowInfo
    layout: str
    measured_step_s: float
    predicted_step_s: float
    measured_tokens_per_gpu: float
    fits: bool
    bound_over_usable: float
    predicted_mem_gib: float
    measured_mem_gib: float
    approximations: tuple[str, ...]

    @property
    def ratio(self) -> float:
        """Predicted / measured throughput (= measured / predicted step time)."""
        return self.measured_step_s / self.predicted_step_s

    @property
    def predicted_tokens_per_gpu(self) -> float:
        """Predicted tokens/s/GPU."""
        return self.measured_tokens_per_gpu * self.ratio


@dataclass(frozen=True)
class ModernSkipped:
    """A row the models cannot express: the first reason, and all of them."""

    info: RowInfo
    reason: str
    reasons: tuple[str, ...]


def row_info(row: dict[str, str], side: str) -> RowInfo:
    """The grouping columns of a row."""
    return RowInfo(
        row["row_id"], modern_source(row), row["round"], side, modern_sweep_key(row),
        model_key(row), row["gpu_type"], gpu_family(row), precision_label(row), is_moe(row),
        kind(row), int(row["num_gpus"]), bool(row["duplicate_of"].strip()), stated_layout(row),
    )  # fmt: skip


def stated_layout(row: dict[str, str]) -> str:
    """The row's layout columns as one label (``tp4-pp8-cp1-vp8-ep1-fsdp-mb1-gbs2688-s2048``;
    an empty cell as ``-``)."""
    cells = {c: row[c].strip() or "-" for c in ("tp", "pp", "cp", "vp", "ep", "fsdp",
                                                  "micro_batch", "global_batch", "seq_len")}  # fmt: skip
    return (f"tp{cells['tp']}-pp{cells['pp']}-cp{cells['cp']}-vp{cells['vp']}-ep{cells['ep']}"
            f"-fsdp{cells['fsdp']}-mb{cells['micro_batch']}-gbs{cells['global_batch']}"
            f"-s{cells['seq_len']}")  # fmt: skip


def evaluate_row(row: dict[str, str], side: str) -> ModernResult | ModernSkipped:
    """One row predicted with the :class:`~pipette_cp.cost.evaluator.evaluate.Evaluator`."""
    info = row_info(row, side)
    try:
        st = row_setup(row)
    except Skip as reason:
        return ModernSkipped(info, str(reason), tuple(blockers(row)) or (str(reason),))
    try:
        ev = Evaluator(st.instance).evaluate(st.plan)
    except (LayoutError, SpecError) as refused:  # a knob's rule: the row states a setting
        why = f"layout not expressible: {str(refused).splitlines()[0][:120]}"
        return ModernSkipped(info, why, (why,))
    bound = max(ev.memory_bound_bytes_by_stage or ev.memory_bytes_by_stage)
    return ModernResult(
        info, st.plan.layout(), st.measured_step_s, ev.iteration_time_s,
        st.measured_tokens_per_gpu, ev.fits, bound / ev.memory_limit_bytes,
        ev.memory_bytes_max / GiB, st.measured_mem_gib, st.approximations,
    )  # fmt: skip


def run(
    path: Path = MODERN_CSV, row_ids: Collection[str] | None = None
) -> tuple[list[ModernResult], list[ModernSkipped]]:
    """Every row of ``path`` (or those of ``row_ids``) predicted or skipped; the split is
    that of the whole file."""
    rows = read_modern_rows(path)
    results: list[ModernResult] = []
    skipped: list[ModernSkipped] = []
    for row, side in zip(rows, assign_modern_split(rows), strict=True):
        if row_ids is not None and row["row_id"] not in row_ids:
            continue
        out = evaluate_row(row, side)
        (skipped if isinstance(out, ModernSkipped) else results).append(out)  # type: ignore[arg-type]
    return results, skipped
