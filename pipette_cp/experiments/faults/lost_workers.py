"""A worker killed in each phase of a parallel ``solve``: is a plan still returned in time?

``python -m pipette_cp.experiments.faults.lost_workers [--instance NAME]
[--time-limit S] [--executors local,ray]``

For each phase the progress lines name (bounding, scoring, the greedy sweep, the split
and placement solves, the simulator's re-ranking), a ``solve --jobs 2`` of a bundled
instance is started with its progress piped, and when the first line of that phase
appears one worker process is killed (SIGKILL).  Measured: the command's wall time from
its start, whether it printed a plan, its exit status.  The target: a plan within the
time limit plus max(10 %, 1 s).  Exit status 1 if any run misses it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time

from pipette_cp.experiments.faults.stop_signals import descendants

#: Progress-line prefixes of the phases, in the search's order.
PHASES = {
    "bound": "bounding layouts",
    "score": "scoring",
    "sweep": "greedy sweep",
    "solve": "solving split + placement",
    "rerank": "re-ranking",
}


def _workers(pid: int, executor: str) -> list[int]:
    """The worker processes of the command ``pid`` (Ray: the search's actors, not Ray's
    own agents and servers)."""
    found = sorted(descendants(pid))
    if executor == "ray":
        return [p for p in found if _cmdline(p).startswith("ray::_Worker")]
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def lose_one(
    instance: str, phase: str, limit_s: float, executor: str
) -> tuple[float, bool, int, bool]:
    """(wall s, plan printed, exit status, whether a worker was killed) of one run."""
    command = [sys.executable, "-c", "from pipette_cp.cli import main; main()", "solve",
               instance, "--jobs", "2", "--time-limit", f"{limit_s:g}", "--executor", executor]  # fmt: skip
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)  # fmt: skip
    killed = threading.Event()

    def watch() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            if not killed.is_set() and PHASES[phase] in line and "done" not in line:
                workers = _workers(process.pid, executor)
                if workers:
                    os.kill(workers[0], signal.SIGKILL)
                    killed.set()

    reader = threading.Thread(target=watch, daemon=True)
    reader.start()
    assert process.stdout is not None
    out = process.stdout.read()  # stderr is the watcher's alone
    process.wait(timeout=limit_s * 3 + 60)
    wall = time.perf_counter() - start
    reader.join(timeout=5)
    return wall, "Top plans" in out, process.returncode, killed.is_set()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instance", default="llama-2-7b-g3-32")
    parser.add_argument("--time-limit", type=float, default=20.0)
    parser.add_argument("--executors", default="local")
    args = parser.parse_args(argv)
    allowed = args.time_limit + max(0.1 * args.time_limit, 1.0)
    missed = 0
    for executor in args.executors.split(","):
        for phase in PHASES:
            wall, printed, code, killed = lose_one(args.instance, phase, args.time_limit, executor)
            ok = printed and code == 0 and wall <= allowed
            missed += not ok
            print(f"{executor:6s} {phase:7s} worker killed: {killed!s:5s}  exit {code}  plan: "
                  f"{printed!s:5s}  {wall:5.1f} s of {allowed:.1f} s allowed  "
                  f"{'ok' if ok else 'MISSED'}", flush=True)  # fmt: skip
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
