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
iteration time through a vector ``x`` of placement-dependent inputs, whose entries
the problem's families declare (:class:`~pipette_cp.solvers.placement.family.XIndex`,
:mod:`pipette_cp.solvers.placement.families`).  :meth:`PlacementData.total_time_s` maps
``x`` to the analytic iteration time with the same functions the Evaluator uses
(:func:`~pipette_cp.cost.schedule.critical_path.pipeline_times`,
:func:`~pipette_cp.cost.schedule.critical_path.finish_iteration`), each family adding
its part, and :meth:`PlacementData.x_of` reads ``x`` off the Evaluator's own
:meth:`~pipette_cp.cost.evaluator.evaluate.Evaluator.pipeline_inputs` of a placement,
with DP rings in replica order (``dp_algorithm="ring"``), each family reading its part.
So the master's objective and the Evaluator agree by construction, and the tests check it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from pipette_cp.cost.evaluator.evaluate import Evaluator, num_micro_batches
from pipette_cp.cost.schedule.critical_path import PipelineInputs, finish_iteration, pipeline_times
from pipette_cp.errors import InfeasibleError
from pipette_cp.solvers.placement.family import (
    Edge,
    Master,
    PlacementFamily,
    Reading,
    TimeParts,
    XIndex,
)
from pipette_cp.specs import Instance, Plan


@dataclass(eq=False)
class PlacementData:
    """Slots, places, pairwise costs, the families and the iteration-time function of
    one problem.

    Build with :func:`~pipette_cp.solvers.placement.build.build_placement_data`.  Place
    arrays are indexed by place; ``inv_bw[p, q]`` is ``1 / bandwidth`` of one flow from a
    unit on ``p`` to one on ``q`` with the NIC share of one unit folded in (``inf`` =
    failed pair); on a node place, ``inv_bw[p, p]`` is the link between two of its slots.
    ``place_node`` is a place's node (its first node when a slot spans several),
    ``place_domain`` its NVLink domain; ``cross[p, q]``: a flow from ``p`` to ``q``
    leaves the domain (through the NICs); ``latency`` is the inter-node one between
    two nodes, NVLink or not (the Evaluator's).  ``slots_complete``: the slots match
    every grouping of a node's GPUs into tensor groups
    (:func:`~pipette_cp.solvers.placement.build.tensor_slots`); where not, a bound
    over them says nothing of placements on other groups.  ``families``: the master's
    families in order (:func:`~pipette_cp.solvers.placement.families.placement_families`);
    ``exact`` holds only where every family prices the Evaluator exactly.
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
    #: user constraint families (:mod:`pipette_cp.solvers.extensions`), also in ``families``
    constraints: tuple = ()
    #: NVLink domain of each place (None: its node)
    place_domain: np.ndarray | None = None
    #: whether the slots match every grouping of the GPUs into tensor groups
    slots_complete: bool = True
    #: the master's families, in order (their slots make ``xi``)
    families: tuple[Family, ...] = ()
    xi: XIndex = field(init=False)
    #: values computed once per problem (class cost matrices, per-class bounds, tables)
    memo: dict = field(init=False, default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.place_domain is None:
            self.place_domain = self.place_node
        declared = [(f, list(f.slots(self))) for f in self.families]
        self.xi = XIndex.assemble([s for _, slots in declared for s in slots])
        self.exact = self.exact and all(f.exact(self) for f in self.families)
        # the hooks each family overrides (reading and communication: only where it has
        # inputs in this problem), called in list order
        base, pp, vpp = PlacementFamily, self.plan.pp, self.plan.vpp
        inputs = [f for f, slots in declared if any(0 not in s.shape for s in slots)]
        self._readers = [f for f in inputs if type(f).read is not base.read]
        self._talkers = [f for f in inputs if type(f).communicate is not base.communicate]
        self._computers = [f for f in self.families if type(f).compute is not base.compute]
        self._admitters = [f for f in self.families if type(f).admits is not base.admits]
        self._zeros = np.zeros(pp * vpp), np.zeros(pp)
        for zeros in self._zeros:
            zeros.flags.writeable = False

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
        frozen = self.instance.training.lora is not None  # LoRA: no embedding gradient
        return bool(self.instance.model.tied_embeddings and self.plan.pp > 1 and not frozen)

    @property
    def multi(self) -> bool:
        """Whether a node can hold two units (then NIC shares depend on the placement)."""
        per_node = np.bincount(self.place_node, weights=self.capacity)
        return bool(per_node.max(initial=0) >= 2)

    def stage_of(self, unit: int) -> int:
        return unit // self.plan.replicas

    def flows(self) -> list[tuple[Family, list[Edge]]]:
        """Every family with flows and its unit pairs ``(index, u, v)`` (``u -> v``)."""
        out = []
        for family in self.families:
            edges = family.edges(self)
            if edges is not None:
                out.append((family, edges))
        return out

    def edges(self) -> dict[str, list[Edge]]:
        """Unit pairs ``(index, u, v)`` that exchange data, by family name: ``hop``
        (index = boundary ``s``, ``u`` on stage ``s``, ``v`` on the next stage;
        activations ``u -> v``, gradients ``v -> u``), ``ring`` (index = stage, ``u -> v``
        one link of the DP ring in replica order), ``emb`` (first and last stage of a
        replica, both directions) and those of the groups."""
        return {family.name: edges for family, edges in self.flows()}

    # ------------------------------------------------------------ pair costs (s)
    def pair_cost(self, key: tuple, make: Callable[[], np.ndarray]) -> np.ndarray:
        """A place x place cost matrix, computed once per problem (read-only)."""
        if ("cost", key) not in self.memo:
            matrix = make()
            matrix.flags.writeable = False
            self.memo["cost", key] = matrix
        return self.memo["cost", key]

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
        """The master's inputs of an assignment, read off the Evaluator (ring DP) by
        every family.

        Raises :class:`InfeasibleError` when it sends data over a failed pair."""
        gpus = self.realise(assign)
        inputs, layer = self.evaluator.pipeline_inputs(self.plan, gpus)
        reading = Reading(np.asarray(assign), gpus, inputs, layer)
        x = np.zeros(self.xi.size)
        for family in self._readers:
            family.read(self, reading, x)
        return x

    def value(self, assign: np.ndarray) -> float:
        """Iteration time of an assignment under the master's model (inf if infeasible,
        including a violated user constraint family)."""
        if not all(family.admits(self, assign) for family in self._admitters):
            return float("inf")
        try:
            return self.total_time_s(self.x_of(assign))
        except InfeasibleError:
            return float("inf")

    # ------------------------------------------------------------ x -> time
    def pipeline_inputs(self, x: np.ndarray) -> PipelineInputs:
        """Schedule inputs with the placement-dependent parts taken from ``x``: the compute
        times first, then every family's communication."""
        plan = self.plan
        pp, vpp = plan.pp, plan.vpp
        per_chunk, per_stage = self._zeros  # read-only: a family replaces an array
        times = TimeParts(per_chunk, per_chunk, per_stage, per_stage, per_stage, per_stage,
                          per_stage)  # fmt: skip
        for family in self._computers:
            family.compute(self, x, times)
        for family in self._talkers:
            family.communicate(self, x, times)
        training = self.instance.training
        return PipelineInputs(
            pp=pp, vpp=vpp, schedule="interleaved" if vpp > 1 else "1f1b",
            num_micro_batches=num_micro_batches(self.instance, plan), forward_s=times.forward,
            backward_s=times.backward, fwd_hop_s=times.fwd_hop, bwd_hop_s=times.bwd_hop,
            dp_sync_s=times.sync, overlap_grad_reduce=training.overlap_grad_reduce,
            embedding_sync_s=times.embedding, optimizer_s=times.optimizer,
            param_gather_s=times.gather,
        )  # fmt: skip

    def total_time_s(self, x: np.ndarray) -> float:
        """Analytic iteration time (as :meth:`Evaluator.evaluate`) for inputs ``x``."""
        inputs = self.pipeline_inputs(np.asarray(x, dtype=float))
        times = pipeline_times(inputs)
        return finish_iteration(inputs, times.stage_end_s, times.last_backward_s).total_s


#: A family of this problem type (subclass it: :mod:`pipette_cp.solvers.placement.families`).
Family = PlacementFamily[PlacementData]
#: What a family sees of the master of this problem type.
MasterView = Master[PlacementData]
