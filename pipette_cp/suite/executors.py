"""Where benchmark jobs run: this process, a local process pool, or Ray tasks.

Every executor has the same tiny interface (:class:`Executor`): ``submit`` jobs,
then iterate over ``completed()`` rows in the order they finish.  Rows always come
back to the caller (the parent process), which alone writes the store.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from typing import Any, Protocol

from pipette_cp.errors import SpecError
from pipette_cp.search.executors.ray_actors import check_address, import_ray
from pipette_cp.search.executors.workers import check_jobs, kill_pool
from pipette_cp.suite.jobs import CRASH, BenchRow, Job, failed_row, run_job

#: Executor names accepted by :func:`make_executor` (and ``--executor``).
EXECUTORS = ("local", "ray")


class Executor(Protocol):
    """Runs :func:`~pipette_cp.suite.jobs.run_job` on submitted jobs."""

    def submit(self, job: Job) -> None:
        """Queue one job."""
        ...

    def completed(self) -> Iterator[BenchRow]:
        """Rows of the submitted jobs, each once, as they finish."""
        ...

    def close(self) -> None:
        """Release workers; pending jobs are abandoned."""
        ...


class InlineExecutor:
    """Runs jobs one after the other in this process (``--jobs 1``: the solvers
    already use the cores, and solve times are not perturbed by neighbours)."""

    def __init__(self) -> None:
        self._queue: deque[Job] = deque()

    def submit(self, job: Job) -> None:
        self._queue.append(job)

    def completed(self) -> Iterator[BenchRow]:
        while self._queue:
            yield run_job(self._queue.popleft())

    def close(self) -> None:
        self._queue.clear()


class PoolExecutor:
    """A local process pool of ``workers`` processes."""

    def __init__(self, workers: int) -> None:
        self._pool = ProcessPoolExecutor(max_workers=workers)
        self._futures: dict[Future[BenchRow], Job] = {}

    def submit(self, job: Job) -> None:
        self._futures[self._pool.submit(run_job, job)] = job

    def completed(self) -> Iterator[BenchRow]:
        for future in as_completed(list(self._futures)):
            job = self._futures.pop(future)
            try:
                yield future.result()
            except Exception as exc:  # the worker died (killed, out of memory)
                yield failed_row(job, CRASH, f"worker failed: {type(exc).__name__}: {exc}")

    def close(self) -> None:
        """Cancel the waiting jobs and end the running ones (an interrupted run leaves no
        worker behind)."""
        kill_pool(self._pool)


class RayExecutor:
    """Jobs as Ray tasks, one CPU each, on the cluster ``ray.init`` connects to: the one
    at ``address`` (checked reachable first), else at ``RAY_ADDRESS`` if set, else a new
    local one with ``workers`` CPUs; an already initialised Ray is used as it is."""

    def __init__(self, workers: int | None = None, address: str | None = None) -> None:
        self._ray = import_ray()
        if not self._ray.is_initialized():
            if address is not None:
                self._ray.init(address=check_address(address, "--ray-address"),
                               log_to_driver=False)  # fmt: skip
            else:
                local = {} if os.environ.get("RAY_ADDRESS") else {"num_cpus": workers}
                self._ray.init(**local, include_dashboard=False, log_to_driver=False)
        self._task = self._ray.remote(num_cpus=1)(run_job)
        self._pending: dict[Any, Job] = {}

    def submit(self, job: Job) -> None:
        self._pending[self._task.remote(job)] = job

    def completed(self) -> Iterator[BenchRow]:
        while self._pending:
            done, _ = self._ray.wait(list(self._pending), num_returns=1)
            ref = done[0]
            job = self._pending.pop(ref)
            try:
                yield self._ray.get(ref)
            except Exception as exc:  # the task or its worker failed
                yield failed_row(job, CRASH, f"ray task failed: {type(exc).__name__}: {exc}")

    def close(self) -> None:
        for ref in self._pending:
            self._ray.cancel(ref, force=True)
        self._pending.clear()


def make_executor(name: str = "local", jobs: int = 1, address: str | None = None) -> Executor:
    """The executor called ``name`` with ``jobs`` parallel workers (``address``: of a
    running Ray cluster, with ``"ray"`` only)."""
    check_jobs(jobs, name, "--jobs")
    if address is not None and name != "ray":
        raise SpecError("--ray-address", address, "applies to --executor ray only")
    if name == "local":
        return InlineExecutor() if jobs == 1 else PoolExecutor(jobs)
    if name == "ray":
        return RayExecutor(jobs, address)
    raise SpecError("--executor", name, f"expected one of {', '.join(EXECUTORS)}")
