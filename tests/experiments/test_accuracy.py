"""The cost models against published runs (instances/calibration) and their accuracy targets."""

from __future__ import annotations

import pytest

from pipette_cp.cost.stack import calibration as calib
from pipette_cp.experiments.models.accuracy import (
    CALIBRATION_CSV,
    TARGET_MAPE,
    TARGET_MEMORY,
    TARGET_WORST,
    AccuracyReport,
    format_report,
    read_rows,
    row_setup,
    run_accuracy,
)
from pipette_cp.io.paths import INSTANCES_DIR


@pytest.fixture(scope="module")
def report() -> AccuracyReport:
    return run_accuracy()


def test_bundled_calibration_rows():
    # The package reads its own bundled copy under instances/, nothing outside it.
    assert CALIBRATION_CSV.is_file() and CALIBRATION_CSV.is_relative_to(INSTANCES_DIR)
    rows = read_rows()
    assert len(rows) == 27
    assert sum(1 for r in rows if r["measured_mem_gb_per_gpu"]) == 7


def test_rebuilt_models_match_published_sizes():
    # The documented defaults (vocabulary, ffn = 4h, tied / untied) reproduce the
    # published parameter counts.
    for row in read_rows():
        setup = row_setup(row)
        published = float(row["params_b"]) * 1e9
        assert setup.instance.model.total_params == pytest.approx(published, rel=0.06), row[
            "model_name"
        ]
        expected = "model" if row["gpu_type"].startswith("H100") else "hardware"
        assert setup.metric == expected


def test_throughput_within_targets(report):
    # Targets: MAPE <= 8 %, no row worse than 20 % (TFLOP/s per GPU, like for like).
    assert len(report.rows) == 27
    assert report.mape <= TARGET_MAPE, format_report(report)
    assert abs(report.worst.error) <= TARGET_WORST, format_report(report)


def test_bloom_memory_within_10_percent_and_never_under(report):
    assert len(report.memory_rows) == 7
    for row in report.memory_rows:
        assert abs(row.error) <= TARGET_MEMORY, format_report(report)
        # never call an out-of-memory layout feasible: no prediction below nvidia-smi
        assert row.error >= -1e-9, row


def test_calibration_table_is_small_and_documented():
    for family, cal in calib.GPU_CALIBRATION.items():
        assert 0.4 < cal.gemm_efficiency_max < 0.95
        command = (
            calib.BLACKWELL_FIT_COMMAND if family == calib.BLACKWELL_FAMILY else calib.FIT_COMMAND
        )
        assert cal.fitted and command in cal.provenance
    assert calib.FIT_COMMAND in calib.MEMORY_CALIBRATION.provenance
    assert not calib.DEFAULT_GPU_CALIBRATION.fitted


def test_report_text(report):
    text = format_report(report)
    assert "MAPE" in text and "memory" in text
