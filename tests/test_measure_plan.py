"""The measurement plan (io/measure_plan.py, io/hostfile.py): the round-robin schedule,
the hostfile reader, the flags of the generated commands, and the round trip
script -> logs -> ``cluster import``, with fake launchers standing in for srun/mpirun."""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import stat
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from pipette_cp.cli import app
from pipette_cp.errors import InputFileError, SpecError
from pipette_cp.io.cluster_file import read_cluster_file
from pipette_cp.io.measure_plan import (
    MPIGRAPH_LOG,
    build_script,
    parse_hostfile,
    plan_measurement,
    read_hostfile,
    round_robin,
    write_measure_plan,
)
from pipette_cp.io.mpigraph import read_mpigraph
from pipette_cp.io.nccl_pairwise import convert_nccl_tests_dir
from pipette_cp.io.nccl_tests import LOG_NAME, MESSAGE_WINDOW_BYTES
from pipette_cp.units import GB, MiB

# nccl-tests README, section "Arguments" (github.com/NVIDIA/nccl-tests/blob/master/README.md):
# "All tests support the same set of arguments", short and long forms, each taking a value.
NCCL_TESTS_FLAGS = {
    "-t", "--nthreads", "-g", "--ngpus", "-b", "--minbytes", "-e", "--maxbytes",
    "-i", "--stepbytes", "-f", "--stepfactor", "-o", "--op", "-d", "--datatype",
    "-r", "--root", "-n", "--iters", "-w", "--warmup_iters", "-m", "--agg_iters",
    "-a", "--average", "-p", "--parallel_init", "-c", "--check", "-z", "--blocking",
    "-G", "--cudagraph", "-F", "--output_file",
}  # fmt: skip
# srun(1) man page (slurm.schedmd.com/srun.html): -N/--nodes, -w/--nodelist, --ntasks-per-node.
SRUN_FLAGS = {"--nodes", "-N", "--nodelist", "-w", "--ntasks-per-node", "--ntasks", "-n"}
# Open MPI 4.1 mpirun(1) man page: -np, -H/-host/--host <host:slots,...>.
MPIRUN_FLAGS = {"-np", "-n", "-H", "-host", "--host"}
# coreutils timeout(1): timeout DURATION COMMAND.
SIZE = re.compile(r"^(\d+)([KMG]?)$")

runner = CliRunner()


def nccl_size(text: str) -> int:
    """nccl-tests' size parser: a number with an optional K/M/G (binary) suffix."""
    m = SIZE.match(text)
    assert m, text
    return int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2)]


# ------------------------------------------------------------------ schedule
@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=2, max_value=40))
def test_round_robin_covers_every_pair_once_in_minimal_disjoint_rounds(n: int) -> None:
    nodes = [f"n{i}" for i in range(n)]
    rounds = round_robin(nodes)
    pairs = [frozenset(p) for r in rounds for p in r]
    assert Counter(pairs) == Counter(frozenset(p) for p in itertools.combinations(nodes, 2))
    for r in rounds:
        used = [x for p in r for x in p]
        assert len(used) == len(set(used)), r
        assert len(r) == n // 2
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    for a, b in (p for r in rounds for p in r):
        assert nodes.index(a) < nodes.index(b)


def test_round_robin_small_cases_and_errors() -> None:
    assert round_robin(["a", "b"]) == [[("a", "b")]]
    three = round_robin(["a", "b", "c"])
    assert sorted(p for r in three for p in r) == [("a", "b"), ("a", "c"), ("b", "c")]
    assert [len(r) for r in three] == [1, 1, 1]
    with pytest.raises(SpecError, match="distinct"):
        round_robin(["a", "b", "a"])


# ------------------------------------------------------------------ hostfile
def test_hostfile_formats_comments_and_blanks(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text("# cluster\n\ngpu-01 slots=8\ngpu-02:8   # spare NIC\n  gpu-03.dc1 \n")
    hosts = read_hostfile(path)
    assert [(h.name, h.slots, h.line) for h in hosts] == [
        ("gpu-01", 8, 3),
        ("gpu-02", 8, 4),
        ("gpu-03.dc1", None, 5),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a\nb\na\n", "line 3: 'a' already on line 1"),
        ("a\nb slots=x\n", "line 2"),
        ("a\nb:0\n", "line 2"),
        ("a\nb cpus=4\n", "line 2"),
        ("a\nnode_7\n", "line 2: host 'node_7'"),
        ("a\nb$c\n", "line 2"),
        ("# only a comment\n\n", "no host"),
    ],
)
def test_hostfile_errors_name_the_line(text: str, message: str) -> None:
    with pytest.raises(InputFileError, match=re.escape(message)):
        parse_hostfile(text, where="hosts")


def test_plan_takes_gpus_from_slots_and_rejects_bad_settings() -> None:
    hosts = parse_hostfile("a slots=4\nb slots=4\nc slots=4\n")
    assert plan_measurement(hosts).gpus_per_node == 4
    assert plan_measurement(["a", "b"]).gpus_per_node == 8
    with pytest.raises(SpecError, match="line 2"):
        plan_measurement(parse_hostfile("a slots=8\nb slots=4\n"))
    assert plan_measurement(parse_hostfile("a:8\nb:4\n"), gpus_per_node=4).gpus_per_node == 4
    for kwargs, field in [
        ({"tool": "ibperf"}, "--tool"),
        ({"launcher": "ssh"}, "--launcher"),
        ({"collectives": ["sendrecv", "allreduce"]}, "--collectives"),
        ({"gpus_per_test": [1, 9]}, "--gpus-per-test"),
        ({"gpus_per_test": [0]}, "--gpus-per-test"),
    ]:
        with pytest.raises(SpecError, match=re.escape(field)):
            plan_measurement(["a", "b"], **kwargs)
    with pytest.raises(SpecError, match="two nodes"):
        plan_measurement(["a"])


# ------------------------------------------------------------------ the script
def commands(script: str) -> list[list[str]]:
    """Every launched command of a script, split as bash would (variables left as text)."""
    return [
        shlex.split(line.split(">", 1)[0])
        for line in script.splitlines()
        if line.strip().startswith("timeout ")
    ]


def split_command(argv: list[str]) -> tuple[list[str], str, list[str]]:
    """(launcher argv, program, program args) of ``timeout T LAUNCHER ... $EXTRA PROGRAM ...``."""
    assert argv[:2] == ["timeout", "$TEST_TIMEOUT"], argv
    k = next(i for i, tok in enumerate(argv) if tok in ("$SRUN_ARGS", "$MPIRUN_ARGS"))
    return argv[2:k], argv[k + 1], argv[k + 2 :]


def flags(argv: list[str]) -> list[str]:
    return [tok.split("=", 1)[0] for tok in argv if tok.startswith("-")]


@pytest.mark.parametrize("launcher", ["slurm", "mpirun"])
def test_commands_use_only_documented_flags(launcher: str) -> None:
    plan = plan_measurement(
        [f"h{i}" for i in range(5)],
        gpus_per_node=8,
        launcher=launcher,
        collectives=["sendrecv", "all_reduce", "alltoall"],
        gpus_per_test=[1, 8],
    )
    cmds = commands(build_script(plan))
    assert len(cmds) == plan.num_tests == (10 * 2 + 5) * 3
    allowed = SRUN_FLAGS if launcher == "slurm" else MPIRUN_FLAGS
    for argv in cmds:
        launch, program, args = split_command(argv)
        assert launch[0] == ("srun" if launcher == "slurm" else "mpirun")
        assert set(flags(launch[1:])) <= allowed, launch
        assert re.fullmatch(r"\$NCCL_TESTS_BIN/(sendrecv|all_reduce|alltoall)_perf", program)
        assert set(flags(args)) <= NCCL_TESTS_FLAGS, args
        # every flag takes one value: -x V -y V ...
        assert all(tok in NCCL_TESTS_FLAGS for tok in args[::2]), args
        opts = dict(zip(args[::2], args[1::2], strict=True))
        lo, hi = nccl_size(opts["-b"]), nccl_size(opts["-e"])
        assert MESSAGE_WINDOW_BYTES[0] <= lo <= hi <= MESSAGE_WINDOW_BYTES[1]


def test_mpigraph_script_is_one_run_over_all_nodes() -> None:
    hosts = ["a", "b", "c", "d"]
    for launcher, allowed in (("slurm", SRUN_FLAGS), ("mpirun", MPIRUN_FLAGS)):
        script = build_script(plan_measurement(hosts, tool="mpigraph", launcher=launcher))
        (argv,) = commands(script)
        launch, program, args = split_command(argv)
        assert set(flags(launch[1:])) <= allowed
        assert program == "$MPIGRAPH" and all(a.isdigit() for a in args) and len(args) == 3
        assert ",".join(hosts) in " ".join(launch) or "a:1,b:1,c:1,d:1" in launch
        assert MPIGRAPH_LOG in script


def test_script_rounds_are_disjoint_and_log_names_match_their_nodes() -> None:
    hosts = [f"node-{i:02d}" for i in range(7)]
    plan = plan_measurement(hosts, gpus_per_node=4, gpus_per_test=[1, 4])
    script = build_script(plan)
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    blocks = re.split(r'^echo "(?:round|single)', script, flags=re.M)[1:]
    assert len(blocks) == 7 + 1  # 7 rounds for 7 nodes, then the single-node round
    seen = Counter()
    for block in blocks:
        nodes_in_round = Counter()
        for log, body in re.findall(r"if todo (\S+); then\n(.*?)\n\s*fi", block, flags=re.S):
            m = LOG_NAME.match(log)
            assert m, log
            named = m["hosts"].split("_")
            for argv in commands(body):
                launch = split_command(argv)[0]
                assert f"--nodelist={','.join(named)}" in launch
                assert f"--ntasks-per-node={m['g']}" in launch
            if int(m["n"]) == 2:
                seen[frozenset(named), int(m["g"])] += 1
            if m["g"] == str(plan.gpus_per_test[0]) or m["n"] == "1":
                nodes_in_round.update(named)
        assert max(nodes_in_round.values()) == 1, nodes_in_round
    expected = {(frozenset(p), g) for p in itertools.combinations(hosts, 2) for g in (1, 4)}
    assert set(seen) == expected and set(seen.values()) == {1}


# ------------------------------------------------------------------ round trip
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
        if key in table:  # the failed pair's job printed nothing: the script keeps no .log
            (tmp_path / name).write_text(_fake["fake_log"]("sendrecv_perf", (a, b), g, table[key]))
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
    done = subprocess.run(
        ["bash", str(tmp_path / "m" / "measure.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
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
    again = subprocess.run(
        ["bash", str(tmp_path / "m" / "measure.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.stdout.count("skip ") == 14  # the failed pair is retried
    check_cluster(convert_nccl_tests_dir(logs, single_node_dir=logs), hosts, table)


def test_mpigraph_script_output_reads_back(tmp_path: Path) -> None:
    hosts = ["a1", "a2", "a3"]
    table = bandwidth_table(hosts)
    (tmp_path / "bw.json").write_text(json.dumps(table))
    script = write_measure_plan(plan_measurement(hosts, tool="mpigraph"), tmp_path / "m")
    env = {**fake_launchers(tmp_path), "FAKE_BW": str(tmp_path / "bw.json")}
    done = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    result = read_mpigraph(tmp_path / "m" / "logs" / MPIGRAPH_LOG)
    assert result.node_names == tuple(hosts)
    want = np.array(
        [[0 if a == b else table[" ".join(sorted((a, b)))] for b in hosts] for a in hosts]
    )
    assert np.allclose(result.node_matrix() / GB, want, rtol=1e-6)
    assert MiB == 2**20  # mpiGraph's MB/sec is MiB/s (io/mpigraph.py)


# ------------------------------------------------------------------ CLI
def test_cli_measure_plan_17_nodes(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("".join(f"cnode-{i:03d}:8\n" for i in range(1, 18)))
    result = runner.invoke(
        app,
        [
            "cluster",
            "measure-plan",
            "--hostfile",
            str(tmp_path / "hosts"),
            "-o",
            str(tmp_path / "out"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "17 rounds, 136 node pairs, 153 nccl-tests runs" in result.output
    script = (tmp_path / "out" / "measure.sh").read_text()
    assert script.startswith("#!/usr/bin/env bash\n")
    assert os.access(tmp_path / "out" / "measure.sh", os.X_OK)
    assert len(commands(script)) == 153 and script.count('echo "round ') == 17


def test_cli_measure_plan_bad_hostfile_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("a\nb slots=two\n")
    result = runner.invoke(
        app, ["cluster", "measure-plan", "--hostfile", str(tmp_path / "hosts"), "-o", str(tmp_path)]
    )
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "line 2" in result.output
