"""Plain layout constructors every layer may use: even splits and Megatron's rank order.

Megatron-LM builds its process groups from the global rank with the order
string ``tp-dp-pp`` (``RankGenerator`` in ``megatron/core/parallel_state.py``):
``rank = tp_rank + tp * (dp_rank + dp * pp_rank)``, and rank r runs on the
r-th GPU of the hostfile order.  That is the ``megatron-default`` placement.
"""

from __future__ import annotations

import functools
from typing import Any

from pipette_cp.specs.plan import Plan, share_placement


def even_split(num_layers: int, pp: int, vpp: int = 1) -> tuple[int, ...]:
    """Layers per model chunk, as even as possible.

    When ``pp * vpp`` divides ``num_layers`` this is Megatron's split.  Otherwise
    the remainder goes to the middle chunks, away from the first (embedding)
    and last (LM head) stages.

    >>> even_split(24, 4)
    (6, 6, 6, 6)
    >>> even_split(10, 4)
    (2, 3, 3, 2)
    """
    chunks = pp * vpp
    base, extra = divmod(num_layers, chunks)
    split = [base] * chunks
    middle = sorted(range(chunks), key=lambda c: (abs(c - (chunks - 1) / 2), c))
    for c in middle[:extra]:
        split[c] += 1
    return tuple(split)


def megatron_placement(dp: int, pp: int, tp: int) -> tuple[tuple[int, ...], ...]:
    """Units (stage * dp + replica) -> GPUs under Megatron's tp-dp-pp rank order (with
    context parallelism pass dp * cp: the order is tp-cp-dp-pp): unit ``u`` holds GPUs
    ``tp u .. tp u + tp - 1``, so the placement depends on ``dp x pp`` and ``tp`` only
    and is shared by every layout of that size (a search builds one per layout: at
    100,000 GPUs each is megabytes).

    >>> megatron_placement(dp=2, pp=2, tp=2)
    ((0, 1), (2, 3), (4, 5), (6, 7))
    """
    return _chunks(dp * pp, tp)


@functools.cache
def _chunks(units: int, tp: int) -> tuple[tuple[int, ...], ...]:
    return share_placement(tuple(tuple(range(tp * u, tp * u + tp)) for u in range(units)))


def make_plan(
    *,
    num_layers: int,
    dp: int,
    pp: int,
    tp: int,
    micro_batch_size: int,
    cp: int = 1,
    ep: int = 1,
    etp: int | None = None,
    vpp: int = 1,
    layer_split: tuple[int, ...] | None = None,
    placement: tuple[tuple[int, ...], ...] | None = None,
    **knobs: Any,
) -> Plan:
    """A plan with an even split and Megatron's default placement unless given.

    ``knobs``: any other knob field of :class:`~pipette_cp.specs.plan.Plan`
    (``sequence_parallel``, ``recompute``, ``dp_sharding``, ...; see
    :data:`pipette_cp.specs.knobs.KNOBS`); the plan derives ``distributed_optimizer``
    from a given ``dp_sharding`` and ``flash_attention`` from a given ``attention_kernel``.
    """
    return Plan(
        dp=dp,
        pp=pp,
        tp=tp,
        micro_batch_size=micro_batch_size,
        cp=cp,
        ep=ep,
        etp=etp,
        vpp=vpp,
        **knobs,
        layer_split=layer_split or even_split(num_layers, pp, vpp),
        placement=placement or megatron_placement(dp * cp, pp, tp),
    )
