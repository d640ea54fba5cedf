"""The measurement plan (io/measurements/measure_script.py, io/measurements/measure_schedule.py, io/hostfile.py): the
round-robin schedule, the hostfile reader, the flags of the generated commands and the CLI
(the round trip script -> logs -> ``cluster import``: tests/io/measurements/test_roundtrip.py)."""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import shlex
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from pipette_cp.cli import app
from pipette_cp.errors import InputFileError, SpecError
from pipette_cp.io.measurements.measure_script import (
    MPIGRAPH_LOG,
    build_script,
    parse_hostfile,
    plan_measurement,
    read_hostfile,
    round_robin,
    write_measure_plan,
)
from pipette_cp.io.measurements.nccl_tests import LOG_NAME, MESSAGE_WINDOW_BYTES

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


@pytest.mark.parametrize("bad", ["$(touch pwned)", "n1;reboot", "n\nx", "a..b", "-n", "x" * 64])
@pytest.mark.parametrize("tool", ["nccl-tests", "mpigraph"])
def test_library_refuses_unsafe_host_names(bad: str, tool: str, tmp_path: Path) -> None:
    # the CLI reads names through parse_hostfile; the library must check them itself
    with pytest.raises(SpecError) as err:
        plan_measurement(["n0", bad, "n2"], gpus_per_node=8, tool=tool)
    message = str(err.value)
    assert message.startswith("hosts[1]=") and "RFC 1123" in message and "\n" not in message
    # a plan made some other way is checked again where the script is written
    good = plan_measurement(["n0", "n1", "n2"], gpus_per_node=8, tool=tool)
    plan = dataclasses.replace(good, hosts=("n0", bad, "n2"))
    with pytest.raises(SpecError, match=r"^hosts\[1\]="):
        build_script(plan)
    with pytest.raises(SpecError):
        write_measure_plan(plan, tmp_path / "out")
    assert not (tmp_path / "out" / "measure.sh").exists()


def test_rfc_1123_names_pass() -> None:
    names = ["n0", "gpu-01.dc1.example.org", "9node", "a" * 63, ".".join(["b" * 63] * 3) + ".c"]
    assert len(names[-1]) == 193
    build_script(plan_measurement(names, gpus_per_node=8))
