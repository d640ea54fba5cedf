"""Supporting hyperplanes of a convex piecewise-linear cost: the glue between the
analytic critical-path model and the linear (CP-SAT / MILP) master problems.

The analytic iteration time (:mod:`pipette_cp.cost.pipeline`) is built from
sums with non-negative weights and maxima of affine terms of the per-stage
times and per-hop transfer times, so as a function of those inputs it is
convex and piecewise linear.  Kelley's cutting-plane method (Kelley 1960,
"The cutting-plane method for solving convex programs") therefore minimises it
*exactly* with a linear master: every cut ``t >= f(x_k) + g_k . (x - x_k)``
with ``g_k`` the gradient of the affine piece active at ``x_k`` under-estimates
``f`` everywhere, so the master's optimum is a valid lower bound, and the
method stops when the master's ``t`` meets ``f`` at its own solution.

At a point where several pieces tie (common: equal stages), forward
differences need not give a subgradient.  :func:`supporting_cut` therefore
moves to a random point a hair away, where exactly one piece is active with
probability one, and returns that piece's hyperplane; it is a valid cut
everywhere and tight at the original point up to the hair's width.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Cut:
    """``t >= intercept + gradient . x``, valid for every ``x`` (up to ``slack``)."""

    intercept: float
    gradient: np.ndarray
    value_at_point: float

    def __call__(self, x: np.ndarray) -> float:
        return float(self.intercept + self.gradient @ np.asarray(x, dtype=float))


def supporting_cut(
    f: Callable[[np.ndarray], float],
    x: np.ndarray,
    *,
    rng: np.random.Generator | None = None,
    relative_step: float = 1e-7,
    slack: float = 1e-9,
) -> Cut:
    """A hyperplane supporting the convex piecewise-linear ``f`` near ``x``.

    ``f`` must be convex and piecewise linear with pieces wider than about
    ``relative_step`` x the scale of ``x`` (true for the schedule models: their
    kinks sit where two stage or hop times are equal).  The returned intercept
    is lowered by ``slack`` x ``|f(x)|`` so that rounding never cuts off the
    optimum.

    Examples
    --------
    >>> cut = supporting_cut(lambda v: float(max(v[0], v[1]) + 2 * v[1]), np.array([1.0, 1.0]))
    >>> cut(np.array([3.0, 0.0])) <= 3.0 + 1e-6
    True
    """
    x = np.asarray(x, dtype=float)
    rng = rng or np.random.default_rng(0)
    scale = max(float(np.abs(x).max(initial=0.0)), 1e-12)
    hair = relative_step * scale
    base = x + rng.uniform(0.25, 1.0, size=x.shape) * hair
    f_base = f(base)
    step = hair / 16
    gradient = np.empty_like(x)
    for i in range(x.size):
        moved = base.copy()
        moved[i] += step
        gradient[i] = (f(moved) - f_base) / step
    intercept = f_base - float(gradient @ base)
    value = f(x)
    return Cut(intercept - slack * abs(value), gradient, value)
