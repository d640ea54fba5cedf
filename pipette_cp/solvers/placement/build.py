"""Construction of :class:`~pipette_cp.solvers.placement.data.PlacementData`.

Slots (:func:`tensor_slots`): where every node's GPUs are interchangeable
(:func:`node_uniform`) the tp-aligned blocks of each node, and places are whole
nodes; elsewhere (the cube mesh, PCIe switches, a failed NVLink) each node's GPUs
cut into the tensor groups with the fastest rings
(:func:`~pipette_cp.cost.network.tp_rings.best_partition`; the aligned blocks whenever they
are among the best), and places are single slots.  A tensor group wider than a
node (tp > gpus_per_node, in an NVLink domain of several nodes) is an aligned
block of ``tp`` consecutive GPUs of one domain.  Pair bandwidths, compute classes
(GPU type x TP-link bandwidth of a place), memory feasibility and message sizes are
computed here exactly as :class:`~pipette_cp.cost.evaluator.evaluate.Evaluator` computes them.
"""

from __future__ import annotations

import numpy as np

from pipette_cp.cost.compute.model_chunks import chunk_times, layer_times
from pipette_cp.cost.compute.optimizer_step import optimizer_step_time_s
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.cost.evaluator.expert_groups import expert_rings_apart
from pipette_cp.cost.memory.peak import (
    layer_params_per_gpu,
    memory_by_stage,
    padded_vocab_size,
    usable_memory_bytes,
)
from pipette_cp.cost.network import collectives as comm
from pipette_cp.cost.network.data_parallel import gradient_wire_bytes, param_wire_bytes
from pipette_cp.cost.network.tp_rings import best_partition, partition_is_complete, ring_bandwidths
from pipette_cp.cost.workload.lora import trained_param_split
from pipette_cp.cost.workload.tokens import unit_tokens
from pipette_cp.errors import InfeasibleError, LayoutError
from pipette_cp.solvers.placement.data import Family, PlacementData
from pipette_cp.solvers.placement.families import placement_families
from pipette_cp.specs import Instance, Plan
from pipette_cp.specs.training import GRADIENT_SHARDING
from pipette_cp.units import BYTES_PER_ELEMENT

#: Most places (nodes, or tensor-group slots where a node's GPUs differ) the exact
#: masters take: their place x place tables (pair bandwidth, latency, NIC sharing) hold
#: a million entries each at 1,024 places, and a 2,048-place master already spends a
#: 60 s budget on one layout.
MAX_MASTER_PLACES = 1024


def tensor_slots(instance: Instance, tp: int, aligned: bool = False) -> tuple[np.ndarray, bool]:
    """The slots of ``tp``-GPU units, (count, tp) GPU ids by node, each slot ascending,
    and whether they are *complete*: every placement of units on any tp GPUs of one
    node (of one NVLink domain, beyond a node) has a twin on these slots with the
    same links (:func:`~pipette_cp.cost.network.tp_rings.partition_is_complete`), so that what
    is proven over the slots holds over every grouping.  ``aligned``: the tp-aligned
    blocks even where a node's links are not uniform (complete only if they are).

    Raises :class:`LayoutError` when ``tp`` neither divides ``gpus_per_node`` nor is
    a multiple of it dividing the GPUs of an NVLink domain."""
    c = instance.cluster
    g, domain = c.gpus_per_node, c.gpus_per_domain
    if tp > g and c.nodes_per_nvlink_domain > 1 and (tp % g or domain % tp):
        raise LayoutError(
            "plan.tp", tp, f"tp={tp} is neither a divisor of gpus_per_node={g} nor a multiple "
            f"of it dividing the {domain} GPUs of an NVLink domain: placement slots are "
            "tp-aligned blocks of one NVLink domain",
        )  # fmt: skip
    if (g % tp and tp <= g) or tp > domain:
        raise LayoutError(
            "plan.tp", tp, f"tp={tp} does not divide gpus_per_node={g}: "
            "placement slots are tp-aligned blocks of one node",
        )  # fmt: skip
    bw = c.links
    if tp > g:  # aligned blocks of whole nodes of one domain (of one GPU type, to be alike)
        slots, per = np.arange(c.num_gpus).reshape(-1, tp), c.nodes_per_nvlink_domain
        complete = all(
            len(set(c.node_gpu_types[d * per : (d + 1) * per])) == 1
            and partition_is_complete(bw, np.arange(d * domain, (d + 1) * domain),
                                      slots[d * domain // tp : (d + 1) * domain // tp])
            for d in range(c.num_domains)
        )  # fmt: skip
        return slots, complete
    if node_uniform(instance) or aligned:
        return np.arange(c.num_gpus).reshape(-1, tp), tp == 1 or node_uniform(instance)
    cuts, complete = [], True
    for n in range(c.num_nodes):
        gpus = np.arange(n * g, (n + 1) * g)
        cut = gpus[best_partition(bw[np.ix_(gpus, gpus)], tp)]
        complete = complete and partition_is_complete(bw, gpus, cut)
        cuts.append(cut)
    return np.concatenate(cuts), complete


def master_places(instance: Instance, plan: Plan) -> int:
    """Places the exact masters would take for ``plan``: nodes where their GPUs are
    interchangeable, tensor-group slots elsewhere (compare :data:`MAX_MASTER_PLACES`)."""
    c = instance.cluster
    if plan.tp <= c.gpus_per_node and node_uniform(instance):
        return c.num_nodes
    return c.num_gpus // plan.tp


def node_uniform(instance: Instance) -> bool:
    """Whether every node pair's GPU block, and every node's off-diagonal block, is constant."""
    c = instance.cluster
    n, g = c.num_nodes, c.gpus_per_node
    if c.fabric is not None:  # levels and node pairs are node-uniform; GPU pairs are not
        return not c.fabric.gpu_pairs.src.size
    blocks = c.matrix.reshape(n, g, n, g).transpose(0, 2, 1, 3)
    same = blocks == blocks[:, :, :1, :1]
    diag = np.arange(n)
    if g > 1:
        intra = blocks[diag, diag]
        same[diag, diag] = (intra == intra[:, :1, 1:2]) | np.eye(g, dtype=bool)
    return bool(same.all())


def build_placement_data(
    instance: Instance,
    plan: Plan,
    evaluator: Evaluator | None = None,
    constraints: tuple = (),
    aligned: bool = False,
    families: tuple[Family, ...] | None = None,
) -> PlacementData:
    """Slots, places, pair costs and compute classes of ``plan``'s degrees and split.

    ``families``: the master's families (default: the built-in ones, the user's
    ``constraints`` and the symmetry breaking,
    :func:`~pipette_cp.solvers.placement.families.placement_families`).

    Raises
    ------
    LayoutError
        ``tp`` does not divide ``gpus_per_node`` (nor, beyond a node, is a multiple of
        it dividing an NVLink domain), or the plan needs more units than there are slots.
    """
    c, tp, pp, dp = instance.cluster, plan.tp, plan.pp, plan.replicas
    ev = evaluator or Evaluator(instance, dp_algorithm="ring", validate=False)
    slots, complete = tensor_slots(instance, tp, aligned)
    if pp * dp > len(slots):
        raise LayoutError(
            "plan.dp*pp", pp * dp, f"{pp * dp} units of tp={tp} but only {len(slots)} slots"
        )
    bw = c.links
    # each slot's TP ring in NCCL's order, as the Evaluator charges it (cost.rings)
    tp_bw = ring_bandwidths(bw, slots) if tp > 1 else np.full(len(slots), np.inf)
    usable = tp_bw > 0
    slot_node = slots[:, 0] // c.gpus_per_node
    node_level = tp <= c.gpus_per_node and node_uniform(instance)
    if node_level:
        place_slots = [np.flatnonzero(usable & (slot_node == n)) for n in range(c.num_nodes)]
        rep = np.array([s[0] if len(s) else n * (c.gpus_per_node // tp) for n, s in
                        enumerate(place_slots)])  # fmt: skip
    else:
        place_slots = [np.array([s]) for s in np.flatnonzero(usable)]
        rep = np.flatnonzero(usable)
    if len(rep) > MAX_MASTER_PLACES:
        raise LayoutError(
            "plan.dp*pp", pp * dp, f"{len(rep)} places: the exact placement masters take at "
            f"most {MAX_MASTER_PLACES} (the place-pair tables grow with their square); larger "
            "clusters are placed by the heuristics",
        )  # fmt: skip
    capacity = np.array([len(s) for s in place_slots], dtype=np.int64)
    if 0 < capacity.sum() < pp * dp:
        raise InfeasibleError(
            f"{pp * dp} units of tp={tp} but only {int(capacity.sum())} GPU blocks have a ring "
            "free of failed links"
        )
    if not capacity.any():
        raise InfeasibleError("every tensor group of the slots has a failed link on every "
                              "ring of its GPUs")  # fmt: skip
    place_node = slot_node[rep]
    # pair bandwidth of two units: slowest of the tp rank-to-rank flows
    pair = bw[slots[rep][:, None, :], slots[rep][None, :, :]].min(axis=2)
    if node_level and c.gpus_per_node > 1:  # two slots of one node: any intra-node pair
        g0 = place_node * c.gpus_per_node
        pair[np.arange(len(rep)), np.arange(len(rep))] = bw[g0, g0 + 1]
    node_cross = place_node[:, None] != place_node[None, :]
    place_domain = place_node // c.nodes_per_nvlink_domain
    # only flows that leave an NVLink domain go through NICs (cost.comm.shared_nic_flows):
    # a unit's flows leave from its GPUs on each of its nodes, min(tp, g) per node
    cross = place_domain[:, None] != place_domain[None, :]
    fabric = ev.fabric
    share = np.where(cross, fabric.nic_capacity_bytes_per_s / min(tp, c.gpus_per_node), np.inf)
    eff = np.minimum(pair, share)
    with np.errstate(divide="ignore"):
        inv_bw = np.where(eff > 0, 1.0 / eff, np.inf)
    latency = np.where(node_cross, c.inter_node_latency_s, c.intra_node_latency_s)
    tables = _stage_tables(instance, plan, place_node, tp_bw[rep], capacity)
    if families is None:
        families = placement_families(constraints)
    return PlacementData(
        instance=instance, plan=plan, evaluator=ev, slot_gpus=slots, place_slots=place_slots,
        place_node=place_node, capacity=capacity, node_level=node_level, latency=latency,
        cross=cross, inv_bw=inv_bw, nic_capacity=fabric.nic_capacity_bytes_per_s,
        constraints=tuple(constraints), place_domain=place_domain, slots_complete=complete,
        families=families, **tables,
    )  # fmt: skip


def _stage_tables(
    instance: Instance, plan: Plan, place_node: np.ndarray, place_bw: np.ndarray, capacity
) -> dict:
    """Compute classes, memory, message sizes (as the Evaluator computes them)."""
    model, training, cluster = instance.model, instance.training, instance.cluster
    types = [cluster.node_gpu_types[int(n)] for n in place_node]
    peak = {name: gpu.peak_flops_per_s for name, gpu in cluster.gpu_types.items()}
    bw_key = place_bw if plan.tp > 1 else np.zeros(len(place_bw))
    keys = sorted({(peak[t], float(b), t) for t, b in zip(types, bw_key, strict=True)})
    index = {(t, b): i for i, (_, b, t) in enumerate(keys)}
    place_class = np.array([index[(t, float(b))] for t, b in zip(types, bw_key, strict=True)])
    fwd, bwd, opt, layer = [], [], [], []
    free = np.inf  # context parallelism: no ring time here, the cps inputs add it
    for _, b, t in keys:
        gpu = cluster.gpu_types[t]
        times = chunk_times(model, training, gpu, plan, b, None, cp_bandwidth_bytes_per_s=free)
        fwd.append(times.forward_s)
        bwd.append(times.backward_s)
        opt.append([optimizer_step_time_s(model, training, gpu, plan, s) for s in range(plan.pp)])
        one = layer_times(
            model, training, gpu, plan, b, cp_bandwidth_bytes_per_s=free
        )  # what ZeRO-2/3 collectives hide behind
        layer.append((one.forward_s, one.backward_s))
    fwd_a, bwd_a, opt_a = np.array(fwd), np.array(bwd), np.array(opt)
    monotone = all((np.diff(a, axis=0) <= 1e-15).all() for a in (fwd_a, bwd_a, opt_a))
    # a stage takes the slowest GPU type and the slowest TP link of its units: one class
    # of the sorted list only when a single GPU type (or a single TP bandwidth) exists
    single = len({t for *_, t in keys}) == 1 or len({b for _, b, _ in keys}) == 1
    memory = np.array([m.bound_bytes for m in memory_by_stage(model, training, plan)])
    usable = np.array([usable_memory_bytes(cluster.gpu_types[t], training) for t in types])
    allowed = (memory[:, None] <= usable[None, :]) & (capacity > 0)[None, :]
    elem = BYTES_PER_ELEMENT[training.precision]
    # gradient and parameter bytes on the DP rings, as the evaluator
    grad, gathered = gradient_wire_bytes(training, plan), param_wire_bytes(training, plan)
    dp = plan.replicas
    # the trained parameters (all, or LoRA's adapters: cost.workload.lora)
    split = [trained_param_split(model, training, plan, s) for s in range(plan.pp)]
    params = np.array([dense + experts for dense, experts in split])
    sync = comm._RING_FACTOR["reduce_scatter" if plan.distributed_optimizer else "all_reduce"]
    gather_on = plan.distributed_optimizer and not training.overlap_param_gather
    gather_ratio = (gathered / (sync * grad)) if gather_on else 0.0
    synced = params
    if model.is_moe and expert_rings_apart(plan):  # the experts have rings of their own
        synced = np.array([dense for dense, _ in split])
    if plan.sharding in GRADIENT_SHARDING:
        # ZeRO-2/3 (pp = 1): the ring variable is one layer's gradient reduce-scatter
        # (dp_collectives.per_layer_collectives), its weight all-gather elem / grad of it;
        # ZeRO-2 gathers the stage's parameters once per step (step_collectives)
        sync, synced = 1.0, np.full(plan.pp, layer_params_per_gpu(model, plan.tp))
        gather_on = plan.sharding == "optim_grads"
        gather_ratio = params[0] * gathered / (synced[0] * grad) if gather_on else 0.0
    act = unit_tokens(training, plan) * model.hidden_size * elem  # s b / cp tokens
    emb = padded_vocab_size(model, plan.tp) * model.hidden_size / plan.tp * grad
    return {
        "allowed": allowed, "place_class": place_class, "class_forward": fwd_a,
        "class_backward": bwd_a, "class_optimizer": opt_a,
        # HSDP: groups the masters do not model (context-parallel and expert groups: groups)
        "exact": monotone and single and not plan.hybrid,
        "act_bytes": act / (plan.tp if plan.sequence_parallel else 1),
        # ring: factor (D-1)/D x bytes / slowest link (Patarasuk & Yuan 2009), as comm
        "ring_bytes": sync * (dp - 1) / dp * synced * grad,
        "gather_ratio": gather_ratio,
        "sync_factor": sync * (dp - 1), "gather_factor": (dp - 1.0) if gather_on else 0.0,
        # tied-embedding all-reduce over a pair: 2 (2-1)/2 bytes / slowest link
        "emb_bytes": emb,
        "class_layer": np.array(layer), "layer_gather_ratio": gathered / grad,
    }  # fmt: skip
