"""AMP (Li et al., NeurIPS 2022): its cost model, its layer-partition DP and its placement.

Source read: github.com/DachengLi1/AMP, ``src/cost_het_cluster.py`` (``get_cost_c``,
``get_cost_e``, ``dp_cost``, ``predict``), ``src/pipe.py`` (``pipe_ast``,
``pipe_uniform``, ``pipe_cost``), ``src/amp_utils.py`` (``axis2rank``),
``src/het_cluster.py`` / ``src/homogeneous.py`` (``cluster_info`` units) and
``src/sa.py`` (``amp_no_placement_strategy``).  Re-implemented, not copied.

Reproduced as the code does it
------------------------------
- Model as L + 6 pseudo layers: ``embed2h, noop, L x transformer, noop, noop,
  embed2v, noop`` (``get_cost_c``).
- Execution cost per pseudo layer e = micro-batch x 3 x (forward time of one
  sample): backward = 2 x forward, no recompute (``init_param`` loads
  ``3 * known_cost``; ``get_cost_e``).  AMP profiles the forward per tensor-
  parallel degree; here :mod:`pipette_cp.cost.compute.model_chunks` supplies it at micro-batch
  1 (averaged over the GPU types of the plan, weighted by GPU count, as AMP
  averages its two GPU types 0.75 / 0.25).
- Per-node bandwidth, not per link: ``cluster_info[node] = [inter, intra]``;
  two GPUs on different nodes get ``min(inter_a, inter_b)``, on one node
  ``intra`` of that node.  Messages are 4-byte elements (``cluster_info`` is
  Gbit/s / 32).
- Pipeline hop after pseudo layer c between stages j, j+1: volume(c) / slowest
  tp-rank link, averaged over the DP replicas; volume = b s h (b s V / t after
  embed2v); counted once per boundary, not per micro-batch or direction.
- ``pipe_cost``: (B - 1) x max stage e-sum + sum of the hop costs at the stage
  boundaries + sum of all e, B = global batch / (dp x micro-batch).
- ``dp_cost``: max over stages and tp ranks of 2 (dp-1)/(dp bw) x params, with
  params = 12 h^2 / t per layer + h V / t once on a stage holding an embedding;
  bw is the ring link from the last replica back to the first only (in AMP the
  ``min`` over the ring sits outside its loop).  No memory model.
- Partition (``pipe_ast``): dynamic program over (last layer, stages, threshold
  on the max stage sum) with the same tie-breaking and AMP's comparison of a
  hop-inclusive candidate against a hop-exclusive incumbent (``faithful=True``;
  ``faithful=False`` compares like with like and is optimal for ``pipe_cost``).
  One micro-batch: ``pipe_uniform`` (remainder on the first stages).
- Placement: ``predict`` with no placement search (``amp_no_placement_strategy``,
  the configuration of the paper's main results) ranks GPUs in hostfile order,
  rank = t + tp (d + dp s) (``axis2rank``): Megatron's tp-dp-pp order.

Guessed or changed
------------------
- ``inter`` of a node = mean of its healthy inter-node entries in
  ``ClusterSpec.node_matrix()`` (both directions); ``intra`` = its diagonal.
- Stage boundaries are restricted to fall between transformer layers (the
  pseudo layers stay with the first / last stage): a :class:`Plan` needs at
  least one transformer layer per stage.  Interleaving (vpp > 1) is refused.
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np

from pipette_cp.cost.compute.model_chunks import chunk_times, layer_times
from pipette_cp.errors import LayoutError
from pipette_cp.solvers.baselines.common import finish_plan, require_layout_fits
from pipette_cp.solvers.options import SolveOptions
from pipette_cp.specs import ClusterSpec, Instance, Plan
from pipette_cp.specs.layouts import make_plan, megatron_placement

#: Bytes per message element: AMP's cluster_info divides bit/s by 32 (het_cluster.py).
AMP_BYTES_PER_ELEMENT = 4
#: Pseudo layers before / after the transformer layers (get_cost_c's ``_layer`` list).
NUM_PREFIX, NUM_SUFFIX = 2, 4
#: Parameters of one transformer layer in units of h^2 (dp_cost).
AMP_PARAM_WEIGHT = 12
#: Decimals kept of stage sums so equal sums are one DP threshold (pipe_ast's ``possible``).
_DECIMALS = 12


def amp_cluster_info(cluster: ClusterSpec) -> np.ndarray:
    """AMP's per-node ``[inter, intra]`` bandwidth, bytes/s, shape (num_nodes, 2).

    >>> from pipette_cp.clusters.expand import cluster_from_node_matrix
    >>> from pipette_cp.specs import resolve_gpu
    >>> nm = np.array([[0, 10e9, 30e9], [10e9, 0, 20e9], [30e9, 20e9, 0]])
    >>> c = cluster_from_node_matrix(node_bandwidth=nm, intra_node=100e9, gpus_per_node=2,
    ...     gpu=resolve_gpu("a100"), nics_per_node=2, nic_bandwidth_bytes_per_s=25e9)
    >>> (amp_cluster_info(c) / 1e9).tolist()
    [[20.0, 100.0], [15.0, 100.0], [25.0, 100.0]]
    """
    nodes = cluster.node_matrix()
    info = np.zeros((cluster.num_nodes, 2))
    for n in range(cluster.num_nodes):
        both = np.concatenate([np.delete(nodes[n], n), np.delete(nodes[:, n], n)])
        healthy = both[both > 0]
        info[n] = (healthy.mean() if healthy.size else 0.0, nodes[n, n])
    return info


def _bandwidth(info: np.ndarray, node_a: int, node_b: int) -> float:
    """AMP's connectivity of two GPUs from their nodes (get_cost_c, dp_cost)."""
    if node_a == node_b:
        return float(info[node_a, 1])
    return float(min(info[node_a, 0], info[node_b, 0]))


def _require_amp_layout(instance: Instance, plan: Plan) -> None:
    for name, value in (("cp", plan.cp), ("ep", plan.ep)):
        if value > 1:
            raise LayoutError(f"plan.{name}", value, f"amp has no {name} degree (dp, pp, tp only)")
    if plan.vpp != 1:
        raise LayoutError("plan.vpp", plan.vpp, "amp cannot express interleaved stages (vpp > 1)")
    if plan.pp > instance.model.num_layers:
        raise LayoutError(
            "plan.pp",
            plan.pp,
            f"amp needs at least one of the {instance.model.num_layers} layers per stage",
        )


def amp_layer_costs(instance: Instance, plan: Plan) -> np.ndarray:
    """Execution cost e of each of the L + 6 pseudo layers per micro-batch, s (get_cost_e)."""
    cluster, model, training = instance.cluster, instance.model, instance.training
    nodes = sorted({cluster.node_of(g) for unit in plan.placement for g in unit})
    tp_bandwidth = float(min(amp_cluster_info(cluster)[nodes, 1]))
    probe = make_plan(
        num_layers=2,
        dp=1,
        pp=2,
        tp=plan.tp,
        micro_batch_size=1,
        sequence_parallel=plan.sequence_parallel,
        recompute=plan.recompute,
        flash_attention=plan.flash_attention,
    )
    counts = Counter(cluster.node_gpu_types[cluster.node_of(g)] for u in plan.placement for g in u)
    per_sample = np.zeros(3)  # embedding, transformer layer, LM head forward of one sample
    for name, count in counts.items():
        gpu = cluster.gpu_types[name]
        layer = layer_times(model, training, gpu, probe, tp_bandwidth).forward_s
        fwd = chunk_times(model, training, gpu, probe, tp_bandwidth).forward_s
        per_sample += count * np.array([fwd[0] - layer, layer, fwd[1] - layer])
    emb, layer, head = per_sample / sum(counts.values())
    forward = [emb, 0.0] + [layer] * model.num_layers + [0.0, 0.0, head, 0.0]
    return 3.0 * plan.micro_batch_size * np.array(forward)


def amp_comm_costs(instance: Instance, plan: Plan) -> np.ndarray:
    """Hop cost after pseudo layer c between stages j and j+1, shape (L+5, pp-1), s (get_cost_c)."""
    cluster, model = instance.cluster, instance.model
    info = amp_cluster_info(cluster)
    n = model.num_layers + NUM_PREFIX + NUM_SUFFIX
    tokens = plan.micro_batch_size * instance.training.seq_length
    # Activation volume leaving pseudo layer c: b s h, or b s V / t after embed2v.
    volume = np.full(n - 1, tokens * model.hidden_size, dtype=float)
    volume[n - 2 :] = tokens * model.vocab_size / plan.tp
    volume *= AMP_BYTES_PER_ELEMENT
    inverse = np.zeros(max(plan.pp - 1, 0))
    for j in range(plan.pp - 1):
        for d in range(plan.replicas):
            pairs = zip(plan.unit_gpus(j, d), plan.unit_gpus(j + 1, d), strict=True)
            slowest = min(
                _bandwidth(info, cluster.node_of(a), cluster.node_of(b)) for a, b in pairs
            )
            inverse[j] += 1.0 / slowest / plan.replicas
    return volume[:, None] * inverse[None, :]


def _pseudo_ends(split: tuple[int, ...] | list[int]) -> list[int]:
    """Last pseudo-layer index of every stage for a split of transformer layers."""
    sizes = list(split)
    sizes[0] += NUM_PREFIX
    sizes[-1] += NUM_SUFFIX
    return list(np.cumsum(sizes) - 1)


def amp_pipe_cost(
    cost_e: np.ndarray, cost_c: np.ndarray, num_microbatches: float, split: tuple[int, ...]
) -> float:
    """AMP's pipeline time for a split of transformer layers (``pipe_cost``), s.

    >>> e = np.array([0.0, 0.0, 1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 0.0])
    >>> c = np.full((8, 1), 0.5)
    >>> amp_pipe_cost(e, c, 4, (2, 1))   # 3 x max(3, 3) + 0.5 + 6
    15.5
    """
    ends = _pseudo_ends(split)
    starts = [0, *(end + 1 for end in ends[:-1])]
    stage_sums = [float(cost_e[a : b + 1].sum()) for a, b in zip(starts, ends, strict=True)]
    hops = sum(float(cost_c[ends[j], j]) for j in range(len(split) - 1))
    return (num_microbatches - 1) * max(stage_sums) + hops + float(cost_e.sum())


def amp_dp_cost(instance: Instance, plan: Plan) -> float:
    """AMP's data-parallel time (``dp_cost``): slowest stage's ring all-reduce, s."""
    if plan.replicas == 1:
        return 0.0
    cluster, model = instance.cluster, instance.model
    info = amp_cluster_info(cluster)
    h, t = model.hidden_size, plan.tp
    worst = 0.0
    for s in range(plan.pp):
        params = AMP_PARAM_WEIGHT * h**2 / t * plan.layer_split[s]
        if s in (0, plan.pp - 1):
            params += h * model.vocab_size / t
        for rank in range(t):
            # Only the ring link from the last replica back to the first is kept.
            a, b = plan.unit_gpus(s, plan.replicas - 1)[rank], plan.unit_gpus(s, 0)[rank]
            bw = _bandwidth(info, cluster.node_of(a), cluster.node_of(b))
            ring = 2.0 * (plan.replicas - 1) / (plan.replicas * bw)
            worst = max(worst, ring * params * AMP_BYTES_PER_ELEMENT)
    return worst


def amp_num_microbatches(instance: Instance, plan: Plan) -> float:
    """AMP's B = global batch / (dp x micro-batch), unrounded (``predict``)."""
    return instance.training.global_batch_size / (plan.dp * plan.micro_batch_size)


def amp_cost(instance: Instance, plan: Plan) -> float:
    """AMP's estimate of the iteration time of ``plan`` (``predict``: pipe_cost + dp_cost), s.

    Evaluates ``plan``'s own split and placement under AMP's model.

    Raises
    ------
    LayoutError
        vpp > 1 or more stages than layers.
    """
    _require_amp_layout(instance, plan)
    cost_e = amp_layer_costs(instance, plan)
    cost_c = amp_comm_costs(instance, plan)
    pipe = amp_pipe_cost(cost_e, cost_c, amp_num_microbatches(instance, plan), plan.layer_split)
    return pipe + amp_dp_cost(instance, plan)


def amp_uniform_split(num_layers: int, pp: int) -> tuple[int, ...]:
    """``pipe_uniform``: equal stages, the remainder on the first ones.

    >>> amp_uniform_split(10, 4)
    (3, 3, 2, 2)
    """
    each, extra = divmod(num_layers, pp)
    return tuple(each + (1 if s < extra else 0) for s in range(pp))


def amp_partition(
    cost_e: np.ndarray,
    cost_c: np.ndarray,
    pp: int,
    num_microbatches: float,
    *,
    faithful: bool = True,
) -> tuple[int, ...]:
    """AMP's layer partition (``predict``: ``pipe_uniform`` if B = 1, else ``pipe_ast``).

    The DP state is (last pseudo layer i, stage j, threshold m): the least
    ``(B-1) max(0, max stage sum - possible[m])`` (plus the hops with
    ``faithful=False``) over splits of pseudo layers ``0..i`` into ``j + 1``
    stages.  Cuts are tried in increasing order and a candidate wins only if
    strictly better.  With ``faithful=True`` the candidate includes the hop cost
    but the stored incumbent does not, as in ``pipe_ast``.

    Returns the transformer layers per stage.
    """
    num_layers = len(cost_e) - NUM_PREFIX - NUM_SUFFIX
    if pp == 1:
        return (num_layers,)
    if int(num_microbatches) == 1:
        return amp_uniform_split(num_layers, pp)
    n, b1 = len(cost_e), num_microbatches - 1
    prefix = np.concatenate([[0.0], np.cumsum(cost_e)])
    # runs[a, b] = sum of cost_e[a..b], rounded so that equal sums are equal.
    runs = np.round(prefix[None, 1:] - prefix[:-1, None], _DECIMALS)
    possible = np.unique(np.concatenate([[0.0], runs[np.triu_indices(n)]]))
    slots = np.arange(len(possible))

    def ends(j: int) -> range:
        # Stage j ends after a transformer layer, leaving one for each later stage.
        if j == pp - 1:
            return range(n - 1, n)
        return range(NUM_PREFIX + j, NUM_PREFIX + num_layers - (pp - 1 - j))

    def lift(cur: float) -> np.ndarray:
        # index of max(cur, possible[m]) for every m
        return np.where(possible >= cur, slots, np.searchsorted(possible, cur))

    value: dict[tuple[int, int], np.ndarray] = {}
    back: dict[tuple[int, int], np.ndarray] = {}
    for i in ends(0):
        value[i, 0] = b1 * np.maximum(0.0, runs[0, i] - possible)
    for j in range(1, pp):
        for i in ends(j):
            best = np.full(len(possible), np.inf)
            arg = np.full(len(possible), -1)
            for cut in (c for c in ends(j - 1) if c < i):
                cur, hop = runs[cut + 1, i], float(cost_c[cut, j - 1])
                cand = value[cut, j - 1][lift(cur)] + b1 * np.maximum(0.0, cur - possible) + hop
                better = cand < best
                best = np.where(better, cand - hop if faithful else cand, best)
                arg = np.where(better, cut, arg)
            value[i, j], back[i, j] = best, arg
    stage_ends, i, m = [n - 1], n - 1, 0
    for j in range(pp - 1, 0, -1):
        cut = int(back[i, j][m])
        m = int(lift(runs[cut + 1, i])[m])
        stage_ends.append(cut)
        i = cut
    stage_ends.reverse()
    sizes = np.diff([-1, *stage_ends])
    sizes[0] -= NUM_PREFIX
    sizes[-1] -= NUM_SUFFIX
    return tuple(int(x) for x in sizes)


def amp_method(instance: Instance, skeleton: Plan, options: SolveOptions) -> Plan:
    """AMP's partition and placement for the skeleton's degrees; objective = :func:`amp_cost`.

    Raises
    ------
    LayoutError
        vpp > 1, more stages than layers, tp not dividing gpus_per_node (AMP's
        model-parallel degree is a divisor of the GPUs per node) or too many GPUs.
    """
    del options
    started = time.perf_counter()
    require_layout_fits(instance, skeleton, "amp")
    _require_amp_layout(instance, skeleton)
    placement = megatron_placement(skeleton.replicas, skeleton.pp, skeleton.tp)
    start = finish_plan(
        skeleton,
        layer_split=amp_uniform_split(instance.model.num_layers, skeleton.pp),
        placement=placement,
        method="amp",
        objective_s=None,
        started_at=started,
    )
    split = amp_partition(
        amp_layer_costs(instance, start),
        amp_comm_costs(instance, start),
        skeleton.pp,
        amp_num_microbatches(instance, start),
    )
    plan = finish_plan(
        skeleton,
        layer_split=split,
        placement=placement,
        method="amp",
        objective_s=None,
        started_at=started,
    )
    return finish_plan(
        skeleton,
        layer_split=split,
        placement=placement,
        method="amp",
        objective_s=amp_cost(instance, plan),
        started_at=started,
    )
