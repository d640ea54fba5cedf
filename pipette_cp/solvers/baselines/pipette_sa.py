"""Pipette's (DATE 2024) whole-node placement by simulated annealing, re-implemented.

Source read: github.com/yimjinkyu1/date2024_pipette (commit 5715ef7), files
``Megatron-LM-2.5/strategy/merge4/mh_simulated_annealing_opt.py`` (class
``MetaHeuristics``: ``objective``, the five moves, ``annealing``, ``sa_run``),
``.../merge4/llm_train_strategy_assignment_total_v3.py`` (``get_pp_msg_size``,
``get_dp_msg_size``, ``get_cost_opt``, the main loop and the SA defaults) and
``Megatron-LM-2.5/megatron/mpu/initialize.py`` (``initialize_model_parallel``,
``args.topo_aware`` branch: how the node grid becomes process groups).  No code
was copied (the repository has no licence); this is a re-implementation.

Reproduced as the code does it
------------------------------
- State: a permutation of the N nodes read as an (N/p) x p grid; row i is one
  "server pipeline", its column j holds stage j (``get_cost_opt``: pp_group =
  servers // pp rows of dp_group = pp nodes).
- Objective (``MetaHeuristics.objective``), on the node x node bandwidth matrix
  (Pipette's ``{"gpus", "bandwidth"}`` JSON, here ``ClusterSpec.node_matrix()``):
  C_pp = max over rows of sum over hops of 2 S_act / B[n_j, n_j+1] (forward
  direction only, no k weight); C_dp_outer = 2 (d_o - 1)/d_o S_dp / B_min over the
  ring of *stage 0's* nodes only (row order, wrap-around); C_dp_inner =
  2 (d_i - 1)/d_i S_dp / min over those nodes of B[n, n]; both DP levels carry the
  full S_dp.  S_act = b s h x 2 bytes (``get_pp_msg_size``, fp16/bf16);
  S_dp = (h V + 16 h^2 L/p) / t x 2 bytes (``get_dp_msg_size``, GPT weight 16).
  d_i = G / t, d_o = dp / d_i.  docs/design.md, section 2, flaw 1.
- Moves, each picked uniformly (``get_neighbors``): two_opt, insert, swap,
  insert_route, insert_reversed, with Pipette's index conventions
  (:mod:`pipette_cp.solvers.baselines.pipette_sa_moves`).
- Schedule (``annealing``): T0 = 1, T <- 0.999 T every iteration (argparse
  defaults ``--sa_initial_temp 1 --sa_alpha 0.999``); a worse neighbour is taken
  with probability exp(-d'/T) where d' = d / 10^(floor0(log10 d) + 1) scales the
  increase d (in milliseconds, as Pipette computes it) into [0.01, 1); the best
  state is kept; the loop runs until the wall-clock budget is spent; the start
  is a uniformly random permutation.
- Mapping (``initialize_model_parallel``): hostfile rank r on node r // G; node n
  holds G/t tensor groups of consecutive ranks; unit (stage j, replica
  i * G/t + k) is tensor group k of node grid[i][j].  Layer split even.

Guessed or changed (documented deviations)
------------------------------------------
- Budget: ``SolveOptions.time_limit_s`` (default 10 s, docs/design.md, section 2);
  the script's own default is 500 s.  Seed: ``SolveOptions.seed`` (Pipette
  always seeds 0).  One Python ``random.Random`` drives every random choice.
- Pipette would crash on non-finite costs (``int(log10(inf))``) or a temperature
  that underflows to 0; here an infinite increase, or T = 0, rejects, and a
  move between two infinite-cost states is accepted.  A node pair whose GPU
  pairs all failed gets B = 0, i.e. infinite cost; a partly failed node pair is
  averaged by ``node_matrix`` and invisible, and DP rings of stages > 0 are not
  in the objective at all, so plans may use failed links.
- A level with one member (d_i = 1 or d_o = 1) costs 0 (Pipette's formula gives
  0 x 1/B, which is NaN when B = 0).
- Only the best state is returned (Pipette also writes top/low lists).
- Layouts Pipette cannot express raise :class:`LayoutError`: p not dividing N,
  t not dividing G, dp != (N/p)(G/t) (Pipette uses every GPU), L not divisible
  by p or vpp > 1 (its enumeration skips them: ``global_layers % pp == 0``).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

import numpy as np

from pipette_cp.errors import LayoutError
from pipette_cp.solvers import work_meter as work
from pipette_cp.solvers.baselines.common import finish_plan
from pipette_cp.solvers.baselines.pipette_sa_moves import MOVES  # and each move, re-exported:
from pipette_cp.solvers.baselines.pipette_sa_moves import _insert as _insert
from pipette_cp.solvers.baselines.pipette_sa_moves import _insert_reversed as _insert_reversed
from pipette_cp.solvers.baselines.pipette_sa_moves import _insert_route as _insert_route
from pipette_cp.solvers.baselines.pipette_sa_moves import _swap as _swap
from pipette_cp.solvers.baselines.pipette_sa_moves import _two_opt as _two_opt
from pipette_cp.solvers.options import SolveOptions
from pipette_cp.specs import Instance, Plan
from pipette_cp.specs.layouts import even_split

#: Initial temperature, ``--sa_initial_temp`` default (llm_train_strategy_assignment_total_v3.py).
INITIAL_TEMP = 1.0
#: Geometric cooling factor per iteration, ``--sa_alpha`` default (same file).
ALPHA = 0.999
#: Parameters per layer in units of h^2 for a GPT model, ``get_dp_msg_size``.
GPT_PARAM_WEIGHT = 16
#: Bytes per element of fp16/bf16 messages, ``get_pp_msg_size`` / ``get_dp_msg_size``.
BYTES_PER_ELEMENT = 2
#: Pipette's objective is in milliseconds; the acceptance test depends on that unit.
_MS = 1e3


@dataclass(frozen=True)
class PipetteInputs:
    """Everything ``MetaHeuristics.objective`` reads.

    Attributes
    ----------
    latency_s_per_byte : list of list of float
        ``1 / B[a][b]`` of the node matrix, s/byte (``inf`` where B = 0).
    pp : int
        Pipeline stages = nodes per grid row.
    pp_msg_bytes, dp_msg_bytes : float
        S_act and S_dp, bytes.
    inter_dp_size, inner_dp_size : int
        d_o = dp / d_i and d_i = gpus_per_node / tp.
    """

    latency_s_per_byte: list[list[float]]
    pp: int
    pp_msg_bytes: float
    dp_msg_bytes: float
    inter_dp_size: int
    inner_dp_size: int

    @property
    def num_nodes(self) -> int:
        return len(self.latency_s_per_byte)


@dataclass(frozen=True)
class PipetteCost:
    """Pipette's placement objective and its parts, s."""

    pipeline_s: tuple[float, ...]
    pp_s: float
    dp_inter_s: float
    dp_inner_s: float

    @property
    def total_s(self) -> float:
        """C_pp + C_dp_outer + C_dp_inner (``total_parallel_cost``)."""
        return self.pp_s + self.dp_inter_s + self.dp_inner_s


def _require_pipette_layout(instance: Instance, plan: Plan) -> None:
    for name, value in (("cp", plan.cp), ("ep", plan.ep)):
        if value > 1:
            raise LayoutError(
                f"plan.{name}", value, f"pipette-sa has no {name} degree (dp, pp, tp only)"
            )
    cluster = instance.cluster
    n, g = cluster.num_nodes, cluster.gpus_per_node
    checks = [
        ("plan.pp", plan.pp, n % plan.pp == 0, f"pp={plan.pp} must divide num_nodes={n}"),
        ("plan.tp", plan.tp, g % plan.tp == 0, f"tp={plan.tp} must divide gpus_per_node={g}"),
        (
            "plan.dp",
            plan.dp,
            n % plan.pp == 0 and g % plan.tp == 0 and plan.dp == (n // plan.pp) * (g // plan.tp),
            f"dp must be (num_nodes/pp)*(gpus_per_node/tp) = ({n}/{plan.pp})*({g}/{plan.tp})"
            f" = {n * g // (plan.pp * plan.tp)}: Pipette places whole nodes and uses every GPU",
        ),
        (
            "model.num_layers",
            instance.model.num_layers,
            instance.model.num_layers % plan.pp == 0,
            f"pp={plan.pp} must divide the layers (Pipette's uniform split)",
        ),
        ("plan.vpp", plan.vpp, plan.vpp == 1, "Pipette has no interleaved (virtual) stages"),
    ]
    for field, value, ok, expected in checks:
        if not ok:
            raise LayoutError(field, value, f"pipette-sa cannot express this layout: {expected}")


def pipette_inputs(instance: Instance, plan: Plan) -> PipetteInputs:
    """The objective's inputs for ``plan``'s degrees (placement ignored).

    Raises
    ------
    LayoutError
        A layout Pipette cannot express (see the module docstring).
    """
    _require_pipette_layout(instance, plan)
    model, cluster = instance.model, instance.cluster
    h, s, b = model.hidden_size, instance.training.seq_length, plan.micro_batch_size
    # get_pp_msg_size: b s h elements of 2 bytes.
    pp_msg = b * s * h * BYTES_PER_ELEMENT
    # get_dp_msg_size: (h V + 16 h^2 x layers per stage) / tp elements of 2 bytes.
    layers = model.num_layers // plan.pp
    dp_msg = (h * model.vocab_size + GPT_PARAM_WEIGHT * h**2 * layers) / plan.tp * BYTES_PER_ELEMENT
    bandwidth = cluster.node_matrix()
    latency = np.divide(1.0, bandwidth, out=np.full_like(bandwidth, np.inf), where=bandwidth > 0)
    inner = cluster.gpus_per_node // plan.tp
    return PipetteInputs(
        latency_s_per_byte=latency.tolist(),
        pp=plan.pp,
        pp_msg_bytes=float(pp_msg),
        dp_msg_bytes=float(dp_msg),
        inter_dp_size=plan.dp // inner,
        inner_dp_size=inner,
    )


def _ring_factor(n: int) -> float:
    return 2.0 * (n - 1) / n


def pipette_objective(state: list[int], inputs: PipetteInputs) -> PipetteCost:
    """``MetaHeuristics.objective`` of a node permutation, in seconds.

    Examples
    --------
    >>> lat = [[1e-11, 1e-10], [1e-10, 1e-11]]
    >>> inp = PipetteInputs(lat, pp=2, pp_msg_bytes=1e6, dp_msg_bytes=1e8,
    ...                     inter_dp_size=1, inner_dp_size=4)
    >>> cost = pipette_objective([0, 1], inp)
    >>> round(cost.pp_s, 6), round(cost.dp_inner_s, 6)
    (0.0002, 0.0015)
    """
    lat, p = inputs.latency_s_per_byte, inputs.pp
    rows = [state[i : i + p] for i in range(0, len(state), p)]
    pipelines = tuple(
        sum(2.0 * inputs.pp_msg_bytes * lat[row[j]][row[j + 1]] for j in range(p - 1))
        for row in rows
    )
    first = [row[0] for row in rows]
    inter_dp = inner_dp = 0.0
    if inputs.inter_dp_size > 1:
        worst = max(lat[a][first[(i + 1) % len(first)]] for i, a in enumerate(first))
        inter_dp = _ring_factor(inputs.inter_dp_size) * inputs.dp_msg_bytes * worst
    if inputs.inner_dp_size > 1:
        worst = max(lat[a][a] for a in first)
        inner_dp = _ring_factor(inputs.inner_dp_size) * inputs.dp_msg_bytes * worst
    return PipetteCost(pipelines, max(pipelines), inter_dp, inner_dp)


def pipette_latency_s(
    cost: PipetteCost, forward_s: float, backward_s: float, num_microbatches: int, pp: int
) -> float:
    """Pipette's iteration-time estimate (``cost_total_iterl_split_opt``), s.

    ``T = (p-1)(f+g) + k [p (f+g) + C_pp] + C_dp_inner + C_dp_outer`` with
    ``k = m // p``; for ``m < p`` it is ``(m-1)(f+g) + p(f+g) + C_pp + C_dp``.
    docs/design.md, section 2 (flaw 2: ``(m mod p)(f+g)`` is dropped).

    >>> c = PipetteCost((0.1,), 0.1, 0.2, 0.3)
    >>> round(pipette_latency_s(c, 1.0, 2.0, num_microbatches=8, pp=4), 6)
    33.7
    """
    step = forward_s + backward_s
    k = num_microbatches // pp
    if k >= 1:
        pipeline = (pp - 1) * step + k * (pp * step + cost.pp_s)
    else:
        pipeline = (num_microbatches - 1) * step + pp * step + cost.pp_s
    return pipeline + cost.dp_inner_s + cost.dp_inter_s


@dataclass(frozen=True)
class AnnealResult:
    """Outcome of :func:`anneal`: best and start states with their objectives (s)."""

    best_state: tuple[int, ...]
    best_cost_s: float
    start_state: tuple[int, ...]
    start_cost_s: float
    iterations: int
    wall_time_s: float


def _accept(diff_ms: float, temp: float, rng: random.Random) -> bool:
    """Pipette's Metropolis test on the objective increase in milliseconds."""
    if diff_ms <= 0 or math.isnan(diff_ms):
        return True
    if math.isinf(diff_ms) or temp <= 0:
        return False
    scaled = diff_ms / 10 ** (int(math.log10(diff_ms)) + 1)
    return rng.uniform(0, 1) <= math.exp(-scaled / temp)


def anneal(
    inputs: PipetteInputs,
    *,
    seed: int,
    time_limit_s: float,
    max_iterations: int | None = None,
    initial_temp: float = INITIAL_TEMP,
    alpha: float = ALPHA,
) -> AnnealResult:
    """Pipette's simulated annealing over node permutations (``MetaHeuristics.annealing``).

    Stops when ``time_limit_s`` has elapsed (checked every iteration, as Pipette;
    under the work meter of :mod:`pipette_cp.solvers.work_meter`, reference seconds of moves)
    or after ``max_iterations`` (for reproducible tests), whichever comes first.
    """
    started = work.now()
    rng = random.Random(seed)
    n = inputs.num_nodes
    solution = rng.sample(range(n), n)
    cost = pipette_objective(solution, inputs).total_s
    start_state, start_cost = tuple(solution), cost
    best, best_cost = tuple(solution), cost
    temp, iterations = initial_temp, 0
    while n >= 2 and work.now() - started < time_limit_s and not work.exhausted():
        if max_iterations is not None and iterations >= max_iterations:
            break
        neighbor = list(solution)
        MOVES[rng.randrange(len(MOVES))](neighbor, rng)
        neighbor_cost = pipette_objective(neighbor, inputs).total_s
        work.spend(work.ANNEAL_TICKS_PER_NODE * n)
        if _accept((neighbor_cost - cost) * _MS, temp, rng):
            solution, cost = neighbor, neighbor_cost
        temp *= alpha
        if cost < best_cost:
            best, best_cost = tuple(solution), cost
        iterations += 1
    return AnnealResult(best, best_cost, start_state, start_cost, iterations, work.now() - started)


def state_to_placement(
    state: tuple[int, ...] | list[int], pp: int, tp: int, gpus_per_node: int
) -> tuple[tuple[int, ...], ...]:
    """Units (stage * dp + replica) -> GPUs as Pipette's ``initialize_model_parallel`` builds them.

    Grid row i (nodes ``state[i*pp:(i+1)*pp]``), stage j, local tensor group k
    (GPUs ``k*tp .. k*tp+tp-1`` of the node) is DP replica ``i * (G/tp) + k``.

    >>> state_to_placement([1, 0], pp=2, tp=2, gpus_per_node=4)
    ((4, 5), (6, 7), (0, 1), (2, 3))
    """
    inner = gpus_per_node // tp
    rows = [state[i : i + pp] for i in range(0, len(state), pp)]
    return tuple(
        tuple(row[stage] * gpus_per_node + k * tp + t for t in range(tp))
        for stage in range(pp)
        for row in rows
        for k in range(inner)
    )


def pipette_sa(instance: Instance, skeleton: Plan, options: SolveOptions) -> Plan:
    """Pipette's node-grid simulated annealing, even split, within ``options.time_limit_s``.

    The returned plan's ``solve_info.objective`` is Pipette's own placement
    objective C_pp + C_dp_outer + C_dp_inner (s) of the best state.

    Raises
    ------
    LayoutError
        A layout Pipette cannot express (see the module docstring).
    """
    started = time.perf_counter()
    inputs = pipette_inputs(instance, skeleton)
    with work.deterministic(options.deterministic and not work.active()):
        result = anneal(inputs, seed=options.seed, time_limit_s=options.time_limit_s)
    g = instance.cluster.gpus_per_node
    return finish_plan(
        skeleton,
        layer_split=even_split(instance.model.num_layers, skeleton.pp),
        placement=state_to_placement(result.best_state, skeleton.pp, skeleton.tp, g),
        method="pipette-sa",
        objective_s=result.best_cost_s,
        started_at=started,
    )
