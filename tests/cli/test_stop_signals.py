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
