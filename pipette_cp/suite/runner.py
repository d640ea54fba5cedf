"""Run every method on every instance and store one row per job.

Jobs whose key is already in the store are skipped, so an interrupted run resumes
where it stopped; rows are written by this (the parent) process as the executor
returns them, one transaction each.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import product

from pipette_cp.errors import SpecError
from pipette_cp.io.instance_file import list_instances, load_instance
from pipette_cp.search.loop import default_time_limit_s
from pipette_cp.solvers import METHODS
from pipette_cp.specs import BestKnown
from pipette_cp.suite.best_known import Flag, all_flags
from pipette_cp.suite.executors import Executor
from pipette_cp.suite.jobs import BenchRow, Job
from pipette_cp.suite.store import BenchStore
from pipette_cp.suite.variants import Sweep

#: Methods benchmarked when none are named.
DEFAULT_METHODS = ("cpsat", "milp", "pipette-sa", "amp", "greedy", "megatron-default")

#: ``on_result(row, done, total)`` after each row is stored.
OnResult = Callable[[BenchRow, int, int], None]


@dataclass
class BenchSummary:
    """What a run did: ``rows`` are the rows written by this run."""

    total: int
    skipped: int
    rows: list[BenchRow] = field(default_factory=list)
    flags: list[Flag] = field(default_factory=list)
    without_best_known: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[BenchRow]:
        """Rows of jobs that raised an error or crashed (infeasible is an answer)."""
        return [r for r in self.rows if r.status in ("error", "crash")]


@dataclass(frozen=True)
class BenchJobs:
    """The jobs of a run and the ``best_known`` of each instance."""

    jobs: list[Job]
    best_known: Mapping[str, BestKnown | None]


def prepare_jobs(
    instances: Sequence[str] = (),
    methods: Sequence[str] = DEFAULT_METHODS,
    seeds: Sequence[int] = (0,),
    time_limits_s: Sequence[float | None] = (None,),
    sweep: Sweep | None = None,
) -> BenchJobs:
    """One job per instance x method x seed x time limit (``None``: the instance's
    default, :func:`~pipette_cp.search.loop.default_time_limit_s`); no instances
    means every bundled one.  With a ``sweep`` that sets anything, each instance's
    what-if variants (:mod:`pipette_cp.suite.variants`) take its place, every one
    built and checked here, before any job runs; they have no ``best_known``."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SpecError(
            "--methods", unknown[0], f"unknown method; known: {', '.join(sorted(METHODS))}"
        )
    if not methods:
        raise SpecError("--methods", "", "expected at least one method")
    for limit in time_limits_s:
        if limit is not None and limit <= 0:
            raise SpecError("--time-limit", limit, "expected a positive number of seconds")
    jobs: list[Job] = []
    best: dict[str, BestKnown | None] = {}
    for name in instances or list_instances():
        inst = load_instance(name)
        variants = sweep.variants(name) if sweep else []
        if not variants:
            best[name] = inst.best_known
        built = [(v.name, v.build(), v.to_json()) for v in variants] or [(name, inst, "")]
        for label, case, variant in built:
            gpus = case.cluster.num_gpus
            for limit in time_limits_s:
                budget = default_time_limit_s(case) if limit is None else float(limit)
                for method, seed in product(methods, seeds):
                    jobs.append(
                        Job(label, method, seed, budget, case.family, gpus, variant=variant)
                    )
    return BenchJobs(jobs, best)


def run_bench(
    jobs: BenchJobs,
    store: BenchStore,
    executor: Executor,
    on_result: OnResult | None = None,
) -> BenchSummary:
    """Run the jobs not yet in ``store`` on ``executor``, writing each row as it comes."""
    done = store.finished()
    todo = [job for job in jobs.jobs if job.key not in done]
    summary = BenchSummary(total=len(jobs.jobs), skipped=len(jobs.jobs) - len(todo))
    try:
        for job in todo:
            executor.submit(job)
        for i, row in enumerate(executor.completed(), start=1):
            store.write(row)
            summary.rows.append(row)
            if on_result is not None:
                on_result(row, i, len(todo))
    finally:
        executor.close()
    summary.flags = all_flags(summary.rows, jobs.best_known)
    summary.without_best_known = sorted(n for n, b in jobs.best_known.items() if b is None)
    return summary
