"""The exposed time of the context-parallel key/value ring of one layer.

Megatron-Core's p2p context parallelism (``--cp-comm-type p2p``, Transformer Engine's
``AttnFuncWithCPAndKVP2P``): each of the ``cp`` ranks of a ring holds ``s / cp`` tokens
of every sequence (two load-balanced chunks), computes attention against the K/V chunk
it holds while it sends that chunk to the next rank and receives the previous rank's,
``cp`` attention steps and ``cp - 1`` transfers in all.  Forward passes K and V
(:func:`~pipette_cp.cost.workload.tokens.cp_chunk_bytes`), backward K, V and their gradients (twice
the bytes).

Overlap (assumption): transfer ``i`` runs alongside attention step ``i`` on the chunk
already held, and the load-balanced chunks give every step the same ``1 / cp`` of the
attention core, so a pass takes ``core + (cp - 1) x max(0, transfer - core / cp)``:
the exposed ring time is ``(cp - 1) x max(0, bytes / B - core / cp)`` per direction.
This per-step form is never below the aggregate ``max(0, (cp - 1) bytes / B - core)``
and equals it when the bandwidth is huge (0) or tiny (both ~ ``(cp - 1) bytes / B``).

The bandwidth ``B`` is the bottleneck link of the stage's rings (from the placement,
:func:`pipette_cp.cost.network.parallel_groups.cp_ring_bandwidths`).  Per-step latency is ignored here:
:func:`pipette_cp.cost.compute.model_chunks.chunk_times` receives no ring latency (a few
microseconds per step against milliseconds of attention at the sequence lengths where
context parallelism is used).

Another framework's ring is costed with the same per-step form and bytes.  torchtitan's
(PyTorch's ``context_parallel``) differs: it all-gathers K/V once, after the first step,
and passes dK/dV in fp32, both at the query heads' width (torchtitan repeats K/V before
SDPA); not modelled.  On NVLink the attention hides it (torchtitan's 8B rows); a ring
across nodes (its 405B rows, tp 8) may expose part of the all-gather.  Its attention
steps run slower than one fused kernel call: the framework's ``cp_attention_efficiency``
(:mod:`pipette_cp.cost.stack.frameworks`), which :func:`pipette_cp.cost.compute.model_chunks.cp_step_thresholds_s`
includes.
"""

from __future__ import annotations

from pipette_cp.cost.workload.tokens import cp_chunk_bytes
from pipette_cp.errors import InfeasibleError
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import TrainingSpec


def check_cp_bandwidth(plan: Plan, bandwidth_bytes_per_s: float) -> None:
    """Refuse a context-parallel plan without a positive ring bandwidth.

    Raises
    ------
    InfeasibleError
        ``cp > 1`` and ``bandwidth_bytes_per_s <= 0`` (a failed link in a ring, or a
        caller that did not pass the ring's bandwidth).
    """
    if plan.cp > 1 and not bandwidth_bytes_per_s > 0:
        raise InfeasibleError(
            f"cp_bandwidth_bytes_per_s={bandwidth_bytes_per_s}: must be positive for "
            f"cp={plan.cp} (a failed link inside a context-parallel ring)"
        )


def ring_exposed_s(
    model: ModelSpec,
    training: TrainingSpec,
    plan: Plan,
    bandwidth_bytes_per_s: float,
    core_forward_s: float,
    core_backward_s: float,
) -> tuple[float, float]:
    """(forward, backward) ring time one layer's attention does not hide, s (0 with
    cp = 1): ``(cp - 1) x max(0, n x chunk / B - core / cp)``, ``n`` = 1 forward, 2
    backward."""
    cp = plan.cp
    if cp == 1:
        return 0.0, 0.0
    check_cp_bandwidth(plan, bandwidth_bytes_per_s)
    step = cp_chunk_bytes(model, training, plan) / bandwidth_bytes_per_s
    forward = (cp - 1) * max(0.0, step - core_forward_s / cp)
    backward = (cp - 1) * max(0.0, 2.0 * step - core_backward_s / cp)
    return forward, backward


def per_rank_training(training: TrainingSpec, plan: Plan) -> TrainingSpec:
    """``training`` with the ``s / cp`` tokens a context-parallel rank holds of each
    sequence, for counts that are linear in the tokens (the FP8 casts); itself with cp = 1."""
    if plan.cp == 1:
        return training
    return training.model_copy(update={"seq_length": training.seq_length // plan.cp})
