"""The MoE / context-parallel accuracy experiment: every row built or skipped with a reason."""

from __future__ import annotations

import math
import re

import pytest

from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.experiments.models.accuracy import read_rows
from pipette_cp.experiments.models.calibration_split import FIT, HELD_OUT
from pipette_cp.experiments.models.moe_cp_accuracy import flop_check_rows, mape, run
from pipette_cp.experiments.models.moe_cp_rows import RowResult, Skipped
from pipette_cp.experiments.models.moe_cp_setup import (
    MOE_CP_CSV,
    Skip,
    dropless_pairs,
    is_fp8_row,
    moe_cp_setup,
    pair_rows,
    selected_rows,
    with_training,
)
from pipette_cp.specs.training import FrameworkProfile


@pytest.fixture(scope="module")
def report() -> tuple[list[RowResult], list[Skipped]]:
    return run()


def _csv_moe_cp_rows() -> list[int]:
    """The MoE and cp > 1 rows counted straight from the CSV's notes."""
    out = []
    for i, row in enumerate(read_rows(MOE_CP_CSV)):
        kind = re.search(r"kind=([^;]*)", row["notes"])
        cp = re.search(r"\bcp=(\d+)", row["notes"])
        if (kind and kind.group(1).strip().startswith("moe")) or (cp and int(cp.group(1)) > 1):
            out.append(i)
    return out


def test_every_row_builds_a_plan_the_evaluator_accepts_or_is_skipped_with_a_reason() -> None:
    for _, row, side in selected_rows():
        assert side in (FIT, HELD_OUT)
        try:
            setup = moe_cp_setup(row)
        except Skip as reason:
            assert str(reason).strip(), row["model_name"]
            continue
        evaluation = Evaluator(setup.instance).evaluate(setup.plan)  # validates the plan
        assert math.isfinite(evaluation.iteration_time_s) and evaluation.iteration_time_s > 0
        assert isinstance(evaluation.fits, bool)
        assert math.isfinite(setup.measured_step_s) and setup.measured_step_s > 0
        assert setup.plan.cp == int(re.search(r"\bcp=(\d+)", row["notes"]).group(1))  # type: ignore[union-attr]


def test_rows_add_up_to_the_csv_moe_and_cp_rows(
    report: tuple[list[RowResult], list[Skipped]],
) -> None:
    results, skipped = report
    expected = _csv_moe_cp_rows()
    got = sorted([r.index for r in results] + [s.index for s in skipped])
    assert got == expected
    assert any(r.moe for r in results) and any(r.cp > 1 for r in results)
    assert all(s.reason for s in skipped)


def test_the_megatron_fsdp_moe_row_is_skipped_with_its_reason(
    report: tuple[list[RowResult], list[Skipped]],
) -> None:

    _, skipped = report
    assert any("FSDP" in s.reason for s in skipped)


def test_mape_on_a_hand_example() -> None:
    assert mape([110.0, 90.0, 100.0], [100.0, 100.0, 100.0]) == pytest.approx(0.2 / 3)
    assert mape([2.0], [4.0]) == pytest.approx(0.5)
    assert mape([3.0, 1.0], [2.0, 2.0]) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        mape([], [])
    with pytest.raises(ValueError):
        mape([1.0], [1.0, 2.0])


def test_mcore_flop_formula_reproduces_the_printed_tflops() -> None:
    """Megatron-MoE-ModelZoo rows printing both step time and TFLOP/s: the formula that
    turns TFLOP/s into step times elsewhere agrees with them (a unit check)."""
    checked = 0
    for _, printed, implied, _ in flop_check_rows():
        assert implied == pytest.approx(printed, rel=0.01)
        checked += 1
    assert checked >= 3


def test_dropless_pairs_slow_down_with_the_imbalance() -> None:
    rows = pair_rows()
    assert rows
    balanced = dropless_pairs(1.0, rows)
    skewed = dropless_pairs(1.5, rows)
    for b, s in zip(balanced, skewed, strict=True):
        assert b.predicted_ratio == pytest.approx(1.0)
        assert s.predicted_ratio > 1.0 and b.measured_ratio > 1.0


def test_fit_shortcut_matches_the_setup_parameter() -> None:
    """The fit varies the Grok-1 FP8 efficiency on a copy of the training; the same as
    rebuilding the row with it."""
    row = next(r for _, r, _ in selected_rows() if "Grok" in r["model_name"] and is_fp8_row(r))
    rebuilt = moe_cp_setup(row, fp8_moe_efficiency=0.8)
    base = moe_cp_setup(row)
    framework = FrameworkProfile(name="nemo", compute_efficiency=0.8)
    copy = with_training(base.instance, framework=framework)
    assert Evaluator(copy).iteration_time(base.plan) == pytest.approx(
        Evaluator(rebuilt.instance).iteration_time(rebuilt.plan)
    )
