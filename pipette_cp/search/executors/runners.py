"""The search's runners by name: this process, worker processes, or Ray actors."""

from __future__ import annotations

from collections.abc import Sequence

from pipette_cp.errors import SpecError
from pipette_cp.search.executors.ray_actors import RayRunner
from pipette_cp.search.executors.workers import InlineRunner, ProcessRunner, Runner, check_jobs
from pipette_cp.search.options import SearchOptions
from pipette_cp.specs import Instance, Plan

#: Where the search's work runs (``--executor``).
EXECUTORS = ("local", "ray")


def make_runner(instance: Instance, layouts: Sequence[Plan], options: SearchOptions) -> Runner:
    """The runner of ``options.jobs`` workers, each holding ``instance``, the method and
    the search's ``layouts`` (work refers to them by index): this process for one local
    worker, else worker processes; ``options.executor="ray"``: Ray actors
    (:mod:`~pipette_cp.search.executors.ray_actors`, at ``options.ray_address`` of a
    running cluster or a local one)."""
    method, jobs, executor, address = (
        options.method,
        options.jobs,
        options.executor,
        options.ray_address,
    )
    check_jobs(jobs, executor)
    if executor == "ray":
        return RayRunner(instance, method, layouts, jobs, address)
    if executor != "local":
        raise SpecError("executor", executor, f"expected one of {', '.join(EXECUTORS)}")
    if address is not None:
        raise SpecError("ray_address", address, "only with executor='ray'")
    if jobs == 1:
        return InlineRunner(instance, method, layouts)
    return ProcessRunner(instance, method, layouts, jobs)
