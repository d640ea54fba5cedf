"""Cheap bounds that let the search skip layouts before any solver runs.

Both bounds hold for *every* split and placement of a skeleton, so pruning
with them never loses the optimum:

* memory: each model chunk holds at least one layer and memory grows with
  layers, so if some stage does not fit with one layer per chunk, no split
  fits; with ``vpp = 1`` memory is affine in the stage's layer count, which
  gives every stage a capacity, and the split exists iff the capacities add up
  to the model's layers;
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

from pipette_cp.cost.compute import chunk_times
from pipette_cp.cost.memory import memory_by_stage, num_microbatches, usable_memory_bytes
from pipette_cp.specs import Instance, Plan


@dataclass(frozen=True)
class MemoryCheck:
    """Whether any split of a skeleton fits, and by how much it misses if not."""

    feasible: bool
    deficit_bytes: float
    """Smallest extra memory per GPU that would make a split fit (0 when feasible)."""


def _limit(instance: Instance) -> float:
    """Usable memory of the smallest GPU type of the cluster (a stage may land on it)."""
    return min(usable_memory_bytes(g) for g in instance.cluster.gpu_types.values())


def memory_check(instance: Instance, plan: Plan) -> MemoryCheck:
    """Is there a layer split of ``plan`` whose every stage fits in memory?"""
    model, training = instance.model, instance.training
    chunks = plan.pp * plan.vpp
    limit = _limit(instance)
    if model.num_layers < chunks:
        return MemoryCheck(False, math.inf)
    ones = plan.model_copy(update={"layer_split": (1,) * chunks})
    low = np.array([b.total_bytes for b in memory_by_stage(model, training, ones)])
    if (low > limit).any():
        return MemoryCheck(False, float(low.max() - limit))
    if plan.vpp > 1:
        return MemoryCheck(True, 0.0)  # the split solver decides exactly
    twos = plan.model_copy(update={"layer_split": (2,) * chunks})
    slope = np.array([b.total_bytes for b in memory_by_stage(model, training, twos)]) - low
    capacity = 1 + np.floor((limit - low) / np.maximum(slope, 1.0))
    short = model.num_layers - int(np.minimum(capacity, model.num_layers).sum())
    if short <= 0:
        return MemoryCheck(True, 0.0)
    # the stages must hold `short` more layers: the cheapest extra memory per GPU
    return MemoryCheck(False, float(np.sort(slope)[: max(1, short // plan.pp)].max()))


def time_lower_bound(instance: Instance, plan: Plan) -> float:
    """Iteration time no split or placement of ``plan`` can beat (seconds)."""
    cluster = instance.cluster
    bandwidth = cluster.bandwidth_bytes_per_s
    g = cluster.gpus_per_node
    intra = max(float(bandwidth[:g, :g].max()), 1.0) if g > 1 else 1.0
    fastest = max(cluster.gpu_types.values(), key=lambda gpu: gpu.peak_flops_per_s)
    times = chunk_times(instance.model, instance.training, fastest, plan, intra)
    work = float((times.forward_s + times.backward_s).sum())
    m = num_microbatches(instance.training, plan)
    steps = m if plan.vpp > 1 else m + plan.pp - 1
    return steps * work / plan.pp
