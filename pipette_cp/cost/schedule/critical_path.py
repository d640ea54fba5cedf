"""Iteration time of a pipeline schedule: an analytic critical-path model.

The model follows the schedules Megatron-LM runs
(``megatron/core/pipeline_parallel/schedules.py``) and is checked against the
discrete-event simulator of :mod:`pipette_cp.cost.schedule.simulator`, which replays
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

**Hidden critical path** (docs/design.md, section 2).  Plain 1F1B uses blocking
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

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np

from pipette_cp.cost.schedule.inputs import (
    IterationTail,
    PipelineInputs,
    Schedule,
    finish_iteration,
)

__all__ = [
    "IterationTail", "PipelineInputs", "PipelineTimes", "Schedule", "finish_iteration",
    "gpipe", "interleaved", "one_f_one_b", "pipeline_times",
]  # fmt: skip


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
    out = np.zeros(a.shape)
    out[..., 1:] = a[..., :-1]
    return out


def _before(a: np.ndarray) -> np.ndarray:
    out = np.zeros(a.shape)  # out[..., s] = sum(a[..., :s])
    np.cumsum(a[..., :-1], axis=-1, out=out[..., 1:])
    return out


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
    overlapped = np.maximum(np.maximum(busy, rt1 + busy - h1), e_last + rt2 + b_last)
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
    terms = _one_f_one_b_terms(p, m, f.tobytes(), b.tobytes())
    inner, w, rem, after_fb, busy_fb, warm_f, warm_b = terms
    cfn, cbn = fwd_hop_s * inner, bwd_hop_s * inner  # with s + 1
    cfp, cbp = _shift(cfn), _shift(cbn)  # with s - 1
    # a blocking exchange moves both directions at once (full-duplex links)
    xn, xp = np.maximum(cfn, cbn), np.maximum(cfp, cbp)
    rt = after_fb + _after(cfn + cbn) + cfn + cbn
    fast = m > p  # every stage has >= 2 steady iterations: the common case, no branches
    steady = rem > 0
    p2p = w * (cfp + cfn + cbn + cbp) + rem * xn + (rem - 1) * xp
    if not fast:  # warm-up only: m forwards (receive, F, send), m backwards
        p2p = np.where(steady, p2p, m * (cfn + cbn) + (m - 1) * (cfp + cbp))
    busy = busy_fb + p2p
    # first backward: after w + 1 forwards, or after all m of them (warm-up only)
    h1 = warm_f + w * (cfn + cfp) + xn
    e_last = busy - xn - warm_b - w * (cbp + cbn)
    if not fast:
        h1 = np.where(steady, h1, m * (f + cfn) + (m - 1) * cfp + cbn)
        e_last = np.where(steady, e_last, m * f + (m - 1) * (cfn + cfp))
    inner_path = _through_stage(h1, f + rt, e_last, rt, busy, b, None if fast else rem <= 1)
    drain = _before(b + cbn)
    return _before(f + cfn) + inner_path + drain, drain


@lru_cache(maxsize=256)
def _one_f_one_b_terms(p: int, m: int, forward: bytes, backward: bytes) -> tuple:
    """The terms of :func:`one_f_one_b` without hops: ``s < p - 1``, ``w``, ``m - w``,
    ``_after(f + b)``, ``m (f + b)``, ``(w + 1) f``, ``(w + 1) b`` (by the exact bytes
    of the stage times: a search times the same stages on many placements)."""
    f, b = np.frombuffer(forward), np.frombuffer(backward)
    s = np.arange(p)
    w = np.minimum(p - 1 - s, m)
    out = (s < p - 1, w, m - w, _after(f + b), m * (f + b), (w + 1) * f, (w + 1) * b)
    for a in out:
        a.flags.writeable = False
    return out


def _chunk_counts(k: np.ndarray, pp: int, vpp: int) -> np.ndarray:
    """Count of each chunk among forward ops ``0 .. k - 1`` (shape ``k.shape + (vpp,)``):
    Megatron's ``get_schedule_table`` runs chunk ``c`` at ops ``g pp vpp + c pp + [0, pp)``."""
    k, period = np.asarray(k)[..., None], pp * vpp
    return (k // period) * pp + np.clip(k % period - np.arange(vpp) * pp, 0, pp)


@lru_cache(maxsize=64)
def _interleaved_indices(p: int, v: int, m: int) -> tuple[Any, ...]:
    """What :func:`interleaved` needs that depends on no time, only on (p, v, m)."""
    n, total, s, u = p * v, m * v, np.arange(p), np.arange(p * v)
    warm = np.minimum(2 * (p - 1 - s) + (v - 1) * p, total)
    rem = total - warm
    n_warm = _chunk_counts(warm, p, v)
    n_cool = (m - _chunk_counts(rem, p, v))[:, ::-1]  # mirror chunks of ops rem..total-1
    out = (u % p, u < n - 1, (u % p - 1) % p, u > 0, np.arange(v)[None, :] * p + s[:, None],
           (s - 1) % p, warm, rem, n_warm, m - n_warm, n_cool, (warm % n) // p, (v - 1) * p + s,
           v - 1 - ((rem - 1) % n) // p)  # fmt: skip
    for a in out:
        a.flags.writeable = False
    # stages whose last forward precedes their first backward (None: no such stage)
    return (*out, rem <= 1 if (rem <= 1).any() else None)


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
    f, b = x.forward_s, x.backward_s
    idx = _interleaved_indices(p, v, m)
    hop_f, not_last, hop_b, not_first, vs, prev, warm, rem, n_warm, n_steady, n_cool = idx[:11]
    first_chunk, top, last_first, s = idx[11], idx[12], idx[14], np.arange(p)
    terms = _interleaved_terms(p, v, m, f.tobytes(), b.tobytes())
    fs, busy_b, after_b, f_top, b_s, before_b = terms
    cf_out = np.where(not_last, x.fwd_hop_s[hop_f], 0.0)
    cb_out = np.where(not_first, x.bwd_hop_s[hop_b], 0.0)
    send = cf_out[vs]
    # warm-up calls also receive the next input, cool-down calls the next gradient; the
    # ones of the first (last) stage not always (a chunk-0 input comes from the data, a
    # last-chunk gradient from the loss): their hop is not charged there
    wsend = np.maximum(send, np.where(s > 0, x.fwd_hop_s[prev], 0.0)[:, None])
    bsend = np.maximum(cb_out[vs], np.where(s < p - 1, x.bwd_hop_s, 0.0)[:, None])
    warm_fwd, steady_fwd = n_warm * (fs + wsend), fs + send
    fwd_busy = (warm_fwd + n_steady * steady_fwd).sum(axis=1)
    # the last backward's own send belongs to the drain
    cool_p2p = (n_cool * bsend).sum(axis=1) - np.where(warm > 0, bsend[:, 0], 0.0)
    busy = fwd_busy + busy_b + cool_p2p
    first_steady = steady_fwd[s, first_chunk]
    h1 = np.where(rem > 0, warm_fwd.sum(axis=1) + first_steady, fwd_busy)
    fwd_from = np.cumsum((f + cf_out)[::-1])[::-1]  # sum_{w >= u} (f + cf)
    bwd_after = _after(b + cb_out)  # sum_{w > u} (b + cb)
    rt1 = fwd_from[s] + bwd_after[top]
    rt2 = fwd_from[top] - f_top + bwd_after[s]
    # end of the last forward: all but its send and the backwards after it
    after_last = after_b + cool_p2p
    e_last = np.where(rem > 0, busy - send[:, -1] - after_last, fwd_busy - send[:, -1])
    inner = _through_stage(h1, rt1, e_last, rt2, busy, b_s, last_first)
    # fill: chunk 0 of micro-batch 0 down to s; drain: its last gradient back to stage 0
    fill, drain = _before(f[:p] + cf_out[:p]), before_b + np.cumsum(cb_out[:p])
    return max(float((fill + inner + drain).max()), _gradient_chain(x, fill, fs)), drain


@lru_cache(maxsize=256)
def _interleaved_terms(p: int, v: int, m: int, forward: bytes, backward: bytes) -> tuple:
    """The terms of :func:`interleaved` and :func:`_gradient_chain` without hops, by the
    exact bytes of the chunk times (a search times the same chunks on many placements)."""
    f, b = np.frombuffer(forward), np.frombuffer(backward)
    idx, s = _interleaved_indices(p, v, m), np.arange(p)
    vs, n_cool, top, last_chunk = idx[4], idx[10], idx[12], idx[13]
    fs, bs = f[vs], b[vs]
    out = (fs, m * bs.sum(axis=1), bs[s, last_chunk] + (n_cool * bs).sum(axis=1), f[top], b[s],
           _before(b[:p]))  # fmt: skip
    for a in out:
        a.flags.writeable = False
    return out


@lru_cache(maxsize=16)  # (p, m v) arrays: a search meets few (p, v, m)
def _chain_indices(p: int, v: int, m: int) -> tuple[np.ndarray, ...]:
    """Gather indices of :func:`_gradient_chain` (they depend only on p, v, m): each
    (stage, op) picks from the per-(stage, chunk) tables of forward-op time, cool-down
    send (``p v`` further on) and 0 (``2 p v``), and from the backward times."""
    n, total = p * v, m * v
    s, k = np.arange(p)[:, None], np.arange(total)[None, :]
    warm = np.minimum(2 * (p - 1 - s) + (v - 1) * p, total)
    fchunk = (k % n) // p
    fop = s * v + fchunk  # forward op k of stage s in the (p, v) table
    u_b = (v - 1 - fchunk) * p + s
    nxt = np.take_along_axis(fop, np.minimum(k + 1 + warm, total - 1), axis=1)
    # after the last steady backward only the next gradient is awaited: its send is
    # waited at the very end (Megatron's overlap_p2p_comm), so no exchange is charged
    cool = np.where(k + 1 == total - warm, 2 * n, n + s * v + fchunk)
    gap = np.where(k + 1 < total - warm, nxt, cool)
    head = np.where(np.arange(total)[None, :] <= warm, fop, 2 * n)
    for a in (u_b, gap, head):
        a.flags.writeable = False
    return u_b, gap, head


def _gradient_chain(x: PipelineInputs, fill: np.ndarray, fs: np.ndarray) -> float:
    """Longest path that follows the gradient chain down the stages (interleaved).

    Backward op ``k`` of stage ``s`` needs backward op ``k`` of ``s + 1``; a
    path may ride one stage's op sequence, then step down to ``s - 1`` at any
    op.  This catches a heavy chunk on a late stage followed by a heavy chunk
    on an early one, which no single-stage path sees.  A longest-path dynamic
    program over (stage, backward op), one cumulative maximum per stage.  ``fs``: the
    forward time of each (stage, chunk).
    """
    p, v = x.pp, x.vpp
    n, s, c = p * v, np.arange(p)[:, None], np.arange(v)[None, :]
    u_b, gap_at, head_at = _chain_indices(p, v, x.num_micro_batches)
    # per (stage, chunk): forward op time (with its send), cool-down send of the mirror chunk
    u_f, mirror = c * p + s, (v - 1 - c) * p + s
    fop = fs + np.where(u_f < n - 1, x.fwd_hop_s[s], 0.0)
    cool = np.maximum(np.where(mirror > 0, x.bwd_hop_s[(s - 1) % p], 0.0),
                      np.where(s < p - 1, x.bwd_hop_s[s], 0.0))  # as bsend in interleaved()  # fmt: skip
    table = np.concatenate((fop.ravel(), cool.ravel(), [0.0]))
    bop = x.backward_s[u_b]
    # own-sequence start of backward op k, from the start of forward op 0:
    # warm-up forwards + first steady forward, then (backward, next forward) pairs
    gap = bop + table[gap_at]
    head = table[head_at].sum(axis=1)
    before = np.zeros((p, gap.shape[1] + 1))
    np.cumsum(gap, axis=1, out=before[:, 1:])  # before[:, k] = sum(gap[:, :k])
    start = head[:, None] + before[:, :-1] + fill[:, None]
    down = [*x.bwd_hop_s[: p - 1].tolist(), 0.0]  # gradient hop into stage s - 1 ... per s
    best = start[p - 1] + bop[p - 1]
    wait = np.zeros(best.size + 1)  # wait[k + 1] = max(0, max_{k' <= k} step[k'])
    step = wait[1:]
    for st in range(p - 2, -1, -1):
        # arrive at backward op k of stage st from op k' <= k of stage st + 1
        row = start[st]
        np.subtract(np.add(best, down[st], out=step), row, out=step)
        np.maximum.accumulate(wait, out=wait)
        np.add(np.add(row, step, out=best), bop[st], out=best)
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
    if x.schedule == "gpipe":
        ends = gpipe(x)
        free_ends = gpipe(replace(x, fwd_hop_s=np.zeros(p), bwd_hop_s=np.zeros(p)))
        return PipelineTimes(float(ends.max()), ends, compute, last_b, float(free_ends.max()))
    total, drain = interleaved(x)
    ends = total - drain + x.bwd_hop_s[(np.arange(p) - 1) % p] * (np.arange(p) > 0)
    f, b = x.forward_s.tobytes(), x.backward_s.tobytes()
    return PipelineTimes(
        total, ends, compute, last_b, _free_hops(p, x.vpp, x.num_micro_batches, f, b)
    )


@lru_cache(maxsize=256)
def _free_hops(p: int, v: int, m: int, forward: bytes, backward: bytes) -> float:
    """:func:`interleaved` with free hops, by the exact bytes of its chunk times (a search
    times the same chunks on many placements)."""
    zeros, f, b = np.zeros(p), np.frombuffer(forward), np.frombuffer(backward)
    x = PipelineInputs(pp=p, vpp=v, schedule="interleaved", num_micro_batches=m, forward_s=f,
                       backward_s=b, fwd_hop_s=zeros, bwd_hop_s=zeros)  # fmt: skip
    return interleaved(x)[0]
