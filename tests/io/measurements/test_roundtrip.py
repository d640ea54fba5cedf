"""The round trip of the measurement plan (io/measurements/measure_script.py): script -> logs ->
``cluster import``, with fake launchers standing in for srun/mpirun."""

from __future__ import annotations

import itertools
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from pipette_cp.cli import app
from pipette_cp.io.cluster_file import read_cluster_file
from pipette_cp.io.measurements.measure_script import (
    MPIGRAPH_LOG,
    plan_measurement,
    write_measure_plan,
)
from pipette_cp.io.measurements.mpigraph import read_mpigraph
from pipette_cp.io.measurements.nccl_pairwise import convert_nccl_tests_dir
from pipette_cp.units import GB, MiB

runner = CliRunner()


# One definition of a fake nccl-tests / mpiGraph output, used here and, written into
# an executable, as the fake srun / mpirun the script calls.
FAKE_SOURCE = r'''
import json, os, sys

DEVICE = "NVIDIA H100 80GB HBM3"


def fake_log(test, hosts, g, busbw_gb):
    """One nccl-tests 2.17 test as it prints it (format of tests/fixtures/nccl)."""
    out = [
        "# nccl-tests version 2.17.6 nccl-headers=22807 nccl-library=22807",
        f"# Collective test starting: {test}",
        "# nThread 1 nGpus 1 minBytes 16777216 maxBytes 1073741824 step: 2(factor) "
        "warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0",
        "#",
        "# Using devices",
    ]
    rank = 0
    for host in hosts:
        for d in range(g):
            out.append(f"#  Rank {rank:2d} Group  0 Pid {4000 + rank:6d} on {host:>10} "
                       f"device {d:2d} [0000:1b:00] {DEVICE}")
            rank += 1
    out += [
        "#",
        "#                                                              out-of-place"
        "                       in-place          ",
        "#       size         count      type   redop    root     time   algbw   busbw"
        "  #wrong     time   algbw   busbw  #wrong ",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"
        "             (us)  (GB/s)  (GB/s)         ",
    ]
    size = 16777216
    while size <= 1073741824:
        t = size / (busbw_gb * 1e3)
        out.append(f"{size:12d}  {size // 8:12d}    double     sum      -1  {t:7.2f}  "
                   f"{busbw_gb:6.2f}  {busbw_gb:6.2f}       0  {t:7.2f}  {busbw_gb:6.2f}  "
                   f"{busbw_gb:6.2f}     N/A")
        size *= 2
    out += ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {busbw_gb:.4f} ",
            "#", f"# Collective test concluded: {test}", ""]
    return "\n".join(out) + "\n"


def fake_mpigraph(hosts, table):
    labels = [f"{h}:{i}" for i, h in enumerate(hosts)]
    out = ["START mpiGraph v1.5", "MsgSize\t16777216", "Times\t10", "Window\t10",
           f"Procs\t{len(hosts)}", ""]
    for name, word in (("Send", "to"), ("Recv", "from")):
        out.append(name + "\t" + "\t".join(labels))
        for i, a in enumerate(hosts):
            row = [0.0 if a == b else table[" ".join(sorted((a, b)))] * 1e9 / 2**20
                   for b in hosts]
            out.append(f"{labels[i]} {word}\t" + "\t".join(f"{v:.3f}" for v in row))
        out.append("")
    return "\n".join([*out, "END mpiGraph"]) + "\n"


def main(argv):
    table = json.load(open(os.environ["FAKE_BW"]))
    program = next(a for a in argv if a.endswith("_perf") or a.endswith("mpiGraph"))
    if argv[0].startswith("-np") or "-H" in argv:  # mpirun -np N -H a:g,b:g
        spec = argv[argv.index("-H") + 1].split(",")
        hosts, g = [s.split(":")[0] for s in spec], int(spec[0].split(":")[1])
    else:  # srun --nodes=N --nodelist=a,b --ntasks-per-node=g
        opts = dict(a.split("=", 1) for a in argv if a.startswith("--"))
        hosts, g = opts["--nodelist"].split(","), int(opts["--ntasks-per-node"])
    if program.endswith("mpiGraph"):
        sys.stdout.write(fake_mpigraph(hosts, table))
        return 0
    key = " ".join(sorted(hosts))
    if key not in table:  # this pair's job dies before printing anything
        print(f"{os.path.basename(sys.argv[0])}: error: task 0 killed", file=sys.stderr)
        return 1
    sys.stdout.write(fake_log(os.path.basename(program), hosts, g, table[key]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
'''
_fake: dict = {}
exec(compile(FAKE_SOURCE, "fake_launcher", "exec"), _fake)


def bandwidth_table(hosts: list[str], failed: tuple[str, str] | None = None) -> dict[str, float]:
    """GB/s per sorted 'a b' pair (distinct two-decimal values) and 300 per single node."""
    table = {
        " ".join(sorted(p)): 10.0 + 0.25 * k for k, p in enumerate(itertools.combinations(hosts, 2))
    }
    if failed:
        del table[" ".join(sorted(failed))]
    table.update({h: 300.0 for h in hosts})
    return table


def check_cluster(cluster, hosts: list[str], table: dict[str, float]) -> None:
    names = list(cluster.node_names)
    assert sorted(names) == sorted(hosts)
    node = cluster.node_matrix()
    for a, b in itertools.combinations(hosts, 2):
        want = table.get(" ".join(sorted((a, b))), 0.0) * GB
        i, j = names.index(a), names.index(b)
        assert node[i, j] == pytest.approx(want, rel=1e-9) and node[j, i] == node[i, j]


def test_logs_written_under_the_plan_names_import_back(tmp_path: Path) -> None:
    hosts = ["gpu-a", "gpu-b", "gpu-c", "gpu-d", "gpu-e"]
    plan = plan_measurement(hosts, gpus_per_node=8, gpus_per_test=[1])
    table = bandwidth_table(hosts, failed=("gpu-b", "gpu-d"))
    for name, (a, b), g in plan.pair_logs():
        key = " ".join(sorted((a, b)))
        if key in table:
            (tmp_path / name).write_text(_fake["fake_log"]("sendrecv_perf", (a, b), g, table[key]))
        else:  # the failed pair's job printed nothing: the script keeps it as <log>.failed
            (tmp_path / f"{name}.failed").write_text("srun: error: connection refused\n")
    for name, host, g in plan.single_logs():
        (tmp_path / name).write_text(_fake["fake_log"]("sendrecv_perf", (host,), g, 300.0))
    cluster = convert_nccl_tests_dir(tmp_path, single_node_dir=tmp_path)
    check_cluster(cluster, hosts, table)
    assert cluster.gpus_per_node == 8 and cluster.gpu_types.keys() == {"H100-SXM5-80GB"}
    assert cluster.bandwidth_bytes_per_s[0, 1] == pytest.approx(300.0 * GB)


def fake_launchers(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    for name in ("srun", "mpirun"):
        path = bin_dir / name
        path.write_text(f"#!{sys.executable}\n{FAKE_SOURCE}")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def run_script(script: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a written measure.sh with bash under ``env`` (output captured, 5 minutes at most)."""
    return subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["slurm", "mpirun"])
def test_running_the_script_gives_logs_that_import_back(tmp_path: Path, launcher: str) -> None:
    hosts = ["n1", "n2", "n3", "n4", "n5"]
    (tmp_path / "hosts").write_text("\n".join(f"{h} slots=4" for h in hosts) + "\n")
    code = runner.invoke(
        app,
        ["cluster", "measure-plan", "--hostfile", str(tmp_path / "hosts"),
         "--launcher", launcher, "-o", str(tmp_path / "m")],
    )  # fmt: skip
    assert code.exit_code == 0, code.output
    table = bandwidth_table(hosts, failed=("n2", "n5"))
    (tmp_path / "bw.json").write_text(json.dumps(table))
    env = {**fake_launchers(tmp_path), "FAKE_BW": str(tmp_path / "bw.json")}
    done = run_script(tmp_path / "m" / "measure.sh", env)
    assert done.returncode == 0, done.stderr
    logs = tmp_path / "m" / "logs"
    assert len(list(logs.glob("nccl_N2_G1_*.log"))) == 9
    assert [p.name for p in logs.glob("*.failed")] == ["nccl_N2_G1_n2_n5.log.failed"]
    assert "FAILED nccl_N2_G1_n2_n5.log" in done.stderr
    assert len(list(logs.glob("nccl_N1_G4_*.log"))) == 5 and not list(logs.glob("*.part"))
    out = tmp_path / "c.yaml"
    result = runner.invoke(
        app,
        ["cluster", "import", "nccl-tests", str(logs), "--single-node", str(logs), "-o", str(out)],
    )
    assert result.exit_code == 0, result.output
    cluster = read_cluster_file(out)
    check_cluster(cluster, hosts, table)
    assert cluster.gpus_per_node == 4
    # a second run skips every existing log (and so keeps them)
    (tmp_path / "bw.json").write_text(json.dumps({k: 1.0 for k in table}))
    again = run_script(tmp_path / "m" / "measure.sh", env)
    assert again.stdout.count("skip ") == 14  # the failed pair is retried
    check_cluster(convert_nccl_tests_dir(logs, single_node_dir=logs), hosts, table)


def test_mpigraph_script_output_reads_back(tmp_path: Path) -> None:
    hosts = ["a1", "a2", "a3"]
    table = bandwidth_table(hosts)
    (tmp_path / "bw.json").write_text(json.dumps(table))
    script = write_measure_plan(plan_measurement(hosts, tool="mpigraph"), tmp_path / "m")
    env = {**fake_launchers(tmp_path), "FAKE_BW": str(tmp_path / "bw.json")}
    done = run_script(script, env)
    assert done.returncode == 0, done.stderr
    result = read_mpigraph(tmp_path / "m" / "logs" / MPIGRAPH_LOG)
    assert result.node_names == tuple(hosts)
    want = np.array(
        [[0 if a == b else table[" ".join(sorted((a, b)))] for b in hosts] for a in hosts]
    )
    assert np.allclose(result.node_matrix() / GB, want, rtol=1e-6)
    assert MiB == 2**20  # mpiGraph's MB/sec is MiB/s (io/measurements/mpigraph.py)
