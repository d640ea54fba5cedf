"""The published-run CSVs, their fit / held-out split and the baseline measurement."""

from __future__ import annotations

import csv
import math

import pytest

from pipette_cp.experiments.accuracy import CALIBRATION_CSV, read_rows
from pipette_cp.experiments.calibration_split import FIT, HELD_OUT, assign_split, family
from pipette_cp.experiments.published_runs import MORE_CSV, format_baseline, run_baseline, summaries

MOE_CP_CSV = MORE_CSV.with_name("published_runs_moe_cp.csv")


@pytest.mark.parametrize(
    ("path", "count"), [(MORE_CSV, 490), (MOE_CP_CSV, 60), (CALIBRATION_CSV, 27)]
)
def test_csvs_load_with_the_same_columns(path, count):
    rows = read_rows(path)
    assert len(rows) == count
    assert list(rows[0]) == list(read_rows(CALIBRATION_CSV)[0])


@pytest.mark.parametrize("path", [MORE_CSV, MOE_CP_CSV])
def test_split_is_deterministic_and_covers_every_family(path):
    rows = read_rows(path)
    sides = assign_split(rows)
    assert sides == assign_split(list(reversed(rows)))[::-1]
    assert set(sides) <= {FIT, HELD_OUT}
    for fam in {family(r) for r in rows}:
        fam_sides = [s for r, s in zip(rows, sides, strict=True) if family(r) == fam]
        assert FIT in fam_sides and HELD_OUT in fam_sides, fam
    share = sides.count(HELD_OUT) / len(sides)
    assert 0.2 <= share <= 0.4


def test_calibration_rows_are_all_fit():
    rows = read_rows(CALIBRATION_CSV)
    assert assign_split(rows, calibration=True) == [FIT] * len(rows)


def test_baseline_on_a_few_rows_is_finite(tmp_path):
    rows = read_rows(MORE_CSV)
    ran = [r for r in rows if "step_time_s" in r["notes"] or r["measured_tflops_per_gpu"]]
    oom = [r for r in rows if "OOM" in r["notes"]]
    fsdp = [r for r in rows if "FSDP" in r["distributed_optimizer_or_zero"]]
    few = ran[:4] + ran[-4:] + oom[:2] + fsdp[:1]
    path = tmp_path / "few.csv"
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(few)
    baseline = run_baseline(path)
    assert len(baseline.results) == 10 and sum(baseline.skipped.values()) == 1
    measured = [r for r in baseline.results if not r.oom]
    assert measured and all(math.isfinite(r.ratio) and r.ratio > 0 for r in measured)
    for summary in summaries(baseline).values():
        if summary.ran:
            assert math.isfinite(summary.mape) and math.isfinite(summary.median_ratio)
    assert "FSDP" in format_baseline(baseline)
