"""How long a stopped ``solve`` takes to end, with every process it started.

``python -m pipette_cp.experiments.faults.stop_signals [--executors local,ray] [--repeats N]
[--instance NAME] [--time-limit S] [--wait S]``

For each executor (``local``: ``--jobs 2`` worker processes; ``ray``: a local Ray with
two actors, when Ray is installed) and each of SIGTERM, SIGHUP and SIGINT, a ``solve`` of
a large bundled instance is started, the signal is sent once its workers run, and the
seconds until the command and every process descended from it have ended are measured
(process tree read from ``/proc``).  One line per run: the signal, the exit status, the
seconds, whether the best plan so far was printed; then the worst time per executor.
Exit status 1 if any process outlived :data:`LIMIT_S`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

#: The target: every process gone this many seconds after the signal.
LIMIT_S = 5.0
INSTANCE = "llama-2-70b-g3-512"
SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (children of all its threads, recursively)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            for task in os.listdir(f"/proc/{parent}/task"):
                with contextlib.suppress(FileNotFoundError):
                    text = Path(f"/proc/{parent}/task/{task}/children").read_text()
                    for child in map(int, text.split()):
                        if child not in found:
                            found.add(child)
                            todo.append(child)
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def stop_once(
    executor: str, signum: signal.Signals, wait_s: float, limit_s: float, instance: str = INSTANCE
) -> tuple[int, float, bool]:
    """(exit status, seconds from the signal until every process ended or ``inf``,
    whether a plan was printed) for one stopped solve."""
    command = [sys.executable, "-c", "from pipette_cp.cli import main; main()", "solve",
               instance, "--jobs", "2", "--time-limit", f"{limit_s:g}", "--executor", executor]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True, start_new_session=True)  # fmt: skip
    started = time.perf_counter()
    tree: set[int] = set()
    while time.perf_counter() - started < 120 and process.poll() is None:
        tree |= descendants(process.pid)
        if len(tree) >= 2 and time.perf_counter() - started > wait_s:
            break
        time.sleep(0.1)
    process.send_signal(signum)
    sent = time.perf_counter()
    ended = float("inf")
    while time.perf_counter() - sent < 60:
        tree |= descendants(process.pid)
        if process.poll() is not None and not any(alive(p) for p in tree):
            ended = time.perf_counter() - sent
            break
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):  # leave nothing behind either way
        os.killpg(process.pid, signal.SIGKILL)
    out = process.communicate()[0]
    return process.returncode, ended, "Top plans" in out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executors", default="local,ray")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--wait", type=float, default=25.0,
                        help="seconds into the solve to send the signal")  # fmt: skip
    parser.add_argument("--time-limit", type=float, default=60.0, help="the solve's limit")
    parser.add_argument("--instance", default=INSTANCE, help="bundled instance to solve")
    args = parser.parse_args(argv)
    worst: dict[str, float] = {}
    for executor in args.executors.split(","):
        if executor == "ray":
            try:
                import ray  # noqa: F401
            except ImportError:
                print("ray: not installed, skipped")
                continue
        for signum in SIGNALS:
            for _ in range(args.repeats):
                code, seconds, printed = stop_once(
                    executor, signum, args.wait, args.time_limit, args.instance
                )
                worst[executor] = max(worst.get(executor, 0.0), seconds)
                print(f"{executor:6s} {signum.name:8s} exit {code:4d}  all ended after "
                      f"{seconds:5.2f} s  plan printed: {printed}", flush=True)  # fmt: skip
    for executor, seconds in worst.items():
        print(f"{executor}: worst {seconds:.2f} s (target {LIMIT_S:g} s)")
    return 0 if all(s <= LIMIT_S for s in worst.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
