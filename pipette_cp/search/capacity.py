"""Can the model fit on the cluster at all?  A memory lower bound of every layout.

The worst stage of a layout holds at least the mean of its stages, and summed over
the ``pp`` stages of one pipeline, by the formulas of :mod:`pipette_cp.cost.memory.peak`,
a layout of ``n = dp * pp * tp`` GPUs holds at least:

* the weights and gradients of the whole model once per tensor-parallel shard
  (sharded ``tp * pp`` ways at most) and its optimizer state once per
  data-parallel shard (``tp * pp * dp`` ways at most, with the distributed
  optimizer over every data-parallel rank): 1/n of the state of the whole model;
* one micro-batch of activations of every layer (a stage has at least one in
  flight), the logits of one micro-batch and one layer's working set, each split
  at most ``tp <= n`` ways: 1/n of the same parts of the whole model on one GPU;
* the runtime constant ``R`` on every GPU, plus the allocator's reserve, a fixed
  fraction of the parts above.

So with ``M`` the predicted memory of the whole model on one GPU (dp = pp = tp = 1,
:func:`~pipette_cp.cost.memory.peak.memory_by_stage`) with the lightest knobs the search
space allows (every combination of the values each knob names as
:attr:`~pipette_cp.specs.knobs.Knob.lightest`: micro-batch size, recompute and
FlashAttention setting, ...; the lowest taken), every layout on at most ``n`` GPUs
needs at least ``R + (M - R) / n`` per GPU on its worst stage, whatever its split, placement or knobs.  It
decreases with ``n``: the smallest ``n`` for which it fits in a GPU is a lower
bound on the GPUs needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product
from typing import Any

from pipette_cp.cost.memory.peak import memory_by_stage, usable_memory_bytes
from pipette_cp.cost.stack.calibration import MEMORY_CALIBRATION
from pipette_cp.cost.stack.frameworks import resolve_framework
from pipette_cp.specs import Instance, SearchSpace
from pipette_cp.specs.knobs import KNOBS
from pipette_cp.specs.layouts import make_plan


@dataclass(frozen=True)
class Capacity:
    """The whole-model memory lower bound of an instance (bytes)."""

    model: str
    gpu: str
    """The GPU type with the most usable memory (a stage may land on it)."""
    usable_bytes: float
    num_gpus: int
    sharded_bytes: float
    """``M - R``: what the GPUs share between them (state, activations, reserve)."""
    runtime_bytes: float
    """``R``: what every GPU holds on its own (CUDA context, NCCL buffers)."""

    def per_gpu_bytes(self, gpus: int | None = None) -> float:
        """Lower bound of every layout's worst-stage peak on at most ``gpus`` GPUs."""
        return self.runtime_bytes + self.sharded_bytes / (gpus or self.num_gpus)

    @property
    def total_bytes(self) -> float:
        """Bytes the model needs across the whole cluster at that sharding."""
        return self.num_gpus * self.per_gpu_bytes()

    @property
    def fits(self) -> bool:
        """Whether some layout may fit (the bound is within the usable memory)."""
        return self.per_gpu_bytes() <= self.usable_bytes

    @property
    def gpus_needed(self) -> int | None:
        """Fewest GPUs of this type that may hold the model (``None``: no number can)."""
        room = self.usable_bytes - self.runtime_bytes
        if room <= 0:
            return None
        n = max(1, math.ceil(self.sharded_bytes / room))
        return n if self.per_gpu_bytes(n) <= self.usable_bytes else n + 1

    def message(self, hints: list[str] | None = None) -> str:
        """One line: the real deficit, and the GPUs it would take."""
        needed = self.gpus_needed
        count = (
            "no number of such GPUs is enough"
            if needed is None
            else f"at least {needed} such GPUs are needed"
        )
        text = (
            f"nothing fits in memory: {self.model} needs at least {self.per_gpu_bytes() / 1e9:.2f} GB per GPU even at "
            f"maximal sharding ({self.total_bytes / 1e9:.0f} GB across {self.num_gpus} GPUs), "
            f"the {self.gpu} has {self.usable_bytes / 1e9:.2f} GB usable: {count}, "
            f"the cluster has {self.num_gpus}"
        )
        return text + ("; or " + ", ".join(hints) if hints else "")


def model_capacity(instance: Instance, space: SearchSpace | None = None) -> Capacity:
    """The whole-model memory lower bound of ``instance`` (see the module docstring).

    ``space``: the knobs the layouts may use (default: the instance's search space);
    a knob the space leaves empty counts as unrestricted."""
    space = space or instance.search_space
    model, training, cluster = instance.model, instance.training, instance.cluster
    own = resolve_framework(training.framework).runtime_bytes  # the framework's, if its own
    runtime = MEMORY_CALIBRATION.runtime_bytes if own is None else own
    lightest = math.inf
    light = [knob for knob in KNOBS if knob.lightest is not None]
    for values in product(*(knob.lightest(space) for knob in light if knob.lightest)):
        fields: dict[str, Any] = {}
        for knob, value in zip(light, values, strict=True):
            fields.update(knob.assignment(value))
        whole = make_plan(num_layers=model.num_layers, dp=1, pp=1, tp=1, **fields)
        (stage,) = memory_by_stage(model, training, whole, MEMORY_CALIBRATION)
        lightest = min(lightest, stage.total_bytes)
    gpu = max(cluster.gpu_types.values(), key=usable_memory_bytes)
    return Capacity(
        model=model.name,
        gpu=gpu.name,
        usable_bytes=usable_memory_bytes(gpu, training),
        num_gpus=cluster.num_gpus,
        sharded_bytes=max(lightest - runtime, 0.0),
        runtime_bytes=runtime,
    )


def capacity_error(instance: Instance, space: SearchSpace | None = None) -> str | None:
    """The one-line error when no layout of ``instance`` can fit, else ``None``."""
    space = space or instance.search_space
    capacity = model_capacity(instance, space)
    if capacity.fits:
        return None
    wide = model_capacity(instance, SearchSpace())  # every knob allowed
    return capacity.message(knob_hints(space, knobs_only=True) if wide.fits else None)


def knob_hints(space: SearchSpace, *, knobs_only: bool = False) -> list[str]:
    """The changes of the search space (and, unless ``knobs_only``, of the cluster)
    that could make a layout fit."""
    hints = []
    if "full" not in space.recompute:
        hints.append("allow --recompute full")
    if True not in space.distributed_optimizer:
        hints.append("allow the distributed optimizer")
    if 1 not in space.micro_batch_size:
        hints.append("allow micro-batch 1")
    if not knobs_only:
        if any(d is not None for d in (space.tp, space.pp, space.dp)):
            hints.append("allow more --tp/--pp/--dp values")
        hints.append("use more GPUs or GPUs with more memory")
    return hints
