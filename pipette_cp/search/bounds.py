"""Cheap bounds that let the search skip layouts before any solver runs.

Both bounds hold for *every* split and placement of a skeleton, so pruning
with them never loses the optimum:

* memory: each model chunk holds at least one layer and memory grows with
  layers, so if some stage does not fit with one layer per chunk, no split
  fits; a stage's memory is affine in its layer count ``n`` and its largest
  chunk (at least ``n / vpp`` layers), so it is at least the line through one
  and two layers per chunk, which gives every stage a capacity, and a split can
  exist only if the capacities add up to the model's layers (with ``vpp = 1``:
  iff);
* time: the busiest stage does at least the average work, and under 1F1B the
  critical path holds at least ``(m + p - 1)`` such stage-steps (the fill and
  drain bubble): ``T >= (m + p - 1) * W / p`` with ``W`` the forward+backward
  work of one micro-batch through every chunk, at the fastest tensor-parallel
  bandwidth any slot offers and with free pipeline and data-parallel
  communication (Narayanan et al. 2021, section 2.2; interleaved: ``m W / p``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipette_cp.cost.compute.model_chunks import chunk_times
from pipette_cp.cost.memory.peak import memory_by_stage, num_microbatches, usable_memory_bytes
from pipette_cp.cost.network.parallel_groups import fastest_link_bytes_per_s
from pipette_cp.solvers.split.cost import uniform_layers
from pipette_cp.specs import Instance, Plan


@dataclass(frozen=True)
class MemoryCheck:
    """Whether any split of a skeleton fits, and by how much it misses if not."""

    feasible: bool
    deficit_bytes: float
    """Smallest extra memory per GPU that would make a split fit (0 when feasible)."""


def _limit(instance: Instance) -> float:
    """Usable memory of the smallest GPU type of the cluster (a stage may land on it)."""
    return min(
        usable_memory_bytes(g, instance.training) for g in instance.cluster.gpu_types.values()
    )


def memory_check(instance: Instance, plan: Plan) -> MemoryCheck:
    """Can a layer split of ``plan`` have every stage fit in memory?  ``deficit_bytes``:
    the smallest extra memory per GPU that lets the capacities add up (a lower bound
    of what the best split misses by)."""
    model, training = instance.model, instance.training
    chunks, v = plan.pp * plan.vpp, plan.vpp
    if model.num_layers < chunks:
        return MemoryCheck(False, math.inf)
    if not uniform_layers(model, training):  # layer kinds apart: no one slope bounds them
        return MemoryCheck(True, 0.0)  # (the split solver decides; never a wrong prune)
    ones = plan.model_copy(update={"layer_split": (1,) * chunks})
    twos = plan.model_copy(update={"layer_split": (2,) * chunks})
    low = np.array([b.bound_bytes for b in memory_by_stage(model, training, ones)])
    high = np.array([b.bound_bytes for b in memory_by_stage(model, training, twos)])
    # stage memory >= low + slope * (n - v): per layer, its state and 1/v of a chunk's
    slope = np.maximum((high - low) / v, 1.0)
    extra = model.num_layers - chunks  # layers beyond one per chunk
    over = low - _limit(instance)  # memory missing with one layer per chunk
    room = np.floor(-over / slope)
    if (over <= 0).all() and np.minimum(room, extra).sum() >= extra:
        return MemoryCheck(True, 0.0)
    # the j-th extra layer of stage s needs over[s] + j * slope[s] more per GPU: the
    # deficit is the extra-th smallest of these (every stage first holding one per chunk)
    needs = over[:, None] + slope[:, None] * np.arange(1, extra + 1)
    kth = float(np.partition(needs.ravel(), extra - 1)[extra - 1]) if extra else 0.0
    return MemoryCheck(False, max(float(over.max()), kth, 0.0))


def time_lower_bound(instance: Instance, plan: Plan) -> float:
    """Iteration time no split or placement of ``plan`` can beat (seconds)."""
    cluster = instance.cluster
    bandwidth = cluster.links
    g = cluster.gpus_per_node
    intra = max(float(bandwidth[:g, :g].max()), 1.0) if g > 1 else 1.0
    fastest = max(cluster.gpu_types.values(), key=lambda gpu: gpu.peak_flops_per_s)
    times = chunk_times(instance.model, instance.training, fastest, plan, intra,
                        cp_bandwidth_bytes_per_s=fastest_link_bytes_per_s(cluster))  # fmt: skip
    work = float((times.forward_s + times.backward_s).sum())
    m = num_microbatches(instance.training, plan)
    steps = m if plan.vpp > 1 else m + plan.pp - 1
    return steps * work / plan.pp
