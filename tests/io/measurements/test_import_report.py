"""An nccl-tests import says what it did with every file, and where each figure comes
from; nothing is turned into a failed pair without a word."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipette_cp.cli import app
from pipette_cp.io.measurements.nccl_pairwise import import_nccl_tests_dir
from tests.conftest import FIXTURES

PAIRWISE = FIXTURES / "nccl" / "pairwise"
OTHER = FIXTURES / "nccl" / "other"


def _copy(tmp_path: Path, *extra: Path) -> Path:
    for p in [*PAIRWISE.iterdir(), *extra]:
        shutil.copy(p, tmp_path / p.name)
    return tmp_path


def test_every_file_is_accounted_for(tmp_path: Path) -> None:
    folder = _copy(tmp_path, OTHER / "nccl_N1_G8_cnode3-002.log")
    (folder / "summary.csv").write_text("pair,busbw\n")
    (folder / "nccl_N2_G1_x_y.log").write_text("srun: error: no such host\n")
    cluster, report = import_nccl_tests_dir(folder)
    lines = report.lines()
    assert lines[0] == "read 6 G=1 pairwise logs for the node matrix"
    assert "summary.csv: skipped: not a log name (nccl_N<n>_G<g>_<hosts>.log)" in lines
    assert any(line.startswith("nccl_N2_G1_x_y.log: skipped: ") and "no nccl-tests output"
               in line for line in lines)  # fmt: skip
    g8 = [line for line in lines if line.startswith("6 G=8 pairwise logs not read")]
    assert len(g8) == 1 and "--gpus-per-test 8 reads them" in g8[0] and "median pair" in g8[0]
    failed = [line for line in lines if line.startswith("failed pair ")]
    assert failed == ["failed pair cnode2-002-cnode2-008: no result table (the run stopped "
                      "before any message size completed)"]  # fmt: skip
    # the directory's own single-node log measures the intra-node bandwidth
    intra = next(line for line in lines if line.startswith("intra-node bandwidth:"))
    assert "measured: median single-node sendrecv_perf over 1 nodes" in intra
    assert "intra-node: " in cluster.source and "summary.csv" in cluster.source


def test_without_single_node_logs_the_datasheet_figure_is_named_as_assumed(tmp_path) -> None:
    _, report = import_nccl_tests_dir(_copy(tmp_path))
    intra = next(line for line in report.lines() if line.startswith("intra-node"))
    assert "assumed: the H100-SXM5-80GB datasheet NVLink figure" in intra


def test_a_run_kept_as_failed_is_a_failed_pair_with_its_reason(tmp_path: Path) -> None:
    folder = _copy(tmp_path)
    (folder / "nccl_N2_G1_cnode2-004_cnode2-008.log").unlink()
    (folder / "nccl_N2_G1_cnode2-004_cnode2-008.log.failed").write_text("srun: error\n")
    _, report = import_nccl_tests_dir(folder)
    assert any("cnode2-004-cnode2-008" in f and "printed no nccl-tests output" in f
               for f in report.failed)  # fmt: skip


def test_the_command_prints_the_account_and_refuses_unmeasured_pairs(tmp_path: Path) -> None:
    folder = _copy(tmp_path)
    out = tmp_path / "c.yaml"
    result = CliRunner().invoke(
        app, ["cluster", "import", "nccl-tests", str(folder), "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "read 6 G=1 pairwise logs" in result.output and "intra-node bandwidth" in result.output
    (folder / "nccl_N2_G1_cnode2-001_cnode2-004.log").unlink()  # a pair with no log at all
    result = CliRunner().invoke(
        app, ["cluster", "import", "nccl-tests", str(folder), "-o", str(tmp_path / "d.yaml")]
    )
    assert result.exit_code == 2
    assert "1 node pair has no usable G=1 measurement: cnode2-001-cnode2-004 (no log)" in (
        result.output
    )
    result = CliRunner().invoke(app, ["cluster", "import", "nccl-tests", str(folder), "-o",
                                      str(tmp_path / "e.yaml"), "--unmeasured", "median"])  # fmt: skip
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("value", ["maybe", ""])
def test_an_unknown_unmeasured_choice_is_refused(tmp_path: Path, value: str) -> None:
    result = CliRunner().invoke(app, ["cluster", "import", "nccl-tests", str(PAIRWISE), "-o",
                                      str(tmp_path / "c.yaml"), "--unmeasured", value])  # fmt: skip
    assert result.exit_code == 2 and "--unmeasured" in result.output
