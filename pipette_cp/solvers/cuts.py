"""Supporting hyperplanes of a convex piecewise-linear cost: the glue between the
analytic critical-path model and the linear (CP-SAT / MILP) master problems.

The analytic iteration time (:mod:`pipette_cp.cost.schedule.critical_path`) is built from
sums with non-negative weights and maxima of affine terms of the per-stage
times and per-hop transfer times, so as a function of those inputs it is
convex and piecewise linear.  Kelley's cutting-plane method (Kelley 1960,
"The cutting-plane method for solving convex programs") therefore minimises it
*exactly* with a linear master: every cut ``t >= f(x_k) + g_k . (x - x_k)``
with ``g_k`` the gradient of the affine piece active at ``x_k`` under-estimates
``f`` everywhere, so the master's optimum is a valid lower bound, and the
method stops when the master's ``t`` meets ``f`` at its own solution.

At a point where several pieces tie (common: equal stages, equal links), a
finite difference may step across a kink and mix two pieces' slopes, giving a
plane that cuts off part of the function.  :func:`supporting_cut` therefore moves
to a random point a hair away, where exactly one piece is active with probability
one, and accepts a slope only where the forward and backward quotients agree; the
plane is that piece's, valid everywhere and tight at the original point.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pipette_cp.errors import SolverTimeoutError

#: Hairs drawn before :func:`supporting_cut` gives up.
HAIR_DRAWS = 6


@dataclass(frozen=True)
class Cut:
    """``t >= intercept + gradient . x``, valid for every ``x`` (up to ``slack``)."""

    intercept: float
    gradient: np.ndarray
    value_at_point: float
    #: bound on each slope's rounding error (0 where unknown)
    error: np.ndarray | None = None

    def __call__(self, x: np.ndarray) -> float:
        return float(self.intercept + self.gradient @ np.asarray(x, dtype=float))


def supporting_cut(
    f: Callable[[np.ndarray], float],
    x: np.ndarray,
    *,
    rng: np.random.Generator | None = None,
    relative_step: float = 1e-6,
    slack: float = 1e-9,
    expired: Callable[[], bool] | None = None,
) -> Cut:
    """A hyperplane supporting the convex piecewise-linear ``f`` at ``x``: the gradient
    of a piece active at ``x``, which under-estimates ``f`` everywhere.

    ``f`` must be convex and piecewise linear.  Pieces that tie at ``x`` are
    separated by a random hair ``t u`` (``t = relative_step`` x the largest input,
    ``u`` in [1/2, 1]): at ``x + t u`` one piece is active with probability one.
    Its gradient is taken by central differences of step ``t / 64``, each
    coordinate accepted only when its forward and backward quotients agree (a step
    that crosses a kink makes them differ: a large slope next to a small one,
    32 micro-batches over a pipeline hop beside 1, crosses even for small steps);
    a disagreeing coordinate is retried with smaller steps down to ``t / 4096``,
    then the hair is redrawn.  ``Cut.error`` bounds each slope's rounding.  A convex ``f`` that is linear along every axis
    through a point is differentiable there, so the accepted quotients are its
    gradient.  The intercept is lowered by ``slack`` x ``|f(x)|`` and by the
    quotients' rounding over the hair, so that rounding never cuts off the optimum.

    Raises
    ------
    ValueError
        No hair among :data:`HAIR_DRAWS` gives agreeing quotients (``f`` is not
        piecewise linear at this scale).
    SolverTimeoutError
        ``expired()`` turned true between two coordinates (one cut costs two values of
        ``f`` a coordinate, minutes where ``f`` prices thousands of GPUs).

    Examples
    --------
    >>> cut = supporting_cut(lambda v: float(max(v[0], v[1]) + 2 * v[1]), np.array([1.0, 1.0]))
    >>> cut(np.array([3.0, 0.0])) <= 3.0 + 1e-6
    True
    >>> f = lambda v: float(max(32 * v[0] + v[1], v[0] + 32 * v[1]))  # a tie, slopes 32 and 1
    >>> all(cut(p) <= f(p) + 1e-5 for p in np.random.default_rng(1).random((100, 2))
    ...     for cut in [supporting_cut(f, np.array([0.5, 0.5]), rng=np.random.default_rng(s))
    ...                 for s in range(20)])
    True
    """
    x = np.asarray(x, dtype=float)
    rng = rng or np.random.default_rng(0)
    value = f(x)
    hair = relative_step * max(float(np.abs(x).max(initial=0.0)), 1e-12)
    for _ in range(HAIR_DRAWS):
        base = x + rng.uniform(0.5, 1.0, size=x.shape) * hair
        found = _gradient(f, base, hair, expired)
        if found is not None:
            gradient, f_base, errors = found
            intercept = f_base - float(gradient @ base) - float(errors.sum()) * hair
            return Cut(intercept - slack * abs(value), gradient, value, errors)
    raise ValueError("no hair gives agreeing difference quotients: f is not piecewise linear")


def _gradient(
    f: Callable[[np.ndarray], float], base: np.ndarray, hair: float,
    expired: Callable[[], bool] | None = None,
) -> tuple[np.ndarray, float, np.ndarray] | None:  # fmt: skip
    """``(gradient, f(base), each slope's rounding bound)`` where every axis through
    ``base`` is linear over the step, else None.  Steps start at 1/64 of the hair and
    shrink where the quotients disagree."""
    f_base = f(base)
    rounding = 8 * np.finfo(float).eps * max(abs(f_base), 1e-300)  # error of one f value
    gradient = np.empty_like(base)
    errors = np.zeros_like(base)
    for i in range(base.size):
        if expired is not None and expired():
            raise SolverTimeoutError("the time limit ran out while building a cut")
        step = hair / 64
        while step >= hair / 4096:
            moved = base.copy()
            moved[i] = base[i] + step
            up = f(moved)
            moved[i] = base[i] - step
            down = f(moved)
            forward, backward = (up - f_base) / step, (f_base - down) / step
            error = 2 * rounding / step
            if abs(forward - backward) <= 2 * error + 1e-9 * (abs(forward) + abs(backward)):
                gradient[i] = 0.5 * (forward + backward)
                errors[i] = error
                break
            step /= 4
        else:
            return None
    return gradient, f_base, errors
