"""SIGTERM and SIGHUP stop ``solve --jobs 2`` as Ctrl-C does: the command ends, and so do
its worker processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")

COMMAND = [sys.executable, "-c", "from pipette_cp.cli import main; main()",
           "solve", "llama-2-70b-g3-512", "--jobs", "2", "--time-limit", "120"]  # fmt: skip


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):  # the thread ended meanwhile
            found |= {int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()}
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_ends_the_command_and_its_workers(signum: signal.Signals) -> None:
    process = subprocess.Popen(COMMAND, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    workers: set[int] = set()
    for _ in range(600):  # until both workers run (at most a minute)
        workers |= _children(process.pid)
        if len(workers) >= 2 or process.poll() is not None:
            break
        time.sleep(0.1)
    assert len(workers) >= 2, "the search started no workers"
    process.send_signal(signum)
    _, err = process.communicate(timeout=60)
    assert process.returncode in (0, 130), err
    assert "Traceback" not in err
    for _ in range(50):
        if not any(_alive(w) for w in workers):
            break
        time.sleep(0.1)
    assert not any(_alive(w) for w in workers)


#: A pool whose manager thread can never finish: one of its futures' locks is held, as an
#: interrupt raised inside ``concurrent.futures.wait`` can leave it.  The interpreter joins
#: that thread on exit, so without a deadline the stopped command never ends.
STUCK_POOL = """
import multiprocessing, os, signal, sys, time
from concurrent.futures import ProcessPoolExecutor
from pipette_cp.cli.app import interrupt_on_stop_signals
from pipette_cp.search.executors.workers import kill_pool
interrupt_on_stop_signals()
pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork"))
future = pool.submit(time.sleep, 0.2)
print(*(p.pid for p in pool._processes.values()), flush=True)
future._condition.acquire()
try:
    os.kill(os.getpid(), signal.SIG)
    time.sleep(60)
except KeyboardInterrupt:
    kill_pool(pool)
    print("best plan kept", flush=True)
"""


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_stopped_command_ends_even_when_its_pool_cannot(name: str) -> None:
    script = STUCK_POOL.replace("signal.SIG)", f"signal.{name})")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    workers, said = run.stdout.splitlines()
    assert (run.returncode, said) == (130, "best plan kept"), run.stderr
    assert not any(_alive(int(pid)) for pid in workers.split())
    assert "Traceback" not in run.stderr


def test_an_aborted_runner_is_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipette_cp.io.instance_file import load_instance
    from pipette_cp.search.executors.workers import ProcessRunner

    runner = ProcessRunner(load_instance("gpt3-1.3b-nominal-8"), "greedy", [], jobs=1)
    runner.close(abort=True)
    monkeypatch.setattr(runner._pool, "shutdown", lambda **_: pytest.fail("waited"))
    runner.close()  # the search's own close after an interrupted phase closed it


#: A stop that arrives inside a finaliser (as inside a fork handler): Python can only
#: print it as "Exception ignored"; the command raises it again in the main thread.
LOST_STOP = """
import os, signal, time
from pipette_cp.cli.app import interrupt_on_stop_signals
interrupt_on_stop_signals()
class Finalised:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)  # the handler raises here, inside __del__
try:
    Finalised()
    time.sleep(30)
    print("not stopped", flush=True)
except KeyboardInterrupt:
    print("stopped", flush=True)
"""


def test_a_stop_lost_in_a_finaliser_is_raised_again() -> None:
    run = subprocess.run([sys.executable, "-c", LOST_STOP], capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert run.stdout.strip() == "stopped", (run.stdout, run.stderr)
    assert "Traceback" not in run.stderr and "Exception ignored" not in run.stderr
