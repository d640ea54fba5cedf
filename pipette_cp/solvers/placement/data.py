"""What every placement method needs, built once per (instance, skeleton plan).

Vocabulary (STYLE.md): a *unit* is the ``tp`` ranks of one stage of one DP
replica (index ``stage * dp + replica``, as ``Plan.placement``); a *slot* is a
tensor group of ``tp`` GPUs of one node (of one NVLink domain when tp exceeds a
node), in ascending order: a tp-aligned block ``[k tp, (k + 1) tp)`` where the
node's GPUs are interchangeable, else a group of the node's best cut into tensor
groups (:func:`~pipette_cp.solvers.placement.build.tensor_slots`); a *place* is
what a unit is assigned to.  When every node's slots are interchangeable
(uniform links inside the node, and every GPU pair of two nodes with the same
bandwidth: true of all generated and measured clusters but the DGX-1 cube
mesh) a place is a whole node holding up to ``gpus_per_node / tp`` units,
which makes the models much smaller; otherwise a place is one slot.

The master problems of :mod:`pipette_cp.solvers.placement.model` see the
iteration time through a vector ``x`` of placement-dependent inputs (see
:class:`~pipette_cp.solvers.placement.xindex.XIndex`); :meth:`PlacementData.total_time_s` maps ``x`` to the
analytic iteration time with the same functions the Evaluator uses
(:func:`~pipette_cp.cost.schedule.critical_path.pipeline_times`,
:func:`~pipette_cp.cost.schedule.critical_path.finish_iteration`), and
:meth:`PlacementData.x_of` reads ``x`` off the Evaluator's own
:meth:`~pipette_cp.cost.evaluator.evaluate.Evaluator.pipeline_inputs` of a placement,
with DP rings in replica order (``dp_algorithm="ring"``).  So the master's
objective and the Evaluator agree by construction, and the tests check it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from pipette_cp.cost.compute.model_chunks import LayerTimes
from pipette_cp.cost.evaluator.evaluate import Evaluator, num_micro_batches
from pipette_cp.cost.network.data_parallel import exposed_per_layer
from pipette_cp.cost.schedule.critical_path import PipelineInputs, finish_iteration, pipeline_times
from pipette_cp.errors import InfeasibleError
from pipette_cp.solvers.extensions import family_violations
from pipette_cp.solvers.placement.groups import (
    GroupTables,
    a2a_added,
    cp_exposure,
    expert_sync,
    group_inputs,
    ring_latency,
)
from pipette_cp.solvers.placement.xindex import XIndex
from pipette_cp.specs import Instance, Plan
from pipette_cp.specs.training import GRADIENT_SHARDING

#: Families whose links carry data one way (the others: both ways).
RING_FAMILIES = frozenset({"ring", "cp", "ering"})


@dataclass(eq=False)
class PlacementData:
    """Slots, places, pairwise costs and the iteration-time function of one problem.

    Build with :func:`build_placement_data`.  Place arrays are indexed by place;
    ``inv_bw[p, q]`` is ``1 / bandwidth`` of one flow from a unit on ``p`` to one
    on ``q`` with the NIC share of one unit folded in (``inf`` = failed pair);
    on a node place, ``inv_bw[p, p]`` is the link between two of its slots.
    ``place_node`` is a place's node (its first node when a slot spans several),
    ``place_domain`` its NVLink domain; ``cross[p, q]``: a flow from ``p`` to ``q``
    leaves the domain (through the NICs); ``latency`` is the inter-node one between
    two nodes, NVLink or not (the Evaluator's).  ``slots_complete``: the slots match
    every grouping of a node's GPUs into tensor groups
    (:func:`~pipette_cp.solvers.placement.build.tensor_slots`); where not, a bound
    over them says nothing of placements on other groups.
    """

    instance: Instance
    plan: Plan
    evaluator: Evaluator
    slot_gpus: np.ndarray
    place_slots: list[np.ndarray]
    place_node: np.ndarray
    capacity: np.ndarray
    node_level: bool
    latency: np.ndarray
    cross: np.ndarray
    inv_bw: np.ndarray
    allowed: np.ndarray
    place_class: np.ndarray
    class_forward: np.ndarray
    class_backward: np.ndarray
    class_optimizer: np.ndarray
    exact: bool
    act_bytes: float
    ring_bytes: np.ndarray
    gather_ratio: float
    sync_factor: float
    gather_factor: float
    emb_bytes: float
    nic_capacity: float
    #: one layer's (forward, backward) per compute class: what ZeRO-2/3 collectives hide behind
    class_layer: np.ndarray
    #: ZeRO-2/3: one layer's weight all-gather over its gradient reduce-scatter (the ring)
    layer_gather_ratio: float
    #: user constraint families (:mod:`pipette_cp.solvers.extensions`)
    constraints: tuple = ()
    #: NVLink domain of each place (None: its node)
    place_domain: np.ndarray | None = None
    #: whether the slots match every grouping of the GPUs into tensor groups
    slots_complete: bool = True
    #: context-parallel rings, expert groups and expert rings (None: the layout has none)
    groups: GroupTables | None = None
    xi: XIndex = field(init=False)
    #: values computed once per problem (class cost matrices, per-class bounds)
    memo: dict = field(init=False, default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.place_domain is None:
            self.place_domain = self.place_node
        p = self.plan
        self.xi = XIndex.make(
            self.hops, p.pp, p.replicas > 1, self.tied, len(self.class_forward), self.groups
        )

    # ------------------------------------------------------------ shapes
    @property
    def num_units(self) -> int:
        return self.plan.pp * self.plan.replicas

    @property
    def num_places(self) -> int:
        return len(self.place_node)

    @property
    def hops(self) -> int:
        """Pipeline boundaries with traffic: pp - 1, or pp when interleaved (last -> 0)."""
        return self.plan.pp if self.plan.vpp > 1 else self.plan.pp - 1

    @property
    def tied(self) -> bool:
        return bool(self.instance.model.tied_embeddings and self.plan.pp > 1)

    @property
    def multi(self) -> bool:
        """Whether a node can hold two units (then NIC shares depend on the placement)."""
        per_node = np.bincount(self.place_node, weights=self.capacity)
        return bool(per_node.max(initial=0) >= 2)

    def stage_of(self, unit: int) -> int:
        return unit // self.plan.replicas

    def edges(self) -> dict[str, list[tuple[int, int, int]]]:
        """Unit pairs ``(index, u, v)`` that exchange data, by family.

        ``hop``: index = boundary ``s``, ``u`` on stage ``s``, ``v`` on the next
        stage (activations ``u -> v``, gradients ``v -> u``); ``ring``: index =
        stage, ``u -> v`` one link of the DP ring in replica order; ``emb``:
        first and last stage of a replica (both directions)."""
        pp, dp = self.plan.pp, self.plan.replicas
        hop = [(s, s * dp + r, (s + 1) % pp * dp + r) for s in range(self.hops) for r in range(dp)]
        ring = [(s, s * dp + r, s * dp + (r + 1) % dp) for s in range(pp) for r in range(dp)]
        ring = ring if dp > 1 else []
        emb = [(0, r, (pp - 1) * dp + r) for r in range(dp)] if self.tied else []
        out = {"hop": hop, "ring": ring, "emb": emb}
        g = self.groups
        if g is not None:
            out["cp"] = list(g.cp_edges)
            out["a2a"] = [(s, u, v) for s, u, v, _, _ in g.a2a_pairs]
            out["ering"] = list(g.ering_edges)
        return out

    # ------------------------------------------------------------ pair costs (s)
    def _cost(self, key: tuple, make: Callable[[], np.ndarray]) -> np.ndarray:
        """A pair cost matrix, computed once per problem (read-only)."""
        if ("cost", key) not in self.memo:
            matrix = make()
            matrix.flags.writeable = False
            self.memo["cost", key] = matrix
        return self.memo["cost", key]

    def hop_cost(self) -> np.ndarray:
        """Activation flow p -> q alone with one unit's NIC share: latency + bytes / bw."""
        return self._cost(("hop",), lambda: self.latency + self.act_bytes * self.inv_bw)

    def hop_back_cost(self) -> np.ndarray:
        """The gradient flow back over a hop whose activations go p -> q (q -> p)."""
        return self._cost(("hop back",), lambda: self.latency + self.act_bytes * self.inv_bw.T)

    def ring_cost(self, stage: int) -> np.ndarray:
        """Bandwidth part of ``stage``'s DP sync if its slowest link is p -> q."""
        size = float(self.ring_bytes[stage])
        if not size:
            return self._cost(("ring", 0.0), lambda: np.zeros_like(self.inv_bw))
        return self._cost(("ring", size), lambda: size * self.inv_bw)

    def emb_cost(self) -> np.ndarray:
        """Tied-embedding all-reduce between p and q (both directions)."""
        return self._cost(
            ("emb",),
            lambda: self.emb_bytes * np.maximum(self.inv_bw, self.inv_bw.T) + 2.0 * self.latency,
        )

    # ------------------------------------------------------------ assignments
    def realise(self, assign: np.ndarray) -> np.ndarray:
        """GPUs as a (pp, dp, tp) array: the units of a place take its slots in unit order."""
        assign = np.asarray(assign, dtype=np.int64)
        used = np.zeros(self.num_places, dtype=np.int64)
        out = np.empty((self.num_units, self.plan.tp), dtype=np.int64)
        for u, p in enumerate(assign):
            if used[p] >= self.capacity[p]:
                raise InfeasibleError(f"place {p} holds more than its {self.capacity[p]} units")
            out[u] = self.slot_gpus[self.place_slots[p][used[p]]]
            used[p] += 1
        return out.reshape(self.plan.pp, self.plan.replicas, self.plan.tp)

    def placement(self, assign: np.ndarray) -> tuple[tuple[int, ...], ...]:
        """``Plan.placement`` of an assignment."""
        gpus = self.realise(assign).reshape(self.num_units, self.plan.tp)
        return tuple(tuple(int(g) for g in unit) for unit in gpus)

    def assignment_of(self, placement: tuple[tuple[int, ...], ...]) -> np.ndarray | None:
        """The places of a plan's units, or None if some unit is not on one: on a node
        place, any tp GPUs of its node; on a slot place, the slot's GPUs in any order
        (slots need not be aligned blocks; a hint's own rank order is not kept)."""
        g = self.instance.cluster.gpus_per_node
        out = np.empty(self.num_units, dtype=np.int64)
        if self.node_level:
            by_node = {int(self.place_node[p]): p for p in range(self.num_places)}
        else:
            by_group = {frozenset(self.slot_gpus[sl].tolist()): p
                        for p, sls in enumerate(self.place_slots) for sl in sls}  # fmt: skip
        for u, unit in enumerate(placement):
            if len(unit) != self.plan.tp:
                return None
            if self.node_level:
                nodes = {x // g for x in unit}
                place = by_node.get(nodes.pop()) if len(nodes) == 1 else None
            else:
                place = by_group.get(frozenset(unit))
            if place is None or not self.allowed[self.stage_of(u), place]:
                return None
            out[u] = place
        counts = np.bincount(out, minlength=self.num_places)
        return out if (counts <= self.capacity).all() else None

    def worst_class(self, assign: np.ndarray) -> np.ndarray:
        """Slowest compute class (index, 0 = slowest) among each stage's units."""
        return self.place_class[np.asarray(assign)].reshape(self.plan.pp, -1).min(axis=1)

    def x_of(self, assign: np.ndarray) -> np.ndarray:
        """The master's inputs of an assignment, read off the Evaluator (ring DP).

        Raises :class:`InfeasibleError` when it sends data over a failed pair."""
        gpus = self.realise(assign)
        inputs, layer = self.evaluator.pipeline_inputs(self.plan, gpus)
        xi, x = self.xi, np.zeros(self.xi.size)
        x[xi.hf] = inputs.fwd_hop_s[: self.hops]
        x[xi.hb] = inputs.bwd_hop_s[: self.hops]
        expert = np.zeros(self.plan.pp)
        if self.groups is not None:
            g = group_inputs(self.instance, self.plan, self.groups, self.evaluator.fabric, gpus)
            x[xi.a2a], x[xi.cps], x[xi.ering], x[xi.ecross] = g.a2a, g.cps, g.ering, g.ecross
            expert = g.expert_sync_s
        if self.plan.replicas > 1:
            nodes = self.place_node[np.asarray(assign)].reshape(self.plan.pp, self.plan.replicas)
            crosses = (nodes != np.roll(nodes, -1, axis=1)).any(axis=1)
            x[xi.cross] = crosses
            # ZeRO-2/3: the ring is one layer's reduce-scatter, else the step's gradient
            # sync (the dense rings': the expert rings' follow it)
            sync = layer[0] if self.plan.sharding in GRADIENT_SHARDING else inputs.dp_sync_s
            sync = sync - expert
            x[xi.ring] = sync - self.sync_factor * self._ring_latency(x[xi.cross])
        if xi.emb is not None:
            x[xi.emb] = inputs.embedding_sync_s
        worst = self.worst_class(assign)
        if xi.worse.size:
            x[xi.worse] = np.arange(xi.worse.shape[1])[None, :] >= worst[:, None]
        return x

    def value(self, assign: np.ndarray) -> float:
        """Iteration time of an assignment under the master's model (inf if infeasible,
        including a violated user constraint family)."""
        if self.constraints:
            plan = self.plan.model_copy(update={"placement": self.placement(assign)})
            if family_violations(self.constraints, self.instance, plan):
                return float("inf")
        try:
            return self.total_time_s(self.x_of(assign))
        except InfeasibleError:
            return float("inf")

    # ------------------------------------------------------------ x -> time
    def _ring_latency(self, cross: np.ndarray) -> np.ndarray:
        return ring_latency(self.instance, cross)

    def pipeline_inputs(self, x: np.ndarray) -> PipelineInputs:
        """Schedule inputs with the placement-dependent parts taken from ``x``."""
        plan, xi = self.plan, self.xi
        pp, vpp = plan.pp, plan.vpp
        fwd, bwd = np.zeros(pp), np.zeros(pp)
        fwd[: self.hops], bwd[: self.hops] = x[xi.hf], x[xi.hb]
        forward, backward = self.class_forward[-1].copy(), self.class_backward[-1].copy()
        optimizer = self.class_optimizer[-1].copy()
        rows = np.arange(pp * vpp) % pp
        for c in range(xi.worse.shape[1]):
            w = x[xi.worse[:, c]]  # ladder: class c minus class c + 1, where stage is <= c
            forward += w[rows] * (self.class_forward[c] - self.class_forward[c + 1])
            backward += w[rows] * (self.class_backward[c] - self.class_backward[c + 1])
            optimizer += w * (self.class_optimizer[c] - self.class_optimizer[c + 1])
        sync = gather = np.zeros(pp)
        if plan.replicas > 1:
            lat = self._ring_latency(x[xi.cross])
            sync = x[xi.ring] + self.sync_factor * lat
            gather = self.gather_ratio * x[xi.ring] + self.gather_factor * lat
            if plan.sharding in GRADIENT_SHARDING:  # pp = 1: per-layer collectives exposed
                ag = self.layer_gather_ratio * x[xi.ring][0] + self.sync_factor * lat[0]
                f, b = self._worst_layer(x)
                times = LayerTimes(f, b, 0.0, 0.0, 0.0)
                ef, eb = exposed_per_layer(plan, times, float(sync[0]), float(ag))
                layers = np.asarray(plan.layer_split, dtype=float)
                forward, backward = forward + ef * layers, backward + eb * layers
                sync = np.zeros(pp)
        if self.groups is not None:
            forward, backward, sync, gather = self._with_groups(x, forward, backward, sync, gather)
        training = self.instance.training
        return PipelineInputs(
            pp=pp, vpp=vpp, schedule="interleaved" if vpp > 1 else "1f1b",
            num_micro_batches=num_micro_batches(self.instance, plan), forward_s=forward,
            backward_s=backward, fwd_hop_s=fwd, bwd_hop_s=bwd, dp_sync_s=sync,
            overlap_grad_reduce=training.overlap_grad_reduce,
            embedding_sync_s=float(x[xi.emb]) if xi.emb is not None else 0.0,
            optimizer_s=optimizer, param_gather_s=gather,
        )  # fmt: skip

    def _with_groups(self, x: np.ndarray, *times: np.ndarray) -> tuple[np.ndarray, ...]:
        """(forward, backward, sync, gather) with the group inputs' time added."""
        g, xi, pp = self.groups, self.xi, self.plan.pp
        assert g is not None
        forward, backward, sync, gather = times
        if xi.a2a.size:
            f, b = a2a_added(g, x[xi.a2a])
            forward, backward = forward + f, backward + b
        if xi.cps.size:
            f, b = cp_exposure(g, self.plan.cp, x[xi.cps])
            forward, backward = forward + f, backward + b
        if xi.ering.size:
            s, a = expert_sync(self.instance, g, x[xi.ering], x[xi.ecross], pp)
            sync, gather = sync + s, gather + a
        return forward, backward, sync, gather

    def _worst_layer(self, x: np.ndarray) -> tuple[float, float]:
        """One layer's (forward, backward) on stage 0's slowest class, by the class ladder."""
        layer = self.class_layer[-1].copy()
        for c in range(self.xi.worse.shape[1]):
            layer += x[self.xi.worse[0, c]] * (self.class_layer[c] - self.class_layer[c + 1])
        return float(layer[0]), float(layer[1])

    def total_time_s(self, x: np.ndarray) -> float:
        """Analytic iteration time (as :meth:`Evaluator.evaluate`) for inputs ``x``."""
        inputs = self.pipeline_inputs(np.asarray(x, dtype=float))
        times = pipeline_times(inputs)
        return finish_iteration(inputs, times.stage_end_s, times.last_backward_s).total_s
