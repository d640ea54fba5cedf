"""nccl-tests log parsing (io/measurements/nccl_tests.py) and pairwise matrices and conversion
(io/measurements/nccl_pairwise.py), on verbatim upstream logs."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from pipette_cp.errors import InputFileError, SpecError
from pipette_cp.io.measurements.devices import gpu_from_device_name
from pipette_cp.io.measurements.nccl_pairwise import (
    convert_nccl_tests_dir,
    failed_tests,
    import_nccl_tests_dir,
    intra_node_estimate,
    nic_load_estimate,
    pairwise_matrix,
)
from pipette_cp.io.measurements.nccl_tests import (
    MESSAGE_WINDOW_BYTES,
    parse_nccl_tests_log,
    read_nccl_tests_dir,
    read_nccl_tests_log,
)
from pipette_cp.units import GB, GiB, MiB
from tests.conftest import FIXTURES
from tests.input_errors import refuses_missing_and_malformed

FIX = FIXTURES / "nccl"
PAIRWISE = FIX / "pairwise"
OTHER = FIX / "other"


def log(name: str):
    folder = PAIRWISE if (PAIRWISE / name).exists() else OTHER
    return read_nccl_tests_log(folder / name)


# ------------------------------------------------------------------ one log
def test_healthy_log_has_both_tests_with_every_row():
    parsed = log("nccl_N2_G1_cnode2-001_cnode2-002.log")
    assert (parsed.num_nodes, parsed.gpus_per_node) == (2, 1)
    assert parsed.hosts == ("cnode2-001", "cnode2-002")
    assert [t.name for t in parsed.tests] == ["alltoall_perf", "sendrecv_perf"]
    sendrecv = parsed.test("sendrecv")
    assert sendrecv is not None and sendrecv.ok
    assert [r.size_bytes for r in sendrecv.rows] == [32 * MiB * 2**k for k in range(10)]
    first = sendrecv.rows[0]  # "33554432 4194304 double sum -1 2513.89 13.35 13.35 0 ..."
    assert first.time_s == pytest.approx(2513.89e-6)
    assert first.busbw_bytes_per_s == pytest.approx(13.35 * GB)
    assert first.wrong == 0
    assert first.in_place_busbw_bytes_per_s == pytest.approx(13.40 * GB)
    assert sendrecv.rows[0].size_bytes == 33554432
    assert sendrecv.avg_busbw_bytes_per_s == pytest.approx(13.5405 * GB)
    assert sendrecv.devices == ("NVIDIA H100 80GB HBM3",) * 2
    assert sendrecv.version == "2.17.6"
    alltoall = parsed.test("alltoall_perf")
    assert alltoall is not None and alltoall.rows[0].algbw_bytes_per_s == pytest.approx(26.15e9)


def test_window_statistic_is_the_harmonic_mean_over_32mib_to_1gib():
    sendrecv = log("nccl_N2_G1_cnode2-001_cnode2-002.log").test("sendrecv")
    assert sendrecv is not None
    rows = sendrecv.window_rows()
    assert [r.size_bytes for r in rows] == [32 * MiB * 2**k for k in range(6)]
    # hand computation from the log's busbw column, 32 MiB .. 1 GiB
    busbw = [13.35, 13.46, 13.49, 13.54, 13.54, 13.56]
    expected = len(busbw) / sum(1 / b for b in busbw) * GB
    assert sendrecv.window_busbw() == pytest.approx(expected)
    assert (10e6, GiB) == MESSAGE_WINDOW_BYTES


def test_degraded_pair_collapses_with_message_size():
    sendrecv = log("nccl_N2_G1_cnode2-001_cnode2-004.log").test("sendrecv")
    assert sendrecv is not None and sendrecv.ok
    assert sendrecv.window_busbw() == pytest.approx(6.757e9, rel=1e-3)
    assert sendrecv.rows[-1].busbw_bytes_per_s == pytest.approx(0.97 * GB)
    whole_range = sendrecv.window_busbw((0, 1e12))
    assert whole_range < 0.5 * sendrecv.window_busbw()  # 3.31 vs 6.76 GB/s


def test_failed_test_without_table():
    parsed = log("nccl_N2_G1_cnode2-002_cnode2-008.log")
    alltoall, sendrecv = parsed.tests
    assert alltoall.ok
    assert not sendrecv.ok and sendrecv.rows == ()
    assert "no result table" in (sendrecv.failure or "")
    assert sendrecv.window_busbw() == 0.0


def test_failed_test_with_error_lines_and_missing_second_test():
    parsed = log("nccl_N2_G1_cnode2-005_cnode2-016.log")
    assert [t.name for t in parsed.tests] == ["alltoall_perf"]
    failure = parsed.tests[0].failure or ""
    assert "remote process exited or there was a network error" in failure
    assert parsed.test("sendrecv") is None


def test_g8_failure_prints_errors_from_every_process():
    parsed = log("nccl_N2_G8_cnode2-007_cnode2-016.log")
    assert [t.ok for t in parsed.tests] == [False, False]
    assert len(parsed.tests[1].errors) == 16  # 8 "Test NCCL failure" + 8 ".. Test failure"
    assert len(parsed.tests[0].hosts) == 16


def test_single_node_log_holds_five_collectives():
    parsed = log("nccl_N1_G8_cnode3-002.log")
    assert (parsed.num_nodes, parsed.gpus_per_node, parsed.hosts) == (1, 8, ("cnode3-002",))
    names = [t.name for t in parsed.tests]
    assert names == [
        "all_reduce_perf",
        "all_gather_perf",
        "reduce_scatter_perf",
        "alltoall_perf",
        "sendrecv_perf",
    ]
    assert all(t.ok for t in parsed.tests)
    all_reduce = parsed.test("all_reduce_perf")
    assert all_reduce is not None and all_reduce.rows[-1].busbw_bytes_per_s == pytest.approx(
        482.27 * GB
    )
    assert intra_node_estimate([parsed]) == pytest.approx(150.5e9, rel=0.01)


def test_window_falls_back_to_the_nearest_size():
    parsed = log("nccl_N2_G1_cnode3-002_cnode3-003.log")  # 4, 8, 16 GiB only
    sendrecv = parsed.test("sendrecv")
    assert sendrecv is not None
    assert [r.size_bytes for r in sendrecv.window_rows()] == [4 * GiB]
    assert sendrecv.window_busbw() == pytest.approx(43.75 * GB)
    below = sendrecv.window_rows((1, 1000))
    assert [r.size_bytes for r in below] == [4 * GiB]  # all above: smallest one
    above = sendrecv.window_rows((1e12, 2e12))
    assert [r.size_bytes for r in above] == [16 * GiB]  # all below: largest one


def test_old_format_without_root_and_wrong_rows():
    text = (
        "# nThread 1 nGpus 8 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5\n"
        "#       size    count   type  redop    time  algbw  busbw  error    time  algbw  busbw  error\n"
        "    16777216  4194304  float    sum  1000.0  16.78  29.36  0e+00  1001.0  16.76  29.33  0e+00\n"
        "   134217728 33554432  float    sum  6000.0  22.37  39.15  2e+00  6001.0  22.37  39.14  0e+00\n"
        "# Avg bus bandwidth    : 34.2\n"
    )
    (test,) = parse_nccl_tests_log(text)
    assert test.name == ""
    assert [r.busbw_bytes_per_s for r in test.rows] == [29.36 * GB, 39.15 * GB]
    assert test.rows[1].wrong == 2
    assert "corrupted" in (test.failure or "")


def test_two_tests_without_starting_lines_are_split():
    block = "# nThread 1 nGpus 1 minBytes 8 maxBytes 16 step: 2(factor)\n" + (
        "        8   2  float  sum  -1  10.0  0.00  0.00  0  10.0  0.00  0.00  0\n"
    )
    assert len(parse_nccl_tests_log(block + block)) == 2


def test_missing_or_foreign_file(tmp_path: Path):
    log = tmp_path / "nccl_N2_G1_a_b.log"
    refuses_missing_and_malformed(read_nccl_tests_log, log, "hello\n", "no nccl-tests output")
    with pytest.raises(InputFileError, match="no such directory"):
        read_nccl_tests_dir(tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputFileError, match="no nccl-tests logs"):
        read_nccl_tests_dir(empty)


# ------------------------------------------------------------------ a directory
def test_pairwise_matrix_of_four_nodes():
    logs = read_nccl_tests_dir(PAIRWISE)
    assert len(logs) == 12
    pm = pairwise_matrix(logs)
    assert pm.node_names == ("cnode2-001", "cnode2-002", "cnode2-004", "cnode2-008")
    m = pm.bandwidth_bytes_per_s
    np.testing.assert_array_equal(m, m.T)
    assert np.diagonal(m).tolist() == [0.0] * 4
    assert m[0, 1] == pytest.approx(13.49e9, rel=1e-3)
    assert m[0, 2] == pytest.approx(6.757e9, rel=1e-3)  # degraded pair
    assert m[1, 3] == 0.0  # cnode2-002 / cnode2-008: sendrecv failed
    assert [(a, b) for a, b, _ in pm.failed_pairs] == [("cnode2-002", "cnode2-008")]
    assert "no result table" in pm.failed_pairs[0][2]
    assert len(pm.pairs) == 6
    degraded = next(p for p in pm.pairs if p.nodes == ("cnode2-001", "cnode2-004"))
    assert degraded.largest_size_busbw_bytes_per_s == pytest.approx(0.97e9)
    assert len(degraded.sizes_bytes) == 6


def test_pairwise_matrix_at_g8_and_missing_pairs(tmp_path: Path):
    g8 = pairwise_matrix(read_nccl_tests_dir(PAIRWISE), gpus_per_test=8)
    assert g8.bandwidth_bytes_per_s[1, 3] == 0.0
    assert "NCCL failure" in g8.failed_pairs[0][2]
    for name in ("nccl_N2_G1_cnode2-001_cnode2-002.log", "nccl_N2_G1_cnode2-001_cnode2-004.log"):
        shutil.copy(PAIRWISE / name, tmp_path / name)
    pm = pairwise_matrix(read_nccl_tests_dir(tmp_path))
    assert ("cnode2-002", "cnode2-004", "no log") in pm.unmeasured  # not a failed pair
    assert not pm.failed_pairs
    with pytest.raises(InputFileError, match="G=4"):
        pairwise_matrix(read_nccl_tests_dir(tmp_path), gpus_per_test=4)


def test_missing_second_test_names_the_earlier_failure(tmp_path: Path):
    for name in ("nccl_N2_G1_cnode2-005_cnode2-016.log",):
        shutil.copy(OTHER / name, tmp_path / name)
    pm = pairwise_matrix(read_nccl_tests_dir(tmp_path))
    (_, _, reason) = pm.failed_pairs[0]
    assert reason.startswith("sendrecv_perf not in the log (the job stopped after alltoall_perf")


def test_nic_load_estimate_from_g8_alltoall():
    logs = read_nccl_tests_dir(PAIRWISE)
    node = nic_load_estimate(logs)
    # 8 x algbw / 2 of the healthy G=8 alltoall runs (algbw ~25.1 GB/s at 32 MiB-1 GiB)
    assert node == pytest.approx(100.2e9, rel=0.01)
    assert nic_load_estimate(logs, gpus_per_test=1) == pytest.approx(13.4e9, rel=0.01)
    assert nic_load_estimate(logs, gpus_per_test=2) is None


def test_sendrecv_ring_crosses_the_network_once_each_way():
    """The assumption behind gpus_per_test: ranks 0..g-1 on node A, g..2g-1 on node B,
    rank r sends to r+1 (mod 2g), so only GPU g-1 -> GPU 0 crosses, in each direction."""
    for name in ("nccl_N2_G1_cnode2-001_cnode2-002.log", "nccl_N2_G8_cnode2-001_cnode2-002.log"):
        sendrecv = log(name).test("sendrecv")
        assert sendrecv is not None
        hosts, n = sendrecv.hosts, len(sendrecv.hosts)
        crossing = [(r, (r + 1) % n) for r in range(n) if hosts[r] != hosts[(r + 1) % n]]
        g = n // 2
        assert crossing == [(g - 1, g), (n - 1, 0)]


def test_gpus_per_test_picks_another_gpu_pair():
    """G=1 measures GPU 0 <-> GPU 0, G=8 GPU 7 -> GPU 0: cnode2-001/004 is degraded on
    the first path only (6.76 vs 15.10 GB/s)."""
    logs = read_nccl_tests_dir(PAIRWISE)
    g1, g8 = pairwise_matrix(logs), pairwise_matrix(logs, gpus_per_test=8)
    assert (g1.gpus_per_test, g8.gpus_per_test) == (1, 8)
    assert g1.bandwidth_bytes_per_s[0, 2] == pytest.approx(6.757e9, rel=1e-3)
    assert g8.bandwidth_bytes_per_s[0, 2] == pytest.approx(15.096e9, rel=1e-3)
    cluster = convert_nccl_tests_dir(PAIRWISE, gpus_per_test=8)
    assert cluster.bandwidth_bytes_per_s[0, 16] == pytest.approx(15.096e9, rel=1e-3)
    assert cluster.gpus_per_node == 8 and "sendrecv_perf G=8" in cluster.source


def test_failed_tests_lists_the_tests_present_that_failed():
    failed = failed_tests(read_nccl_tests_dir(PAIRWISE))
    assert [(Path(p).name, t) for p, t, _ in failed] == [
        ("nccl_N2_G1_cnode2-002_cnode2-008.log", "sendrecv_perf"),
        ("nccl_N2_G8_cnode2-002_cnode2-008.log", "alltoall_perf"),
        ("nccl_N2_G8_cnode2-002_cnode2-008.log", "sendrecv_perf"),
    ]
    assert "no result table" in failed[0][2] and "NCCL failure" in failed[1][2]
    # the G=1 job of cnode2-005/016 died in alltoall: sendrecv never started, not counted
    other = failed_tests([log("nccl_N2_G1_cnode2-005_cnode2-016.log")])
    assert [t for _, t, _ in other] == ["alltoall_perf"]


def test_gpu_from_device_name():
    assert gpu_from_device_name(["NVIDIA H100 80GB HBM3"]).name == "H100-SXM5-80GB"
    assert gpu_from_device_name(["NVIDIA A100-SXM4-40GB"]).name == "A100-SXM4-40GB"
    assert gpu_from_device_name(["Tesla V100-SXM2-16GB"]).name == "V100-SXM2-16GB"
    for device, name in [("NVIDIA GH200 480GB", "GH200-96GB"), ("NVIDIA GH200 144G HBM3e", "GH200-144GB"),
                         ("NVIDIA H20", "H20-96GB"), ("NVIDIA H800 80GB HBM3", "H800-SXM5-80GB"),
                         ("NVIDIA B300 SXM6 AC", "B300-SXM-288GB"), ("NVIDIA GB300", "GB300-NVL72-288GB")]:  # fmt: skip
        assert gpu_from_device_name([device]).name == name, device
    with pytest.raises(SpecError, match="explicitly"):
        gpu_from_device_name(["NVIDIA H100 PCIe"])
    with pytest.raises(SpecError):
        gpu_from_device_name([])


def test_convert_directory_to_cluster():
    cluster = convert_nccl_tests_dir(PAIRWISE, name="four", single_node_dir=OTHER)
    assert cluster.describe() == "4 x 8 H100-SXM5-80GB, 8 NICs x 12.5 GB/s"
    assert cluster.node_names == ("cnode2-001", "cnode2-002", "cnode2-004", "cnode2-008")
    b = cluster.bandwidth_bytes_per_s
    assert b[0, 8] == pytest.approx(13.49e9, rel=1e-3)  # GPU 0 of node 0 -> GPU 0 of node 1
    assert b[15, 31] == 0.0  # cnode2-002 -> cnode2-008 failed
    assert b[0, 1] == pytest.approx(150.5e9, rel=0.01)  # intra-node, from the single-node log
    assert "sendrecv_perf G=1" in cluster.source
    explicit = convert_nccl_tests_dir(PAIRWISE, gpu="h100", intra_node_bytes_per_s=300e9)
    assert explicit.bandwidth_bytes_per_s[0, 1] == 300e9
    nvlink = convert_nccl_tests_dir(PAIRWISE, nics_per_node=4)
    assert nvlink.bandwidth_bytes_per_s[0, 1] == pytest.approx(450e9)  # datasheet NVLink
    assert nvlink.nic_bandwidth_bytes_per_s == pytest.approx(2 * cluster.nic_bandwidth_bytes_per_s)


def test_convert_refuses_a_node_with_every_pair_failed(tmp_path: Path):
    shutil.copy(OTHER / "nccl_N2_G1_cnode2-005_cnode2-016.log", tmp_path)
    shutil.copy(PAIRWISE / "nccl_N2_G1_cnode2-001_cnode2-002.log", tmp_path)
    with pytest.raises(InputFileError, match="node pairs have no usable G=1 measurement"):
        convert_nccl_tests_dir(tmp_path)  # the pairs of no log
    with pytest.raises(SpecError, match="every inter-node link failed"):
        convert_nccl_tests_dir(tmp_path, unmeasured="failed")


# ------------------------------------------------------------------ cut logs and units
def _cut_copy(tmp_path: Path, name: str, keep_rows: int, cut_at: int) -> Path:
    """A copy of a pairwise log whose sendrecv table ends after ``keep_rows`` rows and
    ``cut_at`` characters of the next (the file ends there: a copy cut off)."""
    text = (PAIRWISE / name).read_text()
    start = text.index("Collective test starting: sendrecv_perf")
    rows = [i for i, line in enumerate(text[start:].splitlines(keepends=True))
            if line.startswith(" ") and line.split()[0].isdigit()]  # fmt: skip
    lines = text[start:].splitlines(keepends=True)
    cut = text[:start] + "".join(lines[: rows[keep_rows]]) + lines[rows[keep_rows]][:cut_at]
    (tmp_path / name).write_text(cut)
    return tmp_path / name


def test_a_log_cut_mid_row_keeps_a_healthy_pair_healthy(tmp_path: Path) -> None:
    for name in sorted(p.name for p in PAIRWISE.glob("nccl_N2_G1_*.log")):
        shutil.copy(PAIRWISE / name, tmp_path / name)
    name = "nccl_N2_G1_cnode2-001_cnode2-002.log"
    whole = log(name).test("sendrecv")
    assert whole is not None
    for cut_at in (20, 62, 70, 75):  # inside the count, the time, algbw and busbw
        path = _cut_copy(tmp_path, name, keep_rows=3, cut_at=cut_at)
        sendrecv = read_nccl_tests_log(path).test("sendrecv")
        assert sendrecv is not None and sendrecv.ok and sendrecv.rows == whole.rows[:3]
        assert sendrecv.truncated is not None and "cut off" in sendrecv.truncated
        pm = pairwise_matrix(read_nccl_tests_dir(tmp_path))
        assert pm.bandwidth_bytes_per_s[0, 1] == pytest.approx(13.5e9, rel=0.01)
        assert ("cnode2-001", "cnode2-002") not in {(a, b) for a, b, _ in pm.failed_pairs}
    cluster = convert_nccl_tests_dir(tmp_path, gpu="h100", gpus_per_node=1)
    assert f"1 cut off mid-row (its last row ignored): {name}" in cluster.source
    first_row_cut = _cut_copy(tmp_path, name, keep_rows=0, cut_at=60)
    sendrecv = read_nccl_tests_log(first_row_cut).test("sendrecv")
    assert sendrecv is not None and not sendrecv.rows
    assert (sendrecv.failure or "").startswith("no complete result row (line ")
    # cut before its first row: the pair is not measured, never a failed pair
    pm = pairwise_matrix(read_nccl_tests_dir(tmp_path))
    assert [(a, b) for a, b, _ in pm.unmeasured] == [("cnode2-001", "cnode2-002")]
    assert "cut off before its first complete row" in pm.unmeasured[0][2]
    assert ("cnode2-001", "cnode2-002") not in {(a, b) for a, b, _ in pm.failed_pairs}
    with pytest.raises(InputFileError, match="1 node pair has no usable G=1 measurement"):
        convert_nccl_tests_dir(tmp_path, gpu="h100", gpus_per_node=1)
    for choice, value in (("failed", 0.0), ("median", float(np.median(pm.bandwidth_bytes_per_s[
            pm.bandwidth_bytes_per_s > 0])))):  # fmt: skip
        cluster, report = import_nccl_tests_dir(tmp_path, gpu="h100", gpus_per_node=1,
                                                unmeasured=choice)  # fmt: skip
        assert cluster.node_matrix()[0, 1] == pytest.approx(value)
        assert any(name in line and "not used" in line for line in report.lines())


def test_units_are_read_from_the_table_header() -> None:
    text = (PAIRWISE / "nccl_N2_G1_cnode2-001_cnode2-002.log").read_text()
    (gb,) = [t for t in parse_nccl_tests_log(text) if t.name == "sendrecv_perf"]
    mb_text = text.replace("(GB/s)", "(MB/s)").replace("(us)", "(ms)")
    (mb,) = [t for t in parse_nccl_tests_log(mb_text) if t.name == "sendrecv_perf"]
    assert mb.rows[0].busbw_bytes_per_s == pytest.approx(gb.rows[0].busbw_bytes_per_s / 1e3)
    assert mb.rows[0].time_s == pytest.approx(gb.rows[0].time_s * 1e3)
    tests = parse_nccl_tests_log(text.replace("(GB/s)", "(GiB/s)"), "x.log")
    assert all(not t.rows for t in tests)  # no table read in a unit it does not know
    assert "x.log: line 11: bandwidth unit GiB/s" in (tests[0].malformed or "")
    assert "unreadable table" in (tests[0].failure or "")


def test_a_malformed_row_inside_a_table_makes_only_that_table_unreadable() -> None:
    """A bad row in alltoall_perf, a table the matrix does not use: that test says why it
    is unreadable, the log's sendrecv_perf still reads (it used to abort the import)."""
    text = (PAIRWISE / "nccl_N2_G1_cnode2-001_cnode2-002.log").read_text()
    lines = text.splitlines(keepends=True)
    lines[12] = lines[12][:50] + "\n"  # the second row of alltoall_perf, cut short
    tests = {t.name: t for t in parse_nccl_tests_log("".join(lines), "x.log")}
    bad = tests["alltoall_perf"]
    assert not bad.rows and bad.malformed is not None
    assert "line 13: malformed result row (4 fields for the header's 13)" in bad.malformed
    assert tests["sendrecv_perf"].ok and tests["sendrecv_perf"].rows
