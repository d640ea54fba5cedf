"""A bash script that measures every node pair of a cluster, for ``cluster import``.

Pairwise runs: a round-robin tournament (the circle method; the plan is made in
:mod:`pipette_cp.io.measurements.measure_schedule`, whose names this module re-exports) splits the node pairs
into rounds of disjoint pairs; the pairs of one round run at the same time (bash
background jobs and ``wait``), the rounds one after the other.  With n nodes there
are n - 1 rounds for even n and n for odd n (one node sits out each round), which
is the minimum: a round holds at most floor(n / 2) pairs.  Each pair runs the
chosen nccl-tests binaries at each G (GPUs per node) of ``gpus_per_test`` and
writes their stdout to ``nccl_N2_G<g>_<nodeA>_<nodeB>.log``, the name
:data:`pipette_cp.io.measurements.nccl_tests.LOG_NAME` reads back (as the logs of
github.com/xxrjun/nccl-tests-cluster are named); a last round runs every node alone
with all its GPUs (``nccl_N1_G<G>_<node>.log``, the intra-node bandwidth).  With
``tool="mpigraph"`` the script is one mpiGraph run over all nodes instead.
A run that prints no nccl-tests header at all (the launcher failed) is kept as
``<log>.failed``, which the importer reads as a failed run of that pair (named in its account)
and a rerun of the script retries; existing logs are skipped.

The nccl-tests flags are those of its README ("Arguments", github.com/NVIDIA/nccl-tests):
``-b``/``-e``/``-f`` sizes, ``-g`` GPUs per process, ``-n``/``-w`` iterations; one
process per GPU (``srun --ntasks-per-node`` or Open MPI ``mpirun -np -H host:slots``),
as nccl-tests numbers ranks node by node.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipette_cp.errors import InputFileError
from pipette_cp.io.hostfile import Host, check_host_name, parse_hostfile, read_hostfile
from pipette_cp.io.measurements.measure_schedule import (
    COLLECTIVES,
    LAUNCHERS,
    TOOLS,
    MeasurePlan,
    pair_log_name,
    round_robin,
    single_log_name,
)
from pipette_cp.io.measurements.measure_schedule import plan_measurement as _plan_measurement

#: Message sizes 16 MiB .. 1 GiB, doubling: all 7 lie in the window the importer
#: averages over (:data:`pipette_cp.io.measurements.nccl_tests.MESSAGE_WINDOW_BYTES`, 10 MB - 1 GiB);
#: 20 timed and 5 warm-up iterations are nccl-tests' defaults, spelled out.
NCCL_ARGS: tuple[str, ...] = ("-b", "16M", "-e", "1G", "-f", "2", "-g", "1", "-n", "20", "-w", "5")
#: mpiGraph <size> <iters> <window> (its README); 16 MiB lies in the same window.
MPIGRAPH_ARGS: tuple[str, ...] = ("16777216", "10", "10")
MPIGRAPH_LOG = "mpiGraph.out"

__all__ = [
    "COLLECTIVES", "LAUNCHERS", "MPIGRAPH_ARGS", "NCCL_ARGS", "TOOLS", "Host", "MeasurePlan",
    "build_script", "import_command", "launch_argv", "pair_log_name", "parse_hostfile", "plan_measurement",
    "read_hostfile", "round_robin", "single_log_name", "write_measure_plan",
]  # fmt: skip


def plan_measurement(hosts: Sequence[Host | str], **options: Any) -> MeasurePlan:
    """:func:`pipette_cp.io.measurements.measure_schedule.plan_measurement` of ``hosts`` once each name
    is an RFC 1123 host name (:func:`~pipette_cp.io.hostfile.is_host_name`): the names
    reach the script, its commands and its log names.

    Raises
    ------
    SpecError
        ``hosts[i]=NAME``: not a host name; or as the schedule's planner.
    """
    for i, host in enumerate(hosts):
        check_host_name(host.name if isinstance(host, Host) else host, f"hosts[{i}]")
    return _plan_measurement(hosts, **options)


def launch_argv(launcher: str, nodes: Sequence[str], tasks_per_node: int) -> list[str]:
    """The launcher and its options: one process on each of ``tasks_per_node`` GPUs of
    every node, ranks node by node (Slurm ``srun``, Open MPI ``mpirun``)."""
    if launcher == "slurm":
        return [
            "srun",
            f"--nodes={len(nodes)}",
            f"--nodelist={','.join(nodes)}",
            f"--ntasks-per-node={tasks_per_node}",
        ]
    hosts = ",".join(f"{n}:{tasks_per_node}" for n in nodes)
    return ["mpirun", "-np", str(len(nodes) * tasks_per_node), "-H", hosts]


def _command(plan: MeasurePlan, nodes: Sequence[str], tasks: int, program: str) -> str:
    extra = "$SRUN_ARGS" if plan.launcher == "slurm" else "$MPIRUN_ARGS"
    launch = shlex.join(launch_argv(plan.launcher, nodes, tasks))
    if plan.tool == "mpigraph":
        return f'timeout "$TEST_TIMEOUT" {launch} {extra} "$MPIGRAPH" {shlex.join(MPIGRAPH_ARGS)}'
    args = shlex.join(NCCL_ARGS)
    return f'timeout "$TEST_TIMEOUT" {launch} {extra} "$NCCL_TESTS_BIN/{program}" {args}'


def _block(plan: MeasurePlan, log: str, nodes: Sequence[str], tasks: int, indent: str) -> str:
    """Run the collectives into ``log.part`` unless ``log`` exists; ``keep`` renames it."""
    err = f'"$LOG_DIR/{log.removesuffix(".log")}.err"'
    body = "\n".join(f"{indent}    {_command(plan, nodes, tasks, b)}" for b in plan.collectives)
    return (
        f"{indent}if todo {log}; then\n{indent}  {{\n{body}\n"
        f'{indent}  }} >"$LOG_DIR/{log}.part" 2>{err}\n'
        f"{indent}  keep {log} '^# nThread'\n{indent}fi\n"
    )


def _job(text: str) -> str:
    return f"(\n{text}) &\npace\n"


def build_script(plan: MeasurePlan) -> str:
    """The bash script of ``plan``: header comments, settings, one block per round.

    Raises
    ------
    SpecError
        A host name that is not an RFC 1123 name (:func:`~pipette_cp.io.hostfile.
        is_host_name`): names reach the script and its log names unquoted.
    """
    for i, host in enumerate(plan.hosts):
        check_host_name(host, f"hosts[{i}]")
    binary = "$MPIGRAPH" if plan.tool == "mpigraph" else f"$NCCL_TESTS_BIN/{plan.collectives[0]}"
    parts = [_header(plan), _PRELUDE, _CHECK.format(binary=binary)]
    if plan.tool == "mpigraph":
        parts.append('echo "mpiGraph over all nodes"\n')
        parts.append(_mpigraph_block(plan))
    else:
        total = len(plan.rounds)
        for r, pairs in enumerate(plan.rounds, start=1):
            parts.append(f'\necho "round {r}/{total}, node pairs: {len(pairs)}"\n')
            for a, b in pairs:
                logs = "".join(
                    _block(plan, pair_log_name(a, b, g), (a, b), g, "  ")
                    for g in plan.gpus_per_test
                )
                parts.append(_job(logs))
            parts.append("wait\n")
        if plan.single_logs():
            parts.append(f'\necho "single nodes: {len(plan.hosts)}"\n')
            for log, host, g in plan.single_logs():
                parts.append(_job(_block(plan, log, (host,), g, "  ")))
            parts.append("wait\n")
    parts.append(_DONE.format(next=import_command(plan)))
    return "".join(parts)


def _mpigraph_block(plan: MeasurePlan) -> str:
    return (
        f"if todo {MPIGRAPH_LOG}; then\n  {_command(plan, plan.hosts, 1, 'mpiGraph')} "
        f'>"$LOG_DIR/{MPIGRAPH_LOG}.part" 2>"$LOG_DIR/mpiGraph.err"\n'
        f"  keep {MPIGRAPH_LOG} '^END mpiGraph'\nfi\n"
    )


def import_command(plan: MeasurePlan, log_dir: str = "$LOG_DIR") -> str:
    """The ``pipette-cp cluster import`` command that reads the logs in ``log_dir``."""
    if plan.tool == "mpigraph":
        return (
            f"pipette-cp cluster import mpigraph {log_dir}/{MPIGRAPH_LOG} --gpu GPU "
            f"--gpus-per-node {plan.gpus_per_node} -o cluster.yaml"
        )
    single = f" --single-node {log_dir}" if plan.single_logs() else ""
    g = "" if plan.gpus_per_test[0] == 1 else f" --gpus-per-test {plan.gpus_per_test[0]}"
    return f"pipette-cp cluster import nccl-tests {log_dir}{single}{g} -o cluster.yaml"


def _header(plan: MeasurePlan) -> str:
    n, g = len(plan.hosts), plan.gpus_per_node
    most = max((len(r) for r in plan.rounds), default=0)
    if plan.tool == "mpigraph":
        what = [
            "One mpiGraph run, one MPI rank per node: in N-1 steps every rank sends to",
            "the rank D places to its right (host-to-host, mpiGraph's README).",
            f"Binary: $MPIGRAPH; arguments <size> <iters> <window> = {' '.join(MPIGRAPH_ARGS)}.",
        ]
    else:
        tests = ", ".join(plan.collectives)
        gs = ",".join(map(str, plan.gpus_per_test))
        what = [
            f"{len(plan.rounds)} rounds of at most {most} node pairs run at once (round-robin",
            "tournament, circle method: every node pair exactly once, no node twice in a",
            "round; with an odd node count one node sits out each round).",
            f"{plan.num_pairs} node pairs x G={gs} -> {len(plan.pair_logs())} pair logs "
            f"nccl_N2_G<g>_<nodeA>_<nodeB>.log,",
        ]
        if plan.single_logs():
            what.append(f"then {n} single-node logs nccl_N1_G{g}_<node>.log (all nodes at once);")
        what += [
            f"each log holds {tests} ({plan.num_tests} tests in all),",
            f"nccl-tests flags {' '.join(NCCL_ARGS)}, one process per GPU.",
        ]
    launcher = (
        [
            "Run inside one allocation holding every node, e.g.",
            f"  salloc --nodes={n} --nodelist={','.join(plan.hosts)} --exclusive bash measure.sh",
        ]
        if plan.launcher == "slurm"
        else ["Run where Open MPI's mpirun can start processes on every node (ssh or a scheduler)."]
    )
    extra = "SRUN_ARGS" if plan.launcher == "slurm" else "MPIRUN_ARGS"
    settings = [
        "Settings (environment variables):",
        "  NCCL_TESTS_BIN  nccl-tests binaries built with MPI=1 [./nccl-tests/build]"
        if plan.tool == "nccl-tests"
        else "  MPIGRAPH        the mpiGraph binary [./mpiGraph/mpiGraph]",
        "  LOG_DIR         where the logs go [logs/ next to this script]",
        f"  {extra:<15} extra launcher options, e.g. "
        + ('"--mpi=pmix"' if plan.launcher == "slurm" else '"-x LD_LIBRARY_PATH -x NCCL_IB_HCA"'),
        "  TEST_TIMEOUT    seconds before one test is killed [900; 0 = never]",
        "  PARALLEL        1: the pairs of a round run at once, 0: one after another [1]",
        "  FORCE           1: rerun tests whose log already exists [0]",
        "Pairs measured at once share the fabric's spine; run with PARALLEL=0 to compare.",
        "",
        f"Then: {import_command(plan)}",
    ]
    lines = [
        "Bandwidth measurement plan written by `pipette-cp cluster measure-plan`.",
        f"{n} nodes x {g} GPUs, tool {plan.tool}, launcher {plan.launcher}.",
        "",
        *what,
        "",
        *launcher,
        *settings,
    ]
    return "#!/usr/bin/env bash\n" + "".join(f"# {x}\n" if x else "#\n" for x in lines)


_PRELUDE = """set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NCCL_TESTS_BIN=${NCCL_TESTS_BIN:-./nccl-tests/build}
MPIGRAPH=${MPIGRAPH:-./mpiGraph/mpiGraph}
LOG_DIR=${LOG_DIR:-$HERE/logs}
SRUN_ARGS=${SRUN_ARGS:-}
MPIRUN_ARGS=${MPIRUN_ARGS:-}
TEST_TIMEOUT=${TEST_TIMEOUT:-900}
PARALLEL=${PARALLEL:-1}
FORCE=${FORCE:-0}
mkdir -p "$LOG_DIR"

todo() {  # FILE: true unless $LOG_DIR/FILE exists (and FORCE is not 1)
  if [[ "$FORCE" != 1 && -s "$LOG_DIR/$1" ]]; then echo "  skip $1 (exists)"; return 1; fi
}
pace() {  # one job at a time unless PARALLEL=1
  if [[ "$PARALLEL" != 1 ]]; then wait; fi
}
keep() {  # FILE PATTERN: FILE.part becomes FILE if it holds PATTERN, else FILE.failed
  if grep -q "$2" "$LOG_DIR/$1.part"; then
    mv "$LOG_DIR/$1.part" "$LOG_DIR/$1"; rm -f "$LOG_DIR/$1.failed"; return
  fi
  mv "$LOG_DIR/$1.part" "$LOG_DIR/$1.failed"
  echo "  FAILED $1: no tool output (see its .err); rerun to retry" >&2
}
"""
_DONE = """
failed=$(find "$LOG_DIR" -name '*.failed' | wc -l)
echo "done; logs in $LOG_DIR; $failed runs without output (*.failed)"
echo "next: {next}"
"""


_CHECK = """if [[ ! -x "{binary}" ]]; then
  echo "warning: {binary} is not an executable here (set NCCL_TESTS_BIN or MPIGRAPH)" >&2
fi

"""


def write_measure_plan(plan: MeasurePlan, out_dir: str | Path) -> Path:
    """Write ``out_dir/measure.sh`` (executable) and return its path."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputFileError(out, "exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    path = out / "measure.sh"
    path.write_text(build_script(plan), encoding="utf-8")
    path.chmod(0o755)
    return path
