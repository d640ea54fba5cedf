"""The published-run CSVs, their fit / held-out split and the baseline measurement."""

from __future__ import annotations

import csv
import math

import pytest

from pipette_cp.experiments.models.accuracy import CALIBRATION_CSV, read_rows
from pipette_cp.experiments.models.calibration_split import FIT, HELD_OUT, assign_split, family
from pipette_cp.experiments.models.published_runs import (
    MORE_CSV,
    RunResult,
    format_baseline,
    run_baseline,
    summaries,
)
from pipette_cp.experiments.models.published_runs_report import (
    CSV_COLUMNS,
    format_report,
    memory_stats,
    pick_score,
    picks,
    write_csv,
    write_plot,
)

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


def _baseline_of(few, columns, tmp_path):
    """:func:`run_baseline` of the rows ``few``, written to a CSV of ``columns``."""
    path = tmp_path / "few.csv"
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(few)
    return run_baseline(path)


def test_baseline_on_a_few_rows_is_finite(tmp_path):
    rows = read_rows(MORE_CSV)
    ran = [r for r in rows if "step_time_s" in r["notes"] or r["measured_tflops_per_gpu"]]
    oom = [r for r in rows if "OOM" in r["notes"]]
    fsdp = [r for r in rows if "FSDP" in r["distributed_optimizer_or_zero"]]
    cp = [
        r
        for r in rows
        if "context_parallel" in r["notes"] and "context_parallel=1" not in r["notes"]
    ]
    few = ran[:4] + ran[-4:] + oom[:2] + fsdp[:1] + cp[:1]
    baseline = _baseline_of(few, list(rows[0]), tmp_path)
    # the FSDP row is modelled (ZeRO-3), the context-parallel one is not
    assert len(baseline.results) == 11 and sum(baseline.skipped.values()) == 1
    measured = [r for r in baseline.results if not r.oom]
    assert measured and all(math.isfinite(r.ratio) and r.ratio > 0 for r in measured)
    for summary in summaries(baseline).values():
        if summary.ran:
            assert math.isfinite(summary.mape) and math.isfinite(summary.median_ratio)
    assert "context parallelism" in format_baseline(baseline)


def _run(layout, predicted, measured, *, fits=True, oom=False, per_gpu=1.0, mem=math.nan):
    return RunResult(
        "hagemann", "hagemann|sheet|kernel", FIT, oom, fits, math.nan if oom else measured,
        predicted, layout=layout, per_gpu=per_gpu, predicted_mem_gib=40.0, limit_gib=78.4,
        measured_mem_gib=mem,
    )  # fmt: skip


def test_pick_is_zero_when_the_predicted_best_ran_out_of_memory():
    sweep = [
        _run("a", 3.0, math.nan, oom=True),  # predicted fastest and to fit, but OOMed
        _run("b", 2.0, 1.0),
        _run("c", 1.0, 0.5),
        _run("d", 9.0, math.nan, fits=False, oom=True),  # predicted not to fit: no candidate
    ]
    score, pick, best = pick_score(sweep)
    assert score == 0.0 and pick is not None and pick.layout == "a"
    assert best is not None and best.layout == "b"


def test_pick_is_one_when_the_prediction_ranks_right():
    sweep = [
        _run("a", 1.0, 0.5),
        _run("b", 2.5, 1.0),
        _run("c", 9.0, math.nan, fits=False, oom=True),
    ]
    assert pick_score(sweep)[0] == 1.0
    # a wrong ranking scores measured(pick) / measured(best)
    assert pick_score([_run("a", 3.0, 0.5), _run("b", 2.0, 1.0)])[0] == 0.5
    # per-GPU throughput ranks a weak-scaling sweep (half the step rate on twice the tokens)
    assert pick_score([_run("a", 2.0, 1.0), _run("b", 1.1, 0.6, per_gpu=2.0)])[0] == 1.0
    (only,) = picks(sweep)
    assert only.score == 1.0 and only.candidates == 3 and only.predicted_fit == 2


def test_memory_stats_count_predictions_under_nvidia_smi():
    rows = [_run("a", 1.0, 1.0, mem=m) for m in (40.0, 42.0, 38.0)] + [_run("b", 1.0, 1.0)]
    stats = memory_stats(rows)
    assert stats.rows == 3 and stats.under == 1  # 40 / 42 is 4.8 % under
    assert stats.low == pytest.approx(40 / 42) and stats.high == pytest.approx(40 / 38)


def test_report_plot_and_csv_on_a_few_rows(tmp_path):
    rows = read_rows(MORE_CSV)
    ran = [r for r in rows if "step_time_s" in r["notes"] or r["measured_tflops_per_gpu"]]
    with_memory = [r for r in rows if r["measured_mem_gb_per_gpu"] and family(r) == "bloom"]
    oom = [r for r in rows if "OOM" in r["notes"]]
    few = ran[:3] + with_memory[:2] + ran[-3:] + oom[:2]
    baseline = _baseline_of(few, list(rows[0]), tmp_path)
    text = format_report(baseline)
    for part in ("attention kernel", "recompute", "sequence length", "GPU type", "pick", "memory"):
        assert part in text
    plot, table = tmp_path / "scatter.png", tmp_path / "runs.csv"
    write_plot(baseline.results, plot)
    write_csv(baseline.results, table)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    written = read_rows(table)
    assert len(written) == len(baseline.results)
    assert list(written[0]) == list(CSV_COLUMNS)
    assert {r["outcome"] for r in written} == {"ran", "OOM"}
    assert any(r["measured_mem_gib"] != "nan" for r in written)


def test_the_calibration_rows_are_reported_too():
    """The 27 rows the compute model was fitted on go through the same report (all on
    the fit side), each family in its own TFLOP/s convention."""
    baseline = run_baseline(CALIBRATION_CSV, calibration=True)
    assert len(baseline.results) == 27 and not baseline.skipped
    assert {r.family for r in baseline.results} == {"sc21", "gpt3", "mcore", "bloom"}
    assert all(r.side == FIT for r in baseline.results)
    ran = [r for r in baseline.results if math.isfinite(r.measured)]
    assert ran and all(0.5 < r.ratio < 2.0 for r in ran)
