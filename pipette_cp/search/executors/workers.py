"""Where the search runs its per-layout work: in this process, or in a pool of workers.

The layouts' bounds, scores and solves are independent given the incumbent, which the
search keeps (it prunes a layout before handing it out).  A :class:`Runner` hands the
work out: :class:`InlineRunner` runs it here, one piece at a time (the sequential
search); :class:`ProcessRunner` in ``jobs`` worker processes, each holding the instance
and the method once (sent at start).  Results come back as futures; the bounds and
scores of a batch in the batch's order, so both runners make the same decisions.  The
workers get the instance, the method and the search's layouts once, when they start
(forked where the platform can: shared, not copied); work names layouts by index.

A worker that dies takes the pool with it (``BrokenProcessPool``): the runner starts a
new pool and the search retries the layouts in flight once; a solve that overruns its
time limit by :data:`HANG_GRACE_S` plus its limit is a hang: the pool is restarted the
same way.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from pipette_cp.cost.evaluator.evaluate import Evaluator, validate_layout
from pipette_cp.errors import InfeasibleError, LayoutError, PipetteError, SpecError
from pipette_cp.search.bounds import memory_check, time_lower_bound
from pipette_cp.search.sweep import greedy_plan
from pipette_cp.solvers import SolveOptions, get_method
from pipette_cp.solvers import work_meter as work
from pipette_cp.specs import Instance, Plan

#: A solve that runs this much past its own time limit (s, plus the limit) is taken for hung.
HANG_GRACE_S = 30.0
#: Work a greedy plan of the sweep is charged beside its local search (ticks of
#: :mod:`pipette_cp.solvers.work_meter`: measured 5 ms + 0.25 ms per GPU on the reference
#: machine), and the most it may spend (reference s: the sweep's 1 s limit).
GREEDY_TICKS, GREEDY_TICKS_PER_GPU, GREEDY_CAP_S = 5_000, 250, 1.0
#: Work a solve is charged beside what its solvers meter: its fixed costs (tables and
#: models), per GPU of the cluster (ticks; the wall-clock search's 1 ms least solve).
SOLVE_TICKS_PER_GPU = 1_000


def default_jobs() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


#: Most Ray workers a search or a bench run starts (Ray queues what its cluster's CPUs
#: cannot run at once, so more only add start-up).
MAX_RAY_JOBS = 1024


def check_jobs(jobs: int, executor: str = "local", field: str = "jobs") -> int:
    """``jobs`` if it is a positive count within the cap, else a SpecError naming ``field``:
    local worker processes at most the cores this process may run on
    (:func:`default_jobs`: more would only share them), Ray workers at most
    :data:`MAX_RAY_JOBS`."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise SpecError(field, jobs, "must be a whole number of worker processes >= 1")
    if executor == "ray" and jobs > MAX_RAY_JOBS:
        raise SpecError(field, jobs, f"at most {MAX_RAY_JOBS} Ray workers")
    if executor != "ray" and jobs > (cores := default_jobs()):
        raise SpecError(field, jobs, f"at most {cores} worker processes here (the cores this "
                        "process may run on; more would only share them)")  # fmt: skip
    return jobs


@dataclass(frozen=True)
class Bounded:
    """One layout after the placement-free checks: ``status`` is ``"invalid"``,
    ``"never fits"`` (with the memory deficit) or ``"bounded"`` (with its time bound)."""

    status: str
    deficit_bytes: float = 0.0
    bound_s: float = 0.0


@dataclass(frozen=True)
class Scored:
    """One skeleton scored as it stands: its time if it fits (else inf), its memory
    deficit, its estimate (the time whether it fits or not; on the repaired cluster if
    the default placement crosses a failed link), and whether it crossed one."""

    score_s: float
    deficit_bytes: float
    estimate_s: float
    crossed: bool


#: What a worker holds: the instance, its evaluators and the method.
_STATE: dict[str, Any] = {}


def _init(instance: Instance, method: str, layouts: Sequence[Plan], worker: bool = False) -> None:
    """The worker's state; an error building it is raised by every piece of work (an
    initializer that raises would break the pool instead)."""
    if worker:  # Ctrl-C is the search's to handle: it stops the workers itself
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for signum in (signal.SIGTERM, signal.SIGHUP):  # not the command's handlers
            signal.signal(signum, signal.SIG_DFL)
    _STATE.clear()
    try:
        _STATE.update(instance=instance, method=get_method(method), layouts=layouts,
                      evaluator=Evaluator(instance, validate=False))  # fmt: skip
    except Exception as exc:
        _STATE["error"] = exc


def _state() -> dict[str, Any]:
    if "error" in _STATE:
        raise _STATE["error"]
    return _STATE


def repaired(instance: Instance) -> Instance:
    """``instance`` with every failed GPU pair at the slowest working bandwidth."""
    if instance.cluster.fabric is not None:
        fabric = instance.cluster.fabric.without_failures()
        cluster = instance.cluster.model_copy(update={"fabric": fabric})
        return instance.model_copy(update={"cluster": cluster})
    bw = instance.cluster.bandwidth_bytes_per_s
    assert bw is not None
    off = ~np.eye(len(bw), dtype=bool)
    working = bw[off & (bw > 0)]
    fixed = np.where(off & (bw <= 0), float(working.min()) if working.size else 1.0, bw)
    cluster = instance.cluster.model_copy(update={"bandwidth_bytes_per_s": fixed})
    return instance.model_copy(update={"cluster": cluster})


def bound_layouts(indices: Sequence[int]) -> list[Bounded]:
    """:class:`Bounded` of the worker's layouts at ``indices``."""
    instance, layouts = _state()["instance"], _STATE["layouts"]
    out = []
    for plan in (layouts[i] for i in indices):
        try:
            validate_layout(instance, plan)
        except LayoutError:
            out.append(Bounded("invalid"))
            continue
        check = memory_check(instance, plan)
        if not check.feasible:
            out.append(Bounded("never fits", check.deficit_bytes))
            continue
        out.append(Bounded("bounded", bound_s=time_lower_bound(instance, plan)))
    return out


def score_skeletons(indices: Sequence[int]) -> list[Scored]:
    """:class:`Scored` of the worker's layouts at ``indices`` (even split, Megatron's order)."""
    evaluator: Evaluator = _state()["evaluator"]
    out = []
    for plan in (_STATE["layouts"][i] for i in indices):
        try:
            evaluation = evaluator.evaluate(plan)
        except InfeasibleError:  # the default placement crosses a failed link
            estimate = float("inf")
            if "repaired" not in _STATE:  # once per worker: a copy of the matrix
                _STATE["repaired"] = Evaluator(repaired(_STATE["instance"]), validate=False)
            with contextlib.suppress(PipetteError):
                estimate = _STATE["repaired"].evaluate(plan).iteration_time_s
            out.append(Scored(float("inf"), float("inf"), estimate, True))
            continue
        score = evaluation.iteration_time_s if evaluation.fits else float("inf")
        out.append(Scored(score, -evaluation.memory_margin_bytes, evaluation.iteration_time_s,
                          False))  # fmt: skip
    return out


def sweep_layouts(indices: Sequence[int], options: SolveOptions) -> list[Plan | None]:
    """The greedy sweep's plans of the worker's layouts at ``indices`` (None: none)."""
    state = _state()
    instance, evaluator, layouts = state["instance"], state["evaluator"], state["layouts"]
    return [greedy_plan(instance, evaluator, layouts[i], options) for i in indices]


def solve_skeleton(skeleton: Plan, options: SolveOptions) -> Plan:
    """The method's plan of ``skeleton`` (a PipetteError propagates to the caller)."""
    return _state()["method"](_STATE["instance"], skeleton, options)


@dataclass(frozen=True)
class Metered:
    """A deterministic piece of work's result: the plan (None: the method found none,
    ``failed``: it raised a PipetteError) and the reference seconds it spent."""

    plan: Plan | None
    spent_s: float
    failed: bool = False


def _stamped(plan: Plan | None, spent_s: float) -> Plan | None:
    """``plan`` reporting its work (reference s) as its solver time: the same every run."""
    if plan is None or plan.solve_info is None:
        return plan
    info = plan.solve_info.model_copy(update={"wall_time_s": spent_s})
    return plan.model_copy(update={"solve_info": info})


def sweep_metered(indices: Sequence[int], options: SolveOptions) -> list[Metered]:
    """:func:`sweep_layouts` under the work meter, one meter per layout."""
    gpus = _state()["instance"].cluster.num_gpus
    out = []
    for i in indices:
        with work.metered(GREEDY_CAP_S) as meter:
            work.spend(GREEDY_TICKS + GREEDY_TICKS_PER_GPU * gpus)
            (plan,) = sweep_layouts([i], options)
        spent = meter.ticks / work.TICKS_PER_S
        out.append(Metered(_stamped(plan, spent), spent))
    return out


def solve_metered(skeleton: Plan, options: SolveOptions) -> Metered:
    """:func:`solve_skeleton` under the work meter, capped at ``options.work_s``."""
    with work.metered(options.work_s) as meter:
        work.spend(SOLVE_TICKS_PER_GPU * _state()["instance"].cluster.num_gpus)
        try:
            plan: Plan | None = solve_skeleton(skeleton, options)
            failed = False
        except PipetteError:  # infeasible, a layout the method cannot express, no plan
            plan, failed = None, True
    spent = meter.ticks / work.TICKS_PER_S
    return Metered(_stamped(plan, spent), spent, failed)


class Runner(Protocol):
    """Hands out the search's work (see the module docstring); ``lost``: the errors of
    a future whose worker died."""

    jobs: int
    lost: tuple[type[BaseException], ...]
    #: whether the workers share this machine's cores (idle ones may go to one solve)
    shares_cores: bool

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future: ...

    def restart(self) -> None: ...

    def close(self, abort: bool = False) -> None: ...


class InlineRunner:
    """Runs every piece of work here, at once (``jobs`` = 1)."""

    jobs = 1
    lost: tuple[type[BaseException], ...] = ()
    shares_cores = True

    def __init__(self, instance: Instance, method: str, layouts: Sequence[Plan]) -> None:
        self._args = (instance, method, layouts)
        _init(*self._args)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args))
        except Exception as exc:  # handed to the caller through the future
            future.set_exception(exc)
        return future

    def restart(self) -> None:
        _init(*self._args)

    def close(self, abort: bool = False) -> None:
        _STATE.clear()


def kill_pool(pool: ProcessPoolExecutor) -> None:
    """Cancel ``pool``'s waiting work and kill its processes, running work included (an
    interrupted run, a hung worker: none is left behind)."""
    # the pool keeps its processes in a private dict (None once shut down)
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.kill()
    for process in processes:
        process.join(timeout=5)


class ProcessRunner:
    """``jobs`` worker processes (forked where the platform can: the instance is then
    shared, not copied), each initialised with the instance and the method."""

    def __init__(self, instance: Instance, method: str, layouts: Sequence[Plan], jobs: int) -> None:
        self.jobs = jobs
        self.lost: tuple[type[BaseException], ...] = (BrokenProcessPool,)
        self.shares_cores = True
        self._args = (instance, method, layouts)
        methods = multiprocessing.get_all_start_methods()
        self._context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        self._pool = self._start()
        self._closed = False

    def _start(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            max_workers=self.jobs, mp_context=self._context, initializer=_init,
            initargs=(*self._args, True),
        )  # fmt: skip

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        return self._pool.submit(fn, *args)

    def _kill(self) -> None:
        kill_pool(self._pool)

    def restart(self) -> None:
        """Kill every worker (a hung or dead one among them) and start a new pool."""
        self._kill()
        self._pool = self._start()

    def close(self, abort: bool = False) -> None:
        """Wait for the workers to finish (``abort``: kill them: an interrupted search).

        Only the first call acts: after an abort nothing is waited for.  An interrupt can
        leave a future's lock held by this thread, and the pool's manager thread then
        never ends; waiting for it would hang the command."""
        if self._closed:
            return
        self._closed = True
        if abort:
            self._kill()
        else:
            self._pool.shutdown(wait=True, cancel_futures=True)
