"""Iteration time of a pipeline schedule: an analytic critical-path model.

The model follows the schedules Megatron-LM runs
(``megatron/core/pipeline_parallel/schedules.py``) and is checked against the
discrete-event simulator of :mod:`pipette_cp.cost.simulator`, which replays
them op by op.

Notation: ``p`` stages, ``m`` micro-batches, ``v`` model chunks per stage;
``f[u]``, ``b[u]`` the forward / backward time of virtual stage
``u = chunk * p + stage``; ``cf[s]`` the activation hop s -> s+1, ``cb[s]``
the gradient hop s+1 -> s.

**Critical path through one stage.**  For each stage ``s`` the model takes
the longest path that (1) brings micro-batch 0 to ``s`` (*fill*), (2) runs
through ``s``'s own op sequence, where two waits may interrupt it: before
its first backward (the gradient of micro-batch 0 must come back from the
later stages, a *round trip*) and before its last backward (same for the last
micro-batch), and (3) carries the last gradient back to stage 0 (*drain*).
The iteration's pipeline time is the maximum over ``s``.  With equal stages
and no communication this is the textbook ``(m + p - 1)(f + b)`` for 1F1B and
``(m v + p - 1)(f + b) / v`` for the interleaved schedule (Narayanan et al.,
SC'21, section 2.2); GPipe is solved exactly as a flow shop.

**Hidden critical path** (DESIGN.md section 2).  Plain 1F1B uses blocking
``batch_isend_irecv``: a rank sends and then waits until its neighbour has
received.  In the steady state every middle stage therefore makes two
blocking exchanges per micro-batch (``send_forward_recv_backward`` with
``s + 1`` and ``send_backward_recv_forward`` with ``s - 1``), so its period
is ``f + b + x[s-1] + x[s]`` with ``x = max(cf, cb)`` (both directions run
at once).  Over ``p`` micro-batches that is a full round trip of the
pipeline's hops, which Pipette writes as ``k * C_pp`` every ``p``
micro-batches; the model keeps it per stage, so a slow hop only slows the
stages it touches.  The interleaved schedule runs with Megatron's defaults
``overlap_p2p_comm`` (receives posted ahead) and
``deallocate_pipeline_outputs`` (each forward send waited at once): a stage
pays ``cf`` after every forward chunk but gradient sends overlap.

**m not divisible by p** (Pipette's flaw 2): nothing assumes it; every stage
does all ``m`` forwards and backwards (``min(p - s - 1, m)`` in warm-up).

**Accuracy.**  Every term is a real path of the schedule, so the model is a
lower bound of the simulator: exact for equal stages and for GPipe, within 2 %
for realistic 1F1B splits; interleaving with unequal *chunks* can be 15 % low
(cycles through the last -> first hop): re-rank those plans with the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

Schedule = Literal["1f1b", "interleaved", "gpipe"]


def _array(value: object, length: int) -> np.ndarray:
    array = np.array(value, dtype=float)
    if array.shape != (length,):
        array = np.broadcast_to(array, (length,)).copy()
    array.flags.writeable = False
    return array


@dataclass(frozen=True, eq=False)
class PipelineInputs:
    """Everything the schedule models need (times in s; arrays read-only).

    ``schedule``: Megatron's ``"1f1b"``, its ``"interleaved"`` 1F1B (``vpp > 1``)
    or ``"gpipe"``.  ``forward_s``, ``backward_s``: per virtual stage
    ``chunk * pp + stage``, one micro-batch, TP communication and recomputation
    included.  ``fwd_hop_s[s]``: one activation from stage ``s`` to
    ``(s + 1) % pp`` (the last entry only matters when interleaved: the last
    stage feeds stage 0); ``bwd_hop_s[s]``: one gradient from ``(s + 1) % pp``
    back to ``s``.  Per stage: ``dp_sync_s`` (gradient reduction, hidden under
    the last backward with ``overlap_grad_reduce``), ``optimizer_s`` and
    ``param_gather_s`` (distributed optimizer, 0 when overlapped).
    ``embedding_sync_s``: tied-embedding all-reduce, first <-> last stage.
    """

    pp: int
    num_micro_batches: int
    forward_s: np.ndarray
    backward_s: np.ndarray
    fwd_hop_s: np.ndarray
    bwd_hop_s: np.ndarray
    vpp: int = 1
    schedule: Schedule = "1f1b"
    dp_sync_s: np.ndarray = field(default_factory=lambda: np.zeros(1))
    overlap_grad_reduce: bool = False
    embedding_sync_s: float = 0.0
    optimizer_s: np.ndarray = field(default_factory=lambda: np.zeros(1))
    param_gather_s: np.ndarray = field(default_factory=lambda: np.zeros(1))

    def __post_init__(self) -> None:
        for name in ("forward_s", "backward_s"):
            object.__setattr__(self, name, _array(getattr(self, name), self.pp * self.vpp))
        for name in ("fwd_hop_s", "bwd_hop_s", "dp_sync_s", "optimizer_s", "param_gather_s"):
            object.__setattr__(self, name, _array(getattr(self, name), self.pp))
        if self.pp == 1:
            object.__setattr__(self, "embedding_sync_s", 0.0)
        if (self.vpp > 1) != (self.schedule == "interleaved"):
            raise ValueError(f"schedule={self.schedule!r} does not match vpp={self.vpp}")

    @classmethod
    def uniform(
        cls,
        *,
        pp: int,
        num_micro_batches: int,
        forward_s: float,
        backward_s: float,
        hop_s: float = 0.0,
        vpp: int = 1,
        schedule: Schedule | None = None,
    ) -> PipelineInputs:
        """Equal stages and hops: the textbook case."""
        return cls(
            pp=pp, num_micro_batches=num_micro_batches, forward_s=np.full(pp * vpp, forward_s),
            backward_s=np.full(pp * vpp, backward_s), fwd_hop_s=np.full(pp, hop_s),
            bwd_hop_s=np.full(pp, hop_s), vpp=vpp,
            schedule=schedule or ("interleaved" if vpp > 1 else "1f1b"),
        )  # fmt: skip


@dataclass(frozen=True)
class IterationTail:
    """What follows the pipeline flush: gradient syncs, then the optimizer."""

    dp_sync_start_s: np.ndarray
    dp_sync_end_s: np.ndarray
    embedding_start_s: float
    embedding_s: float
    optimizer_start_s: float
    optimizer_s: float
    param_gather_s: float
    total_s: float


def finish_iteration(
    inputs: PipelineInputs, stage_end_s: np.ndarray, last_backward_s: np.ndarray
) -> IterationTail:
    """Add the gradient syncs and the optimizer step to the pipeline's end times.

    Megatron calls ``finalize_model_grads`` on every rank right after its
    schedule ends: the DP gradient reduction of its stage, then (first and
    last stage) the tied-embedding all-reduce; ``optimizer.step`` then starts
    with a global grad-norm / inf check all-reduce, a barrier over all stages.
    With ``overlap_grad_reduce`` the bucketed reduction is launched during the
    stage's last backward, so up to that backward's duration is hidden.
    """
    ends = np.asarray(stage_end_s, dtype=float)
    window = np.asarray(last_backward_s, dtype=float) if inputs.overlap_grad_reduce else 0.0
    dp = inputs.dp_sync_s
    # overlap_grad_reduce hides at most the last backward: exposed = max(dp - b_last, 0)
    start = ends - np.minimum(window, dp)
    end = np.maximum(ends, start + dp)
    ready = float(end.max())
    emb_start = emb = 0.0
    if inputs.embedding_sync_s > 0:
        emb = float(inputs.embedding_sync_s)
        emb_start = float(max(end[0], end[-1]))
        ready = max(ready, emb_start + emb)
    opt = float(inputs.optimizer_s.max())
    gather = float(inputs.param_gather_s.max())
    return IterationTail(start, end, emb_start, emb, ready, opt, gather, ready + opt + gather)


# ------------------------------------------------------------------ analytic
@dataclass(frozen=True)
class PipelineTimes:
    """Pipeline part of an iteration (ends with the last backward); per stage: its end
    (last backward and send done), compute, and last backward (what overlap can hide);
    ``free_hops_s``: the pipeline time if hops were free."""

    pipeline_s: float
    stage_end_s: np.ndarray
    stage_compute_s: np.ndarray
    last_backward_s: np.ndarray
    free_hops_s: float


def _shift(a: np.ndarray) -> np.ndarray:
    """``out[..., s] = a[..., s - 1]``, 0 for ``s = 0``."""
    return np.concatenate((np.zeros((*a.shape[:-1], 1)), a[..., :-1]), axis=-1)


def _before(a: np.ndarray) -> np.ndarray:
    return _shift(np.cumsum(a, axis=-1))  # out[..., s] = sum(a[..., :s])


def _after(a: np.ndarray) -> np.ndarray:
    return a.sum(axis=-1, keepdims=True) - np.cumsum(a, axis=-1)  # sum(a[..., s + 1:])


def _through_stage(h1, rt1, e_last, rt2, busy, b_last, last_forward_first) -> np.ndarray:
    """Longest path through a stage's op sequence (``busy`` long alone) whose
    first backward starts ``h1`` after its first forward but not before the
    round trip ``rt1``, and whose last backward starts ``busy - b_last`` after
    it but not before ``e_last + rt2`` (end of the last forward + round trip).
    If the last forward precedes the first backward the two waits overlap."""
    # waits in sequence: max(h1, rt1) + (e_last - h1) + max(rest, rt2) + b_last
    rest = busy - b_last - e_last
    sequential = np.maximum(h1, rt1) + (e_last - h1) + np.maximum(rest, rt2) + b_last
    if last_forward_first is None:  # known to be sequential everywhere
        return sequential
    overlapped = np.maximum.reduce([busy, rt1 + busy - h1, e_last + rt2 + b_last])
    return np.where(last_forward_first, overlapped, sequential)


def one_f_one_b(
    x: PipelineInputs, fwd_hop_s: np.ndarray, bwd_hop_s: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Paths through each stage under Megatron's 1F1B, with fill and drain.

    Stage ``s`` runs ``w = min(p - s - 1, m)`` warm-up forwards (blocking
    receive, forward, blocking send), ``m - w`` steady iterations (forward,
    exchange with ``s + 1``, backward, exchange with ``s - 1``), ``w``
    cool-down backwards.  Round trip from the end of a forward on ``s`` to the
    start of the same micro-batch's backward on ``s``:
    ``sum_{u > s}(f_u + b_u) + sum_{u >= s}(cf_u + cb_u)``.  The hop arrays
    may carry a leading batch axis (several hop scenarios at once).  Returns
    (paths, drains).
    """
    p, m = x.pp, x.num_micro_batches
    f, b = x.forward_s, x.backward_s
    s = np.arange(p)
    inner = s < p - 1
    cfn, cbn = fwd_hop_s * inner, bwd_hop_s * inner  # with s + 1
    cfp, cbp = _shift(cfn), _shift(cbn)  # with s - 1
    # a blocking exchange moves both directions at once (full-duplex links)
    xn, xp = np.maximum(cfn, cbn), np.maximum(cfp, cbp)
    w = np.minimum(p - 1 - s, m)
    rem = m - w
    rt = _after(f + b) + _after(cfn + cbn) + cfn + cbn
    fast = m > p  # every stage has >= 2 steady iterations: the common case, no branches
    steady = rem > 0
    p2p = w * (cfp + cfn + cbn + cbp) + rem * xn + (rem - 1) * xp
    if not fast:  # warm-up only: m forwards (receive, F, send), m backwards
        p2p = np.where(steady, p2p, m * (cfn + cbn) + (m - 1) * (cfp + cbp))
    busy = m * (f + b) + p2p
    # first backward: after w + 1 forwards, or after all m of them (warm-up only)
    h1 = (w + 1) * f + w * (cfn + cfp) + xn
    e_last = busy - xn - (w + 1) * b - w * (cbp + cbn)
    if not fast:
        h1 = np.where(steady, h1, m * (f + cfn) + (m - 1) * cfp + cbn)
        e_last = np.where(steady, e_last, m * f + (m - 1) * (cfn + cfp))
    inner_path = _through_stage(h1, f + rt, e_last, rt, busy, b, None if fast else rem <= 1)
    drain = _before(b + cbn)
    return _before(f + cfn) + inner_path + drain, drain


def _chunk_counts(k: np.ndarray, pp: int, vpp: int) -> np.ndarray:
    """Count of each chunk among forward ops ``0 .. k - 1`` (shape ``k.shape + (vpp,)``):
    Megatron's ``get_schedule_table`` runs chunk ``c`` at ops ``g pp vpp + c pp + [0, pp)``."""
    k, period = np.asarray(k)[..., None], pp * vpp
    return (k // period) * pp + np.clip(k % period - np.arange(vpp) * pp, 0, pp)


def interleaved(x: PipelineInputs) -> tuple[float, np.ndarray]:
    """Pipeline time and drains under Megatron's interleaved 1F1B.

    Stage ``s`` holds virtual stages ``c p + s``; it runs
    ``W = min(2 (p - s - 1) + (v - 1) p, m v)`` warm-up forwards, then
    forward ``k + W`` / backward ``k`` pairs, then cool-down backwards; forward
    op ``k`` is chunk ``(k mod p v) // p``, backward op ``k`` the mirror chunk.
    Forward sends cost ``cf`` each (waited at once); gradient sends overlap in
    the steady state and block in the cool-down.  The first backward (chunk
    ``v - 1`` of micro-batch 0) waits for micro-batch 0 to pass every later
    virtual stage and come back; the last one (chunk 0 of micro-batch
    ``m - 1``) waits for the last micro-batch to go from chunk ``v - 1`` on
    ``s`` to the end and back to ``s``.
    """
    p, v, m = x.pp, x.vpp, x.num_micro_batches
    n, total = p * v, m * v
    f, b = x.forward_s, x.backward_s
    u = np.arange(n)
    cf_out = np.where(u < n - 1, x.fwd_hop_s[u % p], 0.0)
    cb_out = np.where(u > 0, x.bwd_hop_s[(u % p - 1) % p], 0.0)
    s = np.arange(p)
    vs = np.arange(v)[None, :] * p + s[:, None]  # (p, v) virtual stages of each stage
    fs, bs, send = f[vs], b[vs], cf_out[vs]
    # warm-up calls also receive the next input, cool-down calls the next gradient
    wsend = np.maximum(send, x.fwd_hop_s[(s - 1) % p][:, None])
    bsend = np.maximum(cb_out[vs], x.bwd_hop_s[s][:, None])
    warm = np.minimum(2 * (p - 1 - s) + (v - 1) * p, total)
    rem = total - warm
    n_warm = _chunk_counts(warm, p, v)
    n_cool = (m - _chunk_counts(rem, p, v))[:, ::-1]  # mirror chunks of ops rem..total-1
    fwd_busy = (n_warm * (fs + wsend) + (m - n_warm) * (fs + send)).sum(axis=1)
    # the last backward's own send belongs to the drain
    cool_p2p = (n_cool * bsend).sum(axis=1) - np.where(warm > 0, bsend[:, 0], 0.0)
    busy = fwd_busy + m * bs.sum(axis=1) + cool_p2p
    first_steady = (fs + send)[s, (warm % n) // p]
    h1 = np.where(rem > 0, (n_warm * (fs + wsend)).sum(axis=1) + first_steady, fwd_busy)
    top = (v - 1) * p + s  # chunk v - 1 of stage s
    fwd_from = np.cumsum((f + cf_out)[::-1])[::-1]  # sum_{w >= u} (f + cf)
    bwd_after = _after(b + cb_out)  # sum_{w > u} (b + cb)
    rt1 = fwd_from[s] + bwd_after[top]
    rt2 = fwd_from[top] - f[top] + bwd_after[s]
    # end of the last forward: all but its send and the backwards after it
    after_last = bs[s, v - 1 - ((rem - 1) % n) // p] + (n_cool * bs).sum(axis=1) + cool_p2p
    e_last = np.where(rem > 0, busy - send[:, -1] - after_last, fwd_busy - send[:, -1])
    inner = _through_stage(h1, rt1, e_last, rt2, busy, b[s], rem <= 1)
    # fill: chunk 0 of micro-batch 0 down to s; drain: its last gradient back to stage 0
    fill, drain = _before(f[:p] + cf_out[:p]), _before(b[:p]) + np.cumsum(cb_out[:p])
    return max(float((fill + inner + drain).max()), _gradient_chain(x, fill)), drain


def _gradient_chain(x: PipelineInputs, fill: np.ndarray) -> float:
    """Longest path that follows the gradient chain down the stages (interleaved).

    Backward op ``k`` of stage ``s`` needs backward op ``k`` of ``s + 1``; a
    path may ride one stage's op sequence, then step down to ``s - 1`` at any
    op.  This catches a heavy chunk on a late stage followed by a heavy chunk
    on an early one, which no single-stage path sees.  A longest-path dynamic
    program over (stage, backward op), one cumulative maximum per stage.
    """
    p, v, m = x.pp, x.vpp, x.num_micro_batches
    n, total = p * v, m * v
    s = np.arange(p)[:, None]
    k = np.arange(total)[None, :]
    warm = np.minimum(2 * (p - 1 - s) + (v - 1) * p, total)
    fchunk = (k % n) // p
    u_f, u_b = fchunk * p + s, (v - 1 - fchunk) * p + s
    fop = x.forward_s[u_f] + np.where(u_f < n - 1, x.fwd_hop_s[s], 0.0)
    bop = x.backward_s[u_b]
    cool = np.maximum(np.where(u_b > 0, x.bwd_hop_s[(s - 1) % p], 0.0), x.bwd_hop_s[s])
    # own-sequence start of backward op k, from the start of forward op 0:
    # warm-up forwards + first steady forward, then (backward, next forward) pairs
    nxt = np.take_along_axis(fop, np.minimum(k + 1 + warm, total - 1), axis=1)
    gap = bop + np.where(k + 1 < total - warm, nxt, cool)
    head = np.where(np.arange(total)[None, :] <= warm, fop, 0.0).sum(axis=1)
    start = head[:, None] + _before(gap) + fill[:, None]
    down = np.r_[x.bwd_hop_s[: p - 1], 0.0]  # gradient hop into stage s - 1 ... per s
    best = start[p - 1] + bop[p - 1]
    for st in range(p - 2, -1, -1):
        # arrive at backward op k of stage st from op k' <= k of stage st + 1
        best = start[st] + np.maximum(0.0, np.maximum.accumulate(best + down[st] - start[st]))
        best = best + bop[st]
    return float(best[-1])


def gpipe(x: PipelineInputs) -> np.ndarray:
    """Exact end time of every stage under GPipe with pure-lag transfers.

    With identical micro-batches the forward phase is a flow shop: stage
    ``s`` ends its forwards at ``FE_s = sum_{u<=s} f_u + sum_{u<s} cf_u +
    (m - 1) max_{u<=s} f_u``.  Stage ``s0`` starts its backwards at
    ``FE_{s0}``; the backward grid from ``s0`` down to ``s`` adds
    ``sum_{s<=u<=s0} b_u + sum_{s<=u<s0} cb_u + (m - 1) max_{s<=u<=s0} b_u``.
    Returns the stage end times.
    """
    p, m = x.pp, x.num_micro_batches
    f, b = x.forward_s, x.backward_s
    s = np.arange(p)
    cf = np.where(s < p - 1, x.fwd_hop_s, 0.0)
    cb = np.where(s < p - 1, x.bwd_hop_s, 0.0)
    # flow shop with identical jobs: longest path = sum of times + (m - 1) x bottleneck
    fe = np.cumsum(f) + _before(cf) + (m - 1) * np.maximum.accumulate(f)
    lo, hi = np.meshgrid(s, s, indexing="ij")
    cum = np.r_[0.0, np.cumsum(b + cb)]
    bmax = np.maximum.accumulate(np.where(hi >= lo, b[hi], -np.inf), axis=1)
    grid = cum[hi + 1] - cum[lo] - cb[hi] + (m - 1) * np.where(hi >= lo, bmax, 0.0)
    ends = np.where(hi >= lo, fe[hi] + grid, -np.inf).max(axis=1) + np.r_[0.0, cb[:-1]]
    return ends


def pipeline_times(x: PipelineInputs) -> PipelineTimes:
    """Analytic pipeline time of ``x.schedule`` (see the module docstring).

    Stage ``s`` ends when its last backward and that gradient's send to ``s - 1``
    are done: ``T - drain_s + cb_{s-1}``.  ``free_hops_s``: the same with free hops.

    Examples
    --------
    >>> x = PipelineInputs.uniform(pp=4, num_micro_batches=6, forward_s=1.0, backward_s=2.0)
    >>> pipeline_times(x).pipeline_s  # (m + p - 1)(f + b)
    27.0
    >>> x = PipelineInputs.uniform(pp=4, num_micro_batches=8, forward_s=0.5, backward_s=1.0, vpp=2)
    >>> pipeline_times(x).pipeline_s  # (m v + p - 1)(f + b) / v with f, b per stage
    28.5
    """
    p, last_b = x.pp, x.backward_s[: x.pp]
    compute = x.num_micro_batches * (x.forward_s + x.backward_s).reshape(x.vpp, p).sum(axis=0)
    if x.schedule == "1f1b":
        hops = np.zeros((2, 2, p))  # (real, free) x (forward, backward)
        hops[0] = x.fwd_hop_s, x.bwd_hop_s
        paths, drain = one_f_one_b(x, hops[:, 0], hops[:, 1])
        total, free = paths.max(axis=1)
        ends = total - drain[0] + _shift(x.bwd_hop_s * (np.arange(p) < p - 1))
        return PipelineTimes(float(total), ends, compute, last_b, float(free))
    free_x = replace(x, fwd_hop_s=np.zeros(p), bwd_hop_s=np.zeros(p))
    if x.schedule == "gpipe":
        ends, free_ends = gpipe(x), gpipe(free_x)
        return PipelineTimes(float(ends.max()), ends, compute, last_b, float(free_ends.max()))
    total, drain = interleaved(x)
    ends = total - drain + x.bwd_hop_s[(np.arange(p) - 1) % p] * (np.arange(p) > 0)
    return PipelineTimes(total, ends, compute, last_b, interleaved(free_x)[0])
