"""The benchmark suite: every method on every instance, one stored row per job.

* :mod:`~pipette_cp.suite.jobs`: a job, its row, and :func:`run_job` (runs anywhere);
* :mod:`~pipette_cp.suite.store`: the SQLite store (one transaction per row, resumable);
* :mod:`~pipette_cp.suite.executors`: in-process, local process pool, or Ray tasks;
* :mod:`~pipette_cp.suite.runner`: jobs in, rows stored;
* :mod:`~pipette_cp.suite.best_known`: rows against each instance's ``best_known``;
* :mod:`~pipette_cp.suite.report` and :mod:`~pipette_cp.suite.plots`: tables and pictures.
"""

from pipette_cp.suite.best_known import Flag, all_flags, best_known_updates, flags_for
from pipette_cp.suite.executors import EXECUTORS, Executor, make_executor
from pipette_cp.suite.jobs import BenchRow, Job, run_job
from pipette_cp.suite.report import BenchReport, build_report, to_csv, to_markdown
from pipette_cp.suite.runner import DEFAULT_METHODS, BenchSummary, prepare_jobs, run_bench
from pipette_cp.suite.store import DEFAULT_DB, BenchStore

__all__ = [
    "DEFAULT_DB",
    "DEFAULT_METHODS",
    "EXECUTORS",
    "BenchReport",
    "BenchRow",
    "BenchStore",
    "BenchSummary",
    "Executor",
    "Flag",
    "Job",
    "all_flags",
    "best_known_updates",
    "build_report",
    "flags_for",
    "make_executor",
    "prepare_jobs",
    "run_bench",
    "run_job",
    "to_csv",
    "to_markdown",
]
