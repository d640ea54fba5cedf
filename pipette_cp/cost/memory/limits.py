"""What a stage may hold: the GPU's usable memory and the micro-batches in flight.

:func:`usable_memory_bytes` is the limit every plan's memory bound is checked against;
:func:`in_flight_microbatches` how many micro-batches' activations a pipeline stage
holds at its peak under Megatron's schedules.
"""

from __future__ import annotations

from pipette_cp.specs.gpu import GpuSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import TrainingSpec
from pipette_cp.units import GiB

#: Headroom kept free on every GPU by default (2% of its memory, at least 1 GiB): the
#: caching allocator needs room for the largest transient block (assumption, not fitted).
USABLE_HEADROOM_FRACTION = 0.02


def usable_memory_bytes(gpu: GpuSpec, training: TrainingSpec | None = None) -> float:
    """Memory a plan may fill on ``gpu``: its capacity less the headroom of ``training``
    (``memory_headroom_bytes`` or ``memory_headroom_fraction``; neither, or no
    ``training``: 2 % of the GPU's memory, at least 1 GiB).

    >>> from pipette_cp.specs.gpu import resolve_gpu
    >>> a100 = resolve_gpu("a100-80gb")
    >>> tr = TrainingSpec(global_batch_size=8, seq_length=2048, memory_headroom_bytes=4 * GiB)
    >>> round(usable_memory_bytes(a100) / 2**30, 1), round(usable_memory_bytes(a100, tr) / 2**30, 1)
    (78.4, 76.0)
    >>> tr = TrainingSpec(global_batch_size=8, seq_length=2048, memory_headroom_fraction=0.1)
    >>> round(usable_memory_bytes(a100, tr) / 2**30, 1)
    72.0
    """
    if training is not None and training.memory_headroom_bytes is not None:
        return gpu.memory_bytes - training.memory_headroom_bytes
    if training is not None and training.memory_headroom_fraction is not None:
        return gpu.memory_bytes * (1.0 - training.memory_headroom_fraction)
    return gpu.memory_bytes - max(USABLE_HEADROOM_FRACTION * gpu.memory_bytes, 1.0 * GiB)


def num_microbatches(training: TrainingSpec, plan: Plan) -> int:
    """Micro-batches per pipeline per iteration, ``global_batch / (dp x mb)`` (>= 1)."""
    return max(1, training.global_batch_size // (plan.dp * plan.micro_batch_size))


def in_flight_microbatches(plan: Plan, stage: int, num_microbatches: int) -> float:
    """Micro-batches whose activations ``stage`` holds at its peak, in stage units.

    1F1B (Narayanan et al. 2021, sec. 2.2): stage i (0-based) holds
    ``min(m, p - i)``.  Interleaved 1F1B with v chunks: Megatron's schedule warms up
    ``2 (p - i - 1) + (v - 1) p`` chunk-micro-batches and holds one more in the
    steady state (at most ``m v``), i.e. ``p + (p - 1)/v`` stage-equivalents on stage
    0 (Megatron theoretical_memory_usage.py interleaving penalty).

    >>> from pipette_cp.specs.layouts import make_plan
    >>> in_flight_microbatches(make_plan(num_layers=8, dp=1, pp=4, tp=1, micro_batch_size=1), 1, 16)
    3.0
    >>> p = make_plan(num_layers=16, dp=1, pp=4, tp=1, micro_batch_size=1, vpp=2)
    >>> in_flight_microbatches(p, 0, 16)
    5.5
    """
    p, v, m = plan.pp, plan.vpp, num_microbatches
    if v == 1:
        return float(min(m, p - stage))
    # megatron/core/pipeline_parallel/schedules.py, interleaved: num_warmup_microbatches
    chunk_units = min(2 * (p - stage - 1) + (v - 1) * p + 1, m * v)
    return chunk_units / v
