"""One benchmark job (instance x method x seed x time limit) and its stored row.

:func:`run_job` is what every executor runs, in this process, a pool worker or a
Ray task; it never raises: every outcome, an empty one included, becomes a
:class:`BenchRow`.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, fields
from datetime import UTC, datetime

from pipette_cp import __version__
from pipette_cp.errors import InfeasibleError, PipetteError

#: Plans re-ranked by the simulator per job (the default of ``pipette-cp solve``).
BENCH_TOP_K = 5

#: Statuses of a job that produced a plan (the solver's own ``SolveInfo.status``).
SOLVED = ("optimal", "feasible", "heuristic", "timeout")
#: Outcome of an unexpected exception (a bug): stored for the report, retried on resume.
CRASH = "crash"


@dataclass(frozen=True)
class Job:
    """What to run; ``instance`` is a bundled name or a path, as given by the user, or
    the name of a what-if variant (``variant``: its JSON, see
    :mod:`pipette_cp.suite.variants`)."""

    instance: str
    method: str
    seed: int
    time_limit_s: float
    family: str = ""
    num_gpus: int = 0
    version: str = __version__
    variant: str = ""

    @property
    def key(self) -> tuple[str, str, int, float, str]:
        """The store's primary key."""
        return (self.instance, self.method, self.seed, self.time_limit_s, self.version)


@dataclass(frozen=True)
class BenchRow:
    """One stored result; the first five fields are the primary key.

    ``iteration_time_s`` and the fields after it describe the best plan as the
    search returned it (scored by ``predictor``: the simulator re-rank, or the
    analytic model where the simulator failed); ``analytic_time_s`` is the analytic
    model's time of the same plan.  ``objective``, ``bound``, ``gap`` and
    ``solver_wall_time_s`` are the solver's own report for that plan;
    ``wall_time_s`` is the whole search.  Plan fields are ``None`` when no plan
    was found (``status`` infeasible, error or crash; ``message`` says why).
    ``variant``: the parameters of a what-if variant as JSON (``instance`` is then its
    name, :mod:`pipette_cp.suite.variants`), empty for an instance as it is.
    """

    instance: str
    method: str
    seed: int
    time_limit_s: float
    version: str
    family: str
    num_gpus: int
    status: str
    wall_time_s: float
    timestamp: str
    message: str = ""
    predictor: str = ""
    layout: str = ""
    iteration_time_s: float | None = None
    analytic_time_s: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    memory_bytes_max: float | None = None
    fits: bool | None = None
    objective: float | None = None
    bound: float | None = None
    gap: float | None = None
    solver_wall_time_s: float | None = None
    plan_json: str | None = None
    variant: str = ""

    @property
    def key(self) -> tuple[str, str, int, float, str]:
        return (self.instance, self.method, self.seed, self.time_limit_s, self.version)

    @property
    def solved(self) -> bool:
        """Whether the row holds a plan that fits."""
        return self.status in SOLVED and bool(self.fits) and self.iteration_time_s is not None


#: Column names in storage order.
COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(BenchRow))


def now_utc() -> str:
    """ISO 8601 timestamp, seconds, UTC."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def failed_row(job: Job, status: str, message: str, wall_time_s: float = 0.0) -> BenchRow:
    """The row of a job that produced no plan."""
    return BenchRow(
        *job.key,
        family=job.family,
        num_gpus=job.num_gpus,
        status=status,
        wall_time_s=wall_time_s,
        timestamp=now_utc(),
        message=message,
        variant=job.variant,
    )


def run_job(job: Job) -> BenchRow:
    """Solve one job with :func:`pipette_cp.api.solve_with_stats`; never raises."""
    # imported here so that a pool worker or Ray task pays for the solvers only once used
    from pipette_cp.api import solve_with_stats
    from pipette_cp.cost.evaluator.evaluate import Evaluator
    from pipette_cp.io.instance_file import load_instance

    start = time.perf_counter()
    try:
        if job.variant:
            from pipette_cp.suite.variants import Variant

            instance = Variant.from_json(job.variant).build()
        else:
            instance = load_instance(job.instance)
        result = solve_with_stats(
            instance,
            method=job.method,
            top_k=BENCH_TOP_K,
            time_limit_s=job.time_limit_s,
            seed=job.seed,
        )
        plan = result.plans[0].model_copy(update={"instance": job.instance})
        analytic = Evaluator(instance).iteration_time(plan)
    except InfeasibleError as exc:
        return failed_row(job, "infeasible", str(exc), time.perf_counter() - start)
    except PipetteError as exc:
        return failed_row(job, "error", f"{type(exc).__name__}: {exc}", time.perf_counter() - start)
    except Exception as exc:  # a bug: keep the bench going, show it in the report
        last = traceback.extract_tb(exc.__traceback__)[-1]
        where = f" at {last.filename}:{last.lineno}"
        message = f"{type(exc).__name__}: {exc}{where}"
        return failed_row(job, CRASH, message, time.perf_counter() - start)
    wall = time.perf_counter() - start
    ev, info = plan.evaluation, plan.solve_info
    assert ev is not None and info is not None  # every plan of the search carries both
    return BenchRow(
        *job.key,
        family=job.family,
        num_gpus=job.num_gpus,
        status=info.status,
        wall_time_s=wall,
        timestamp=now_utc(),
        predictor=ev.model,
        layout=plan.layout(),
        iteration_time_s=ev.iteration_time_s,
        analytic_time_s=analytic,
        tokens_per_s=ev.tokens_per_s,
        mfu=ev.mfu,
        memory_bytes_max=ev.memory_bytes_max,
        fits=ev.fits,
        objective=info.objective,
        bound=info.bound,
        gap=info.gap,
        solver_wall_time_s=info.wall_time_s,
        plan_json=plan.model_dump_json(),
        variant=job.variant,
    )
