"""Context-parallel rings, expert all-to-alls and expert data-parallel rings in unit terms.

A unit holds the ``tp`` ranks of one stage of one replica, so every group of
:mod:`pipette_cp.cost.network.parallel_groups` is a set of units: a context-parallel ring links ``cp``
consecutive replicas (``tp`` flows per link, one per tp rank); an expert group spans
``ep x etp / tp`` consecutive replicas (or sits inside one unit); an expert data-parallel
ring visits every ``ep x etp / tp``-th unit.  :class:`GroupTables` lists these unit pairs
once per problem and :func:`group_inputs` reads the placement-dependent inputs of ``x``
off the Evaluator's own functions, so the master's iteration time and the Evaluator's
agree by construction:

- ``a2a[s]``: one all-to-all of stage ``s`` (its slowest rank: NVLink sends one after
  another, NIC sends at once, each at its link or its node's NIC share);
- ``cps[s]``: one K/V ring step of stage ``s`` at its slowest ring link
  (``chunk / bandwidth``), exposed per layer as ``(cp - 1) max(0, step - core / cp)``
  (twice the bytes backward; recomputation repeats the forward's);
- ``ering[k]``, ``ecross[k]``: the bandwidth part of the expert gradient sync of ring
  class ``k`` (stage ``k // classes``; rings of one class visit the same units) and
  whether it leaves a node (its latency).

The masters price a family (:attr:`GroupTables.priced`) only where its unit-level form
is exact: node places (every GPU pair of two nodes alike), every rank of a unit with the
same peers, ``tp`` flows on every ring link.  Elsewhere the input is left to its lower
bound 0 (valid, not exact) and the placement's own value is still the Evaluator's.

The three group families (:mod:`~pipette_cp.solvers.placement.families.alltoall`,
:mod:`~pipette_cp.solvers.placement.families.context_rings`,
:mod:`~pipette_cp.solvers.placement.families.expert_rings`) share these tables through
:func:`group_tables` (built once per problem) and one reading of an assignment through
:func:`group_reading`; their common hooks are
:class:`~pipette_cp.solvers.placement.families.group_family.GroupFamily`'s.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from pipette_cp.cost.compute.model_chunks import cp_step_thresholds_s
from pipette_cp.cost.evaluator.expert_groups import (
    alltoalls_per_layer,
    expert_rings_apart,
    peer_bytes,
)
from pipette_cp.cost.network import collectives as comm
from pipette_cp.cost.network.data_parallel import gradient_wire_bytes, param_wire_bytes
from pipette_cp.cost.network.parallel_groups import (
    GroupFlows,
    alltoall_times_s,
    cp_ring_bandwidths,
    group_flows,
    group_nodes,
    node_dedup_factor,
)
from pipette_cp.cost.workload.parameters import stage_param_split
from pipette_cp.cost.workload.tokens import cp_chunk_bytes, moe_layers_by_chunk
from pipette_cp.solvers.placement.data import PlacementData
from pipette_cp.solvers.placement.family import Reading
from pipette_cp.specs import Instance, Plan
from pipette_cp.specs.knobs.recompute import selective_modules
from pipette_cp.specs.training import GRADIENT_SHARDING

#: (stage, u, v, peers of each rank of u in v, flows u -> v)
A2aPair = tuple[int, int, int, int, int]


@dataclass(frozen=True, eq=False)
class GroupTables:
    """The unit pairs and constants of one layout's groups (see the module docstring)."""

    a2a_pairs: tuple[A2aPair, ...]
    a2a_own: np.ndarray  # (units,) peers of a rank inside its own unit
    a2a_bytes: float  # to one peer per all-to-all (0: no all-to-all)
    remote_scale: float  # the least scale of remote bytes (flex dispatcher), else 1
    moe_chunks: np.ndarray  # MoE layers of every virtual stage
    a2a_counts: tuple[float, float]  # all-to-alls per MoE layer, forward and backward
    cp_edges: tuple[tuple[int, int, int], ...]  # (stage, u, v): ring link u -> v
    cp_chunk_bytes: float
    cp_layers: np.ndarray  # layers of every virtual stage
    cp_thresholds: tuple[float, float]
    cp_recompute: bool
    ering_edges: tuple[tuple[int, int, int], ...]  # (class, u, v): ring link u -> v
    ering_classes: int  # classes per stage (0: no expert rings apart)
    ering_ring_class: np.ndarray  # class of every ring of a stage
    ering_buffer: np.ndarray  # (pp,) expert gradient bytes per GPU of every stage
    ering_bytes: np.ndarray  # (pp,) bandwidth part's bytes: factor (n-1)/n x buffer
    esync_factor: float
    egather_ratio: float
    egather_factor: float
    priced: frozenset[str]
    exact: bool

    @property
    def a2a(self) -> bool:
        return self.a2a_bytes > 0

    @property
    def cp(self) -> bool:
        return bool(self.cp_edges)


def _expert_pairs(plan: Plan) -> tuple[list[tuple[int, int, int]], np.ndarray, bool]:
    """Stage-local ``(u, v, peers)`` of every ordered unit pair of an expert group, each
    unit's own peers, and whether every rank of a unit has the same peers."""
    tp, units = plan.tp, plan.replicas
    peers: list[Counter] = [Counter() for _ in range(units * tp)]
    for group in plan.expert_groups():
        for i in group:
            peers[i].update(j // tp for j in group if j != i)
    uniform = all(peers[u * tp + t] == peers[u * tp] for u in range(units) for t in range(tp))
    pairs = [(u, v, n) for u in range(units) for v, n in sorted(peers[u * tp].items()) if v != u]
    own = np.array([peers[u * tp][u] for u in range(units)], dtype=np.int64)
    return pairs, own, uniform


def _expert_rings(plan: Plan, f: GroupFlows) -> tuple[list[tuple[int, int, int]], np.ndarray, bool]:
    """Stage-local ``(class, u, v)`` of every expert ring link, each ring's class, and
    whether the rings' links all join distinct units with ``tp`` flows each."""
    per_stage = plan.replicas * plan.tp
    rings = f.edp_rings[: f.edp_rings.shape[0] // plan.pp] % per_stage // plan.tp
    seqs = [tuple(int(x) for x in r) for r in rings]
    index = {s: k for k, s in enumerate(dict.fromkeys(seqs))}
    ring_class = np.array([index[s] for s in seqs], dtype=np.int64)
    standard = all(len(set(s)) == len(s) for s in index) and all(
        n == plan.tp for n in Counter(seqs).values()
    )
    links = [(k, s[i], s[(i + 1) % len(s)]) for s, k in index.items() for i in range(len(s))]
    return links, ring_class, standard


def build_group_tables(instance: Instance, plan: Plan, node_level: bool) -> GroupTables:
    """The tables of ``plan``'s groups (empty families where a degree is 1)."""
    model, training, cluster = instance.model, instance.training, instance.cluster
    pp, units = plan.pp, plan.replicas
    f = group_flows(plan)
    priced: set[str] = set()
    exact = node_level and plan.tp <= cluster.gpus_per_node
    # expert all-to-all
    a2a_bytes, scale, pairs, own = 0.0, 1.0, [], np.zeros(pp * units, dtype=np.int64)
    if model.is_moe and plan.ep > 1:
        a2a_bytes = peer_bytes(instance, plan)
        local, own_local, uniform = _expert_pairs(plan)
        pairs = [(s, s * units + u, s * units + v, n, n * plan.tp)
                 for s in range(pp) for u, v, n in local]  # fmt: skip
        own = np.tile(own_local, pp)
        if training.moe_token_dispatcher == "flex":  # the least scale over group spreads
            nodes = np.arange(2, plan.ep + 1)
            scale = float(node_dedup_factor(model.num_experts, model.moe_top_k, nodes).min())
        if uniform and exact:
            priced.add("a2a")
        exact = exact and uniform and training.moe_token_dispatcher != "flex"
    # context-parallel rings
    cp_edges: list[tuple[int, int, int]] = []
    thresholds = (0.0, 0.0)
    if plan.cp > 1:
        cp = plan.cp
        cp_edges = [(s, s * units + d * cp + c, s * units + d * cp + (c + 1) % cp)
                    for s in range(pp) for d in range(plan.dp) for c in range(cp)]  # fmt: skip
        per_type = [cp_step_thresholds_s(model, training, g, plan)
                    for g in cluster.gpu_types.values()]  # fmt: skip
        # one GPU type: exact; several: the largest thresholds (least exposure), a bound
        thresholds = (max(t[0] for t in per_type), max(t[1] for t in per_type))
        if exact:
            priced.add("cp")
        exact = exact and len(per_type) == 1 and plan.sharding not in GRADIENT_SHARDING
    # expert data-parallel rings (apart from the dense ones)
    links: list[tuple[int, int, int]] = []
    classes, ring_class = 0, np.zeros(0, dtype=np.int64)
    ering = buffer = np.zeros(pp)
    esync = egather_ratio = egather_factor = 0.0
    if model.is_moe and plan.expert_dp > 1 and expert_rings_apart(plan):
        local_links, ring_class, standard = _expert_rings(plan, f)
        classes = int(ring_class.max()) + 1
        links = [(s * classes + k, s * units + u, s * units + v)
                 for s in range(pp) for k, u, v in local_links]  # fmt: skip
        n, grad = plan.expert_dp, gradient_wire_bytes(training, plan)
        factor = 1.0 if plan.distributed_optimizer else 2.0  # reduce-scatter or all-reduce
        experts = np.array([stage_param_split(model, plan, s)[1] for s in range(pp)])
        buffer = experts * grad
        ering = factor * (n - 1) / n * buffer
        esync = factor * (n - 1)
        if plan.distributed_optimizer and not training.overlap_param_gather:
            egather_ratio = param_wire_bytes(training, plan) / (factor * grad)
            egather_factor = n - 1.0
        if standard and exact:
            priced.add("ering")
        exact = exact and standard
    counts = alltoalls_per_layer(plan)
    return GroupTables(
        a2a_pairs=tuple(pairs), a2a_own=own, a2a_bytes=a2a_bytes, remote_scale=scale,
        moe_chunks=moe_layers_by_chunk(model, plan), a2a_counts=counts,
        cp_edges=tuple(cp_edges), cp_chunk_bytes=cp_chunk_bytes(model, training, plan),
        cp_layers=np.asarray(plan.layer_split, dtype=float), cp_thresholds=thresholds,
        cp_recompute=plan.recompute == "full" or "core_attn" in selective_modules(plan),
        ering_edges=tuple(links),
        ering_classes=classes, ering_ring_class=ring_class, ering_buffer=buffer,
        ering_bytes=ering,
        esync_factor=esync, egather_ratio=egather_ratio, egather_factor=egather_factor,
        priced=frozenset(priced), exact=exact,
    )  # fmt: skip


@dataclass(frozen=True)
class GroupInputs:
    """The group inputs of one placement (see the module docstring), s."""

    a2a: np.ndarray  # (pp,)
    cps: np.ndarray  # (pp,)
    ering: np.ndarray  # (pp * classes,)
    ecross: np.ndarray  # (pp * classes,) 0/1
    expert_sync_s: np.ndarray  # (pp,) the Evaluator's expert gradient sync


def group_inputs(
    instance: Instance, plan: Plan, tables: GroupTables, fabric: comm.Fabric, gpus: np.ndarray
) -> GroupInputs:
    """Read a placement's group inputs with the Evaluator's functions
    (:class:`~pipette_cp.errors.InfeasibleError` for a failed link)."""
    pp = plan.pp
    flat = np.asarray(gpus).ravel()
    f = group_flows(plan)
    a2a, cps = np.zeros(pp), np.zeros(pp)
    if tables.a2a:
        scale: np.ndarray | float = 1.0
        if instance.training.moe_token_dispatcher == "flex":
            nodes = group_nodes(fabric, flat, f)
            model = instance.model
            scale = node_dedup_factor(model.num_experts, model.moe_top_k, nodes)
        a2a = alltoall_times_s(fabric, flat, f, tables.a2a_bytes, scale)
    if tables.cp:
        cps = tables.cp_chunk_bytes / cp_ring_bandwidths(fabric, flat, f)[0]
    classes = tables.ering_classes
    ering, ecross, sync = np.zeros(pp * classes), np.zeros(pp * classes), np.zeros(pp)
    if classes:
        rings = flat[f.edp_rings]
        per = rings.shape[0] // pp
        buffer = np.repeat(tables.ering_buffer, per)
        op: comm.Collective = "reduce_scatter" if plan.distributed_optimizer else "all_reduce"
        t = comm.collective_times_s(fabric, rings, buffer, op, "ring",
                                    "an expert data-parallel gradient sync").reshape(pp, per)  # fmt: skip
        nodes = fabric.node_of[rings]
        crosses = (nodes != np.roll(nodes, -1, axis=1)).any(axis=1).reshape(pp, per)
        cls = tables.ering_ring_class
        for c in range(classes):
            ecross[c::classes] = crosses[:, cls == c].any(axis=1)
            ering[c::classes] = t[:, cls == c].max(axis=1)
        sync = t.max(axis=1)
        ering = ering - tables.esync_factor * ring_latency(instance, ecross)
    return GroupInputs(a2a[: pp * tables.a2a], cps[: pp * tables.cp], ering, ecross, sync)


def ring_latency(instance: Instance, cross: np.ndarray) -> np.ndarray:
    """One step's latency of rings that stay in a node (0) or leave one (1)."""
    c = instance.cluster
    return c.intra_node_latency_s + (c.inter_node_latency_s - c.intra_node_latency_s) * cross


def cp_exposure(tables: GroupTables, cp: int, step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) exposed ring time of every virtual stage for the per-stage ring
    steps ``step`` (as :func:`~pipette_cp.cost.compute.context_ring.ring_exposed_s` per layer)."""
    a_f, a_b = tables.cp_thresholds
    fwd = (cp - 1) * np.maximum(0.0, step - a_f)
    bwd = (cp - 1) * np.maximum(0.0, 2.0 * step - a_b)
    if tables.cp_recompute:  # the recomputed forward passes its ring again
        bwd = bwd + fwd
    rows = np.arange(len(tables.cp_layers)) % len(step)
    return fwd[rows] * tables.cp_layers, bwd[rows] * tables.cp_layers


def a2a_added(tables: GroupTables, a2a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) all-to-all time of every virtual stage for per-stage times."""
    rows = np.arange(len(tables.moe_chunks)) % len(a2a)
    per_layer = a2a[rows] * tables.moe_chunks
    n_fwd, n_bwd = tables.a2a_counts
    return n_fwd * per_layer, n_bwd * per_layer


def expert_sync(
    instance: Instance, tables: GroupTables, ering: np.ndarray, ecross: np.ndarray, pp: int
) -> tuple[np.ndarray, np.ndarray]:
    """(sync, gather) of every stage's expert rings: each stage's slowest class."""
    if not tables.ering_classes:
        return np.zeros(pp), np.zeros(pp)
    lat = ring_latency(instance, ecross)
    sync = (ering + tables.esync_factor * lat).reshape(pp, -1).max(axis=1)
    gather = (tables.egather_ratio * ering + tables.egather_factor * lat).reshape(pp, -1)
    return sync, gather.max(axis=1)


def group_tables(data: PlacementData) -> GroupTables | None:
    """The tables of the problem's groups, built once per problem (None: the layout has
    no context-parallel ring and no expert rings apart from the dense ones)."""
    key = ("group tables",)
    if key not in data.memo:
        plan, model = data.plan, data.instance.model
        grouped = plan.cp > 1 or (model.is_moe and expert_rings_apart(plan))
        tables = build_group_tables(data.instance, plan, data.node_level) if grouped else None
        data.memo[key] = tables
    return data.memo[key]


def group_reading(data: PlacementData, tables: GroupTables, reading: Reading) -> GroupInputs:
    """:func:`group_inputs` of the assignment being read, computed once for its families."""
    if "groups" not in reading.memo:
        fabric = data.evaluator.fabric
        reading.memo["groups"] = group_inputs(data.instance, data.plan, tables, fabric,
                                              reading.gpus)  # fmt: skip
    return reading.memo["groups"]


def per_byte_worst(data: PlacementData) -> float:
    """Seconds per byte no group flow exceeds: the slowest link, or a whole node's flows
    sharing its NICs."""
    key = ("group per byte",)
    if key not in data.memo:
        c = data.instance.cluster
        slowest = c.slowest_link_bytes_per_s()
        data.memo[key] = max(1.0 / slowest, c.gpus_per_node / data.nic_capacity)
    return data.memo[key]
