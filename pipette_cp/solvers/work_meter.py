"""The work meter: the clock of a deterministic solve (``--deterministic``).

A solve under :func:`metered` reads :func:`now` instead of the wall clock: a virtual
clock that advances only by the work done (:func:`spend`), in *reference seconds*:
one reference second is :data:`TICKS_PER_S` ticks, about one second of work on the
reference machine (2 cores, the CI runner the costs below were measured on).  CP-SAT
advances it by its own deterministic time (``max_deterministic_time`` stops it; the
unit is as close as OR-Tools can make it to a second); the Python heuristics by a
fixed cost per step (a local-search trial, an annealing move, an evaluation).  Same
work, same readings, bit for bit, on any machine and under any load.

Outside :func:`metered`, :func:`now` is :func:`time.perf_counter` and :func:`spend`
does nothing: the solvers keep their wall-clock budgets.  Virtual readings are
negative (from :data:`ORIGIN_S`), so a deadline that code outside the meter takes
from the wall clock always lies ahead of them: such code stops at its own
convergence or at the meter's cap (:func:`exhausted`), never at a clock reading.
The meter is per process (every worker meters its own piece of work).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

#: Ticks per reference second (a tick: 1 us of work on the reference machine).
TICKS_PER_S = 1_000_000
#: Where the virtual clock starts (s): below any wall-clock reading.
ORIGIN_S = -1.0e6
#: Measured costs on the reference machine, ticks: one placement local-search trial
#: per unit of the layout, one evaluation of a plan by the analytic Evaluator, one
#: move of Pipette's annealer per node, one split cut (heuristic balancing step).
#: Only the ratios matter to how long a budget takes; the results depend on none.
TRIAL_TICKS, TRIAL_TICKS_PER_UNIT = 100, 20
EVALUATION_TICKS = 1_000
ANNEAL_TICKS_PER_NODE = 6
CUT_TICKS = 8_000
#: One placement cut (:meth:`~pipette_cp.solvers.placement.kelley.CutPool.add_at`), and
#: one round of Kelley's loop besides its master solve and cuts (hints, values), ticks.
POOL_CUT_TICKS = 3_000
ROUND_TICKS = 5_000
#: Reference seconds per unit of CP-SAT's deterministic time (measured 2.4-3.4 on the
#: reference machine, model loading and presolve included).
CPSAT_S_PER_DET = 3.0


@dataclass
class Meter:
    """Ticks spent since :func:`metered` started, and the most it may spend (None: no cap)."""

    ticks: int = 0
    cap_ticks: int | None = None


_METER: Meter | None = None


def ticks_of(seconds: float) -> int:
    """Reference seconds as whole ticks (rounded down, at least 0)."""
    return max(int(seconds * TICKS_PER_S), 0)


def active() -> bool:
    """Whether a deterministic solve is metering this process."""
    return _METER is not None


def now() -> float:
    """The meter's virtual clock (s) under :func:`metered`, else ``time.perf_counter()``."""
    if _METER is None:
        return time.perf_counter()
    return ORIGIN_S + _METER.ticks / TICKS_PER_S


def spend(ticks: int) -> None:
    """Count ``ticks`` of work (nothing outside :func:`metered`)."""
    if _METER is not None:
        _METER.ticks += max(int(ticks), 0)


def spend_s(seconds: float) -> None:
    """Count ``seconds`` of reference work."""
    spend(ticks_of(seconds))


def spend_cpsat(deterministic_time: float) -> None:
    """Count a CP-SAT solve by its deterministic time (:data:`CPSAT_S_PER_DET`)."""
    spend(ticks_of(CPSAT_S_PER_DET * deterministic_time))


def spent_s() -> float:
    """Reference seconds spent under the current :func:`metered` (0 outside)."""
    return 0.0 if _METER is None else _METER.ticks / TICKS_PER_S


def exhausted() -> bool:
    """Whether the meter's cap is spent (never outside :func:`metered`)."""
    m = _METER
    return m is not None and m.cap_ticks is not None and m.ticks >= m.cap_ticks


def left_s(limit_s: float) -> float:
    """``limit_s`` cut to what the cap leaves (reference s; ``limit_s`` outside the meter)."""
    m = _METER
    if m is None or m.cap_ticks is None:
        return limit_s
    return min(limit_s, (m.cap_ticks - m.ticks) / TICKS_PER_S)


@contextmanager
def metered(cap_s: float | None = None) -> Iterator[Meter]:
    """Meter the work inside (a fresh virtual clock from :data:`ORIGIN_S`; ``cap_s``:
    the most reference seconds it may spend).  Nested, the inner meter counts on its
    own and its work is added to the outer one when it ends."""
    global _METER
    outer = _METER
    meter = Meter(0, None if cap_s is None else ticks_of(cap_s))
    _METER = meter
    try:
        yield meter
    finally:
        _METER = outer
        if outer is not None:
            outer.ticks += meter.ticks


def deterministic(
    enabled: bool, cap_s: float | None = None
) -> AbstractContextManager[Meter | None]:
    """:func:`metered` when ``enabled``, else no meter (a context manager either way)."""
    return _maybe(enabled, cap_s)


@contextmanager
def _maybe(enabled: bool, cap_s: float | None) -> Iterator[Meter | None]:
    if not enabled:
        yield None
        return
    with metered(cap_s) as meter:
        yield meter


def limit(solver: Any, seconds: float, workers: int, seed: int) -> None:
    """Stop a ``cp_model.CpSolver`` after ``seconds``: wall-clock seconds, or under the
    meter deterministic ones (no wall-clock limit at all), within the meter's cap.

    CP-SAT is deterministic for a fixed seed and worker count with one worker, or with
    ``interleave_search`` (which then schedules its subsolvers in fixed batches and is
    deterministic for any worker count): so under the meter several workers interleave."""
    params = solver.parameters
    params.random_seed = seed
    params.num_workers = max(workers, 1)
    if _METER is None:
        params.max_time_in_seconds = seconds
        return
    params.max_deterministic_time = max(left_s(seconds) / CPSAT_S_PER_DET, 1e-3)
    if workers > 1:
        params.interleave_search = True
