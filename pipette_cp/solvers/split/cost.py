"""What the layer-split models minimise and respect, as functions of the split alone.

For a fixed plan (degrees, knobs, placement) every cost that the split changes
is a simple function of the layer counts ``n_v`` of the virtual stages
``v = chunk * pp + stage`` (:class:`~pipette_cp.specs.Plan`):

- forward / backward time of a virtual stage: ``n_v`` x the per-layer time of
  its stage (GPU type, TP bandwidth) + the embedding (``v = 0``) or LM head
  (``v = last``) extra (:func:`pipette_cp.cost.compute.model_chunks.chunk_times`: an outer
  product plus two boundary terms, so *affine*);
- per stage, the DP gradient sync, the distributed optimizer's parameter gather
  and the optimizer step depend on the stage's parameters, i.e. on its layer
  total ``k_s``: tabulated for every ``k_s`` (the DP sync is the faster of a
  ring and a two-level all-reduce, a minimum of affine functions, so it need
  not be convex; :attr:`SplitCost.convex` says whether it is);
- memory of a stage: ``C_s + W_s k_s + X_s max_c n_{c,s}``
  (:func:`pipette_cp.cost.memory.peak.stage_memory`: states per parameter, and
  activations of the largest chunk x the in-flight chunk micro-batches).

All coefficients are read off the cost modules at a few splits (never
re-derived), so the models stay exact as the cost models change (the tests
check the affine forms at random splits).  The iteration time is the analytic
critical-path model (:func:`pipette_cp.cost.schedule.critical_path.pipeline_times`).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, replace

import numpy as np

from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.cost.memory.peak import memory_by_stage, usable_memory_bytes
from pipette_cp.cost.schedule.critical_path import PipelineInputs, finish_iteration, pipeline_times
from pipette_cp.cost.workload.bf16_layers import keeps_bf16_layers
from pipette_cp.errors import InfeasibleError, LayoutError
from pipette_cp.solvers.cuts import Cut, supporting_cut
from pipette_cp.specs import Instance, Plan
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.training import TrainingSpec
from pipette_cp.units import GB

#: Relative hair of the finite-difference cuts (supporting_cut's default is 1e-7): the
#: pieces of the time function are ~0.01-1 layer wide away from ties, so 1e-6 x the
#: largest chunk stays inside them and cuts 10 x less rounding noise into the gradient.
CUT_STEP = 1e-6


@dataclass(frozen=True)
class MemoryModel:
    """Stage memory ``C + W k_s + X max_c n_{c,s}`` against the stage's usable memory.

    In integers (bytes): ``W k_s + X n_{c,s} <= R`` for every chunk ``c`` of stage
    ``s`` (:attr:`integer_rows`: ``W``, ``X`` rounded up, ``R = limit - C`` down, so
    an integer-feasible split passes :func:`pipette_cp.checker.check_memory_limit`);
    the solvers get the same integer set as small-integer :meth:`facets`.  With
    ``vpp = 1``, ``X = 0`` and ``W`` holds the activations too.
    """

    const_bytes: np.ndarray
    per_layer_bytes: np.ndarray
    per_chunk_layer_bytes: np.ndarray
    limit_bytes: np.ndarray

    @property
    def integer_rows(self) -> tuple[list[int], list[int], list[int]]:
        """``(W, X, R)`` per stage, bytes (the one place memory is made integral)."""
        w = [math.ceil(v) for v in self.per_layer_bytes]
        x = [math.ceil(v) for v in self.per_chunk_layer_bytes]
        r = [math.floor(v) for v in self.limit_bytes - self.const_bytes]
        return w, x, r

    def facets(self, stage: int, k_min: int, k_max: int) -> tuple[int, list[tuple[int, int, int]]]:
        """The integer points of ``W k + X n <= R`` (``k_min <= k <= k_max``, ``n >= 1``)
        as ``k <= K`` and rows ``a k + b n <= c`` with small integers.

        The rows are the upper convex hull of ``(k, M(k))``, ``M(k) = floor((R - W k) / X)``;
        since every ``M(k)`` lies within 1 below the line ``(R - W k) / X``, the hull lies
        below that line and an integer point under the hull is under the line: the
        facets describe exactly the same integer points.  ``K < k_min`` when none fits.
        """
        w, x, r = (v[stage] for v in self.integer_rows)
        ks = [k for k in range(k_min, k_max + 1) if w * k + x <= r]  # room for n >= 1
        if not ks:
            return k_min - 1, []
        if x == 0:
            return ks[-1], []
        hull: list[tuple[int, int]] = []
        for k in ks:
            point = (k, (r - w * k) // x)
            while len(hull) >= 2:
                (k1, m1), (k2, m2) = hull[-2], hull[-1]
                # drop the middle point if it lies on or below the chord (upper hull)
                if (m2 - m1) * (point[0] - k1) <= (point[1] - m1) * (k2 - k1):
                    hull.pop()
                else:
                    break
            hull.append(point)
        if len(hull) == 1:
            return ks[-1], [(0, 1, hull[0][1])]
        rows = []
        for (k1, m1), (k2, m2) in itertools.pairwise(hull):
            a, b = m1 - m2, k2 - k1
            g = math.gcd(a, b)
            rows.append((a // g, b // g, (a * k1 + b * m1) // g))
        return ks[-1], rows

    def stage_bytes(self, split: np.ndarray, pp: int) -> np.ndarray:
        """Predicted peak of every stage for ``split`` (float), bytes."""
        chunks = np.asarray(split, dtype=float).reshape(-1, pp)
        return (
            self.const_bytes
            + self.per_layer_bytes * chunks.sum(axis=0)
            + self.per_chunk_layer_bytes * chunks.max(axis=0)
        )

    def fits(self, split: np.ndarray, pp: int) -> np.ndarray:
        """Per stage, whether ``split`` satisfies the integer rows (what the solvers impose)."""
        w, x, r = (np.array(a, dtype=np.int64) for a in self.integer_rows)
        chunks = np.asarray(split, dtype=np.int64).reshape(-1, pp)
        return w * chunks.sum(axis=0) + x * chunks.max(axis=0) <= r


@dataclass(frozen=True)
class SplitCost:
    """Iteration time and memory of one plan as functions of its layer split.

    Build it with :func:`split_cost`.  ``tails`` has shape ``(3, pp, K + 2)``: the
    DP gradient sync, parameter gather and optimizer step of each stage for
    ``k = 0 .. K + 1`` layers on it (linearly interpolated between integers);
    ``envelope`` is its lower convex hull in ``k`` (equal to it when
    :attr:`convex`), used for the cutting planes.  ``chunk_spread``: with
    ``vpp > 1``, the largest allowed difference between two chunks of one stage
    (``None``: any); see :data:`pipette_cp.solvers.split.CHUNK_SPREAD`.
    """

    num_layers: int
    pp: int
    vpp: int
    base: PipelineInputs
    forward_slope_s: np.ndarray
    forward_const_s: np.ndarray
    backward_slope_s: np.ndarray
    backward_const_s: np.ndarray
    tails: np.ndarray
    envelope: np.ndarray
    memory: MemoryModel
    chunk_spread: int | None = None
    #: whether every layer costs the same (the affine forms are then exact; a hybrid
    #: model's sublayers, or dense layers among MoE ones, make them an approximation)
    exact: bool = True

    @property
    def num_chunks(self) -> int:
        """Virtual stages ``pp * vpp``: the length of a split."""
        return self.pp * self.vpp

    @property
    def convex(self) -> bool:
        """Whether the iteration time is convex in the split (cuts then prove optimality)."""
        return bool(np.allclose(self.tails, self.envelope, rtol=1e-12, atol=0.0))

    def stage_layers(self, split: np.ndarray) -> np.ndarray:
        """Layers ``k_s`` of every stage (all its chunks)."""
        return np.asarray(split, dtype=float).reshape(self.vpp, self.pp).sum(axis=0)

    def inputs(self, split: np.ndarray, *, relaxed: bool = False) -> PipelineInputs:
        """The schedule inputs of ``split`` (real-valued splits allowed)."""
        n = np.asarray(split, dtype=float)
        k = self.stage_layers(n)
        lo = np.clip(np.floor(k).astype(int), 0, self.tails.shape[2] - 2)
        frac = (k - lo)[None, :]
        table = self.envelope if relaxed else self.tails
        rows = np.arange(self.pp)
        tail = table[:, rows, lo] * (1 - frac) + table[:, rows, lo + 1] * frac
        return replace(
            self.base,
            forward_s=self.forward_slope_s * n + self.forward_const_s,
            backward_s=self.backward_slope_s * n + self.backward_const_s,
            dp_sync_s=tail[0],
            param_gather_s=tail[1],
            optimizer_s=tail[2],
        )

    def _time(self, split: np.ndarray, relaxed: bool) -> float:
        x = self.inputs(split, relaxed=relaxed)
        times = pipeline_times(x)
        return finish_iteration(x, times.stage_end_s, times.last_backward_s).total_s

    def iteration_time_s(self, split: np.ndarray) -> float:
        """Analytic iteration time of ``split``: for integer splits exactly what
        :meth:`pipette_cp.cost.evaluator.evaluate.Evaluator.evaluate` predicts when
        :attr:`exact` (layers of unequal cost: an approximation)."""
        return self._time(split, relaxed=False)

    def relaxed_time_s(self, split: np.ndarray) -> float:
        """The iteration time with the convex envelope of the per-stage tail tables:
        convex and piecewise linear in ``split``, never above :meth:`iteration_time_s`."""
        return self._time(split, relaxed=True)

    def cut(self, split: np.ndarray, rng: np.random.Generator) -> Cut:
        """Kelley cut ``t >= intercept + gradient . n`` of the relaxed time, tight at ``split``.

        Finite differences over a hair of ``CUT_STEP`` x the largest chunk: rounding
        makes a cut valid up to ~1e-9 x the time per layer of distance (measured),
        far below :data:`pipette_cp.solvers.split.TOLERANCE`.
        """
        x = np.asarray(split, dtype=float)
        return supporting_cut(self.relaxed_time_s, x, rng=rng, relative_step=CUT_STEP)

    def cuts_around(
        self, split: np.ndarray, rng: np.random.Generator, deadline_s: float = math.inf
    ) -> list[Cut]:
        """The cut at ``split`` and at each of its neighbours ``split + e_v - e_w``
        (one layer moved onto ``v`` from the chunk ``w`` with the largest marginal time).

        At a balanced split many pieces of the time function are one layer away
        ("stage v becomes the bottleneck"); an optimality proof needs them all and
        plain Kelley would find them one master solve at a time.  Duplicates dropped;
        stops early at ``deadline_s`` (a :func:`time.perf_counter` reading).
        """
        x = np.asarray(split, dtype=float)
        found = [self.cut(x, rng)]
        order = np.argsort(-found[0].gradient)
        for v in range(self.num_chunks):
            if time.perf_counter() > deadline_s:
                break
            w = next((int(u) for u in order if u != v and x[u] > 1), None)
            if w is None:
                continue
            y = x.copy()
            y[v] += 1
            y[w] -= 1
            cut = self.cut(y, rng)
            # finite differences carry ~1e-7 relative noise: same piece within 1e-5
            if not any(np.allclose(cut.gradient, c.gradient, rtol=1e-5, atol=1e-9) for c in found):
                found.append(cut)
        return found

    def fits(self, split: np.ndarray) -> bool:
        """Whether every stage of ``split`` fits in memory (the solvers' integer rows)."""
        return bool(self.memory.fits(split, self.pp).all())

    def balanced(self, split: np.ndarray) -> bool:
        """Whether the chunks of every stage differ by at most :attr:`chunk_spread`."""
        if self.chunk_spread is None or self.vpp == 1:
            return True
        chunks = np.asarray(split).reshape(self.vpp, self.pp)
        return bool((chunks.max(axis=0) - chunks.min(axis=0) <= self.chunk_spread).all())

    def allowed(self, split: np.ndarray) -> bool:
        """Whether ``split`` satisfies every constraint family of the split models."""
        return self.fits(split) and self.balanced(split)

    def memory_facets(self, stage: int) -> tuple[int, list[tuple[int, int, int]]]:
        """:meth:`MemoryModel.facets` of ``stage`` over its possible layer totals."""
        top = self.num_layers - (self.pp - 1) * self.vpp
        return self.memory.facets(stage, self.vpp, top)

    def stage_capacity(self) -> np.ndarray:
        """Most layers each stage can hold, its chunks as even as possible (0 if not ``vpp``)."""
        w, x, r = self.memory.integer_rows
        top = self.num_layers - (self.pp - 1) * self.vpp
        caps = np.zeros(self.pp, dtype=int)
        for s in range(self.pp):
            for k in range(self.vpp, top + 1):
                if w[s] * k + x[s] * -(-k // self.vpp) > r[s]:
                    break
                caps[s] = k
        return caps

    def require_feasible(self) -> np.ndarray:
        """The stage capacities; :class:`InfeasibleError` when no split fits in memory.

        Names the stage with the largest deficit at its minimum (one layer per
        chunk), or, when each stage fits alone, the total the stages can hold.
        """
        caps = self.stage_capacity()
        least = self.memory.stage_bytes(np.ones(self.num_chunks), self.pp)
        if (caps == 0).any():
            s = int(np.argmax(np.where(caps == 0, least - self.memory.limit_bytes, -np.inf)))
            layers = f"{self.vpp} layers ({self.vpp} chunks of 1)" if self.vpp > 1 else "1 layer"
            raise InfeasibleError(
                f"stage {s} needs >= {least[s] / GB:.1f} GB with {layers}, "
                f"{self.memory.limit_bytes[s] / GB:.1f} GB usable: no layer split fits"
            )
        if caps.sum() < self.num_layers:
            raise InfeasibleError(
                f"the {self.pp} stages hold at most {int(caps.sum())} layers within their "
                f"usable memory (per stage {caps.tolist()}), the model has {self.num_layers}"
            )
        return caps


def _lower_hull(values: np.ndarray) -> np.ndarray:
    """Lower convex envelope of ``values`` over ``0 .. n-1``, evaluated at the integers."""
    hull: list[int] = []
    for i, y in enumerate(values):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # drop b if it lies on or above the segment a -> i
            if (values[b] - values[a]) * (i - a) >= (y - values[a]) * (b - a):
                hull.pop()
            else:
                break
        hull.append(i)
    return np.interp(np.arange(len(values)), hull, values[hull])


def _tails(evaluator: Evaluator, plan: Plan, top: int) -> np.ndarray:
    """(dp sync, param gather, optimizer) of every stage holding ``k = 0 .. top + 1`` layers."""
    pp, chunks = plan.pp, plan.pp * plan.vpp

    def at(k: int) -> np.ndarray:
        split = (k,) * pp + (0,) * (chunks - pp)  # stage params depend on k_s only
        x, _ = evaluator.pipeline_inputs(plan.model_copy(update={"layer_split": split}))
        return np.stack([x.dp_sync_s, x.param_gather_s, x.optimizer_s])

    ks = np.arange(top + 2)
    if plan.replicas == 1:
        # no DP traffic: only the optimizer step, linear in the parameters (HBM-bound)
        first, last = at(0), at(top + 1)
        return first[..., None] + (last - first)[..., None] * ks / (top + 1)
    return np.stack([at(int(k)) for k in ks], axis=-1)


def split_cost(
    instance: Instance,
    plan: Plan,
    evaluator: Evaluator | None = None,
    *,
    chunk_spread: int | None = None,
) -> SplitCost:
    """The split-dependent costs of ``plan`` on ``instance`` (placement and knobs fixed).

    Raises
    ------
    LayoutError
        Fewer layers than model chunks.
    InfeasibleError
        A link the plan needs has failed (from the evaluator).
    """
    if instance.model.num_layers < plan.pp * plan.vpp:
        raise LayoutError("plan.pp*vpp", plan.pp * plan.vpp, "more model chunks than layers")
    ev = evaluator or Evaluator(instance, validate=False)
    pp, vpp, chunks = plan.pp, plan.vpp, plan.pp * plan.vpp
    layers = instance.model.num_layers

    def with_split(split: tuple[int, ...]) -> Plan:
        return plan.model_copy(update={"layer_split": split})

    one = ev.pipeline_inputs(with_split((1,) * chunks))[0]
    two = ev.pipeline_inputs(with_split((2,) * chunks))[0]
    f_slope, b_slope = two.forward_s - one.forward_s, two.backward_s - one.backward_s
    top = layers - (pp - 1) * vpp
    tails = _tails(ev, plan, top)
    envelope = np.stack([[_lower_hull(row) for row in part] for part in tails])
    model, training, cluster = instance.model, instance.training, instance.cluster

    def mem(split: tuple[int, ...]) -> np.ndarray:
        return np.array(
            [b.bound_bytes for b in memory_by_stage(model, training, with_split(split))]
        )

    m1, m2 = mem((1,) * chunks), mem((2,) * chunks)
    if vpp == 1:
        w, x = m2 - m1, np.zeros(pp)
    else:  # chunk 0 of every stage doubled: k = vpp + 1, max chunk 2
        m_first = mem((2,) * pp + (1,) * (chunks - pp))
        w = (m2 - m_first) / (vpp - 1)
        x = m_first - m1 - w
    const = m1 - w * vpp - x
    # as check_memory_limit: the smallest usable memory among the stage's GPUs
    usable = [usable_memory_bytes(cluster.gpu_of_node(cluster.node_of(g)), training) for g in range(cluster.num_gpus)]  # fmt: skip
    limits = np.array([min(usable[g] for d in range(plan.replicas) for g in plan.unit_gpus(s, d)) for s in range(pp)])  # fmt: skip
    return SplitCost(
        num_layers=layers, pp=pp, vpp=vpp, base=one,
        forward_slope_s=f_slope, forward_const_s=one.forward_s - f_slope,
        backward_slope_s=b_slope, backward_const_s=one.backward_s - b_slope,
        tails=tails, envelope=envelope, memory=MemoryModel(const, w, x, limits),
        chunk_spread=chunk_spread, exact=uniform_layers(model, training),
    )  # fmt: skip


def uniform_layers(model: ModelSpec, training: TrainingSpec) -> bool:
    """Whether every layer of ``model`` costs the same: no hybrid pattern, either no
    experts or experts in every layer, and no layer kept in bf16 under a quantised
    precision (:mod:`pipette_cp.cost.workload.bf16_layers`)."""
    uniform_kinds = not model.is_hybrid and (not model.is_moe or model.num_dense_layers == 0)
    return uniform_kinds and not keeps_bf16_layers(training)


# -------------------------------------------------------- master problem result
@dataclass(frozen=True)
class MasterSolution:
    """One solve of a cutting-plane master (CP-SAT or MILP), times in seconds.

    ``status``: ``optimal``, ``feasible`` (time ran out with a solution), ``unknown``
    (without one) or ``infeasible``; ``objective_s``: the master's ``t`` at ``split``;
    ``bound_s``: a proven lower bound of the master's optimum (``-inf`` if none).
    """

    status: str
    split: np.ndarray | None
    objective_s: float
    bound_s: float
