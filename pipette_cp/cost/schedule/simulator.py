"""Discrete-event simulator of Megatron-LM's pipeline schedules.

It replays, for one pipeline (one data-parallel replica), the exact sequence
of compute and point-to-point calls each pipeline rank makes in
``megatron/core/pipeline_parallel/schedules.py``, and times them with:

- compute ops of fixed duration (per virtual stage: forward, backward);
- transfers with rendezvous semantics (NCCL send/recv): a transfer starts
  when *both* its sender and its receiver have posted it, and lasts the hop
  time of its link;
- *blocking* calls (``batch_isend_irecv`` + wait, Megatron's default for
  plain 1F1B) post their transfers and stop the rank until all of them are
  done; *posted* calls (``overlap_p2p_comm``, Megatron's default for the
  interleaved schedule) let the rank run on until a later wait.

One pipeline stands for all replicas: :mod:`pipette_cp.cost.evaluator.evaluate` gives
it, per hop, the slowest replica's transfer time.  The result is the reference
the analytic model of :mod:`pipette_cp.cost.schedule.critical_path` is checked against, and a
:class:`Timeline` that later plots draw.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from pipette_cp.cost.schedule.critical_path import PipelineInputs, Schedule, finish_iteration

# ------------------------------------------------------------------ programs
# An op is (0, is_backward, micro_batch, virtual_stage) for compute,
# (1, send_keys, recv_keys) to post transfers, (2, keys) to wait for them.
# A transfer key is (is_backward, micro_batch, virtual stage that sends it):
# activations go to the next stage ((s + 1) % pp), gradients to the previous.


def _blocking(sends: tuple, recvs: tuple) -> list[tuple]:
    """A Megatron ``batch_isend_irecv`` call followed by its wait."""
    if not sends and not recvs:
        return []
    return [(1, sends, recvs), (2, sends + recvs)]


def _one_f_one_b(s: int, pp: int, m: int) -> list[tuple]:
    """``forward_backward_pipelining_without_interleaving`` on rank ``s``
    (Megatron-LM ``schedules.py``): warm-up of ``min(pp - s - 1, m)``
    forwards, steady 1F1B, cool-down backwards; every p2p call blocks."""
    first, last = s == 0, s == pp - 1

    def recv_f(i: int) -> tuple:
        return () if first else ((0, i, s - 1),)

    def send_f(i: int) -> tuple:
        return () if last else ((0, i, s),)

    def recv_b(i: int) -> tuple:
        return () if last else ((1, i, s + 1),)

    def send_b(i: int) -> tuple:
        return () if first else ((1, i, s),)

    warmup = min(pp - s - 1, m)
    remaining = m - warmup
    prog: list[tuple] = []
    for i in range(warmup):
        prog += [*_blocking((), recv_f(i)), (0, 0, i, s), *_blocking(send_f(i), ())]
    if remaining:
        prog += _blocking((), recv_f(warmup))
    for j in range(remaining):
        prog += [(0, 0, warmup + j, s), *_blocking(send_f(warmup + j), recv_b(j))]
        prog.append((0, 1, j, s))
        nxt = () if j == remaining - 1 else recv_f(warmup + j + 1)
        prog += _blocking(send_b(j), nxt)
    for i in range(remaining, m):
        prog += [*_blocking((), recv_b(i)), (0, 1, i, s), *_blocking(send_b(i), ())]
    return prog


def _gpipe(s: int, pp: int, m: int) -> list[tuple]:
    """GPipe (for comparison; Megatron has no such schedule): all forwards, then
    all backwards in micro-batch order (as torch ``ScheduleGPipe``); receives
    are posted ahead and sends do not block, so a transfer is a pure lag."""
    first, last = s == 0, s == pp - 1
    prog: list[tuple] = []
    sends: list[tuple] = []
    for is_bwd, src, active in ((0, s - 1, not first), (1, s + 1, not last)):
        if active:
            prog.append((1, (), tuple((is_bwd, i, src) for i in range(m))))
        for i in range(m):
            if active:
                prog.append((2, ((is_bwd, i, src),)))
            prog.append((0, is_bwd, i, s))
            if (not last) if is_bwd == 0 else (not first):
                key = (is_bwd, i, s)
                prog.append((1, (key,), ()))
                sends.append(key)
    if sends:
        prog.append((2, tuple(sends)))
    return prog


def _interleaved(s: int, pp: int, vpp: int, m: int) -> list[tuple]:
    """``forward_backward_pipelining_with_interleaving`` on rank ``s`` with
    Megatron-LM's training defaults: ``overlap_p2p_comm`` (receives posted one
    step ahead), ``deallocate_pipeline_outputs`` (each forward send waited at
    once), ``microbatch_group_size_per_vp_stage = pp``.  Warm-up forwards use
    blocking ``send_forward_recv_forward``; cool-down backwards blocking
    ``send_backward_recv_backward``."""
    if m % pp or m < pp:
        raise ValueError(f"interleaved schedule needs pp={pp} to divide m={m} (Megatron)")
    # get_schedule_table(m, vpp, pp): groups of pp micro-batches, chunk-major inside
    table = [(g + i, c) for g in range(0, m, pp) for c in range(vpp) for i in range(pp)]
    total = m * vpp
    first, last = s == 0, s == pp - 1

    def fwd_vs(k: int) -> int:
        return table[k][1] * pp + s

    def bwd_vs(k: int) -> int:
        return (vpp - 1 - table[k][1]) * pp + s

    def recv_prev(k: int) -> tuple:
        # recv_tensor_from_previous_stage(k, forward=True): the input of forward k + 1
        if k == total - 1:
            return ()
        if first:
            if k < pp - 1 or table[k - pp + 1][1] == vpp - 1:
                return ()
            return ((0, table[k - pp + 1][0], table[k - pp + 1][1] * pp + pp - 1),)
        return ((0, table[k + 1][0], table[k + 1][1] * pp + s - 1),)

    def recv_next(k: int) -> tuple:
        # recv_tensor_from_previous_stage(k, forward=False): the grad of backward k + 1
        if last:
            if k < pp - 1 or table[k - pp + 1][1] == vpp - 1:
                return ()
            j = k - pp + 1
            return ((1, table[j][0], (vpp - 1 - table[j][1]) * pp),)
        if k + 1 >= total:
            return ()
        return ((1, table[k + 1][0], bwd_vs(k + 1) + 1),)

    def send_f(k: int) -> tuple:
        return () if (last and table[k][1] == vpp - 1) else ((0, table[k][0], fwd_vs(k)),)

    def send_b(k: int) -> tuple:
        return () if (first and table[k][1] == vpp - 1) else ((1, table[k][0], bwd_vs(k)),)

    warmup = min((pp - s - 1) * 2 + (vpp - 1) * pp, total)
    all_warmup = warmup == total
    remaining = total - warmup
    prog: list[tuple] = [] if first else _blocking((), ((0, 0, s - 1),))
    pending_f: deque[tuple] = deque()
    pending_b: deque[tuple] = deque()
    for k in range(warmup):
        prog.append((0, 0, table[k][0], fwd_vs(k)))
        prog += _blocking(send_f(k), recv_prev(k))
        if k == warmup - 1 and not all_warmup and not last:
            first_grad = ((1, 0, (vpp - 1) * pp + s + 1),)
            prog.append((1, (), first_grad))
            pending_b.append(first_grad)
    old_send_b: tuple = ()
    for k in range(remaining):
        fk = k + warmup
        if not (first and table[fk][1] == 0) and pending_f:
            prog.append((2, pending_f.popleft()))
        prog.append((0, 0, table[fk][0], fwd_vs(fk)))
        recv, send = (() if k == remaining - 1 else recv_prev(fk)), send_f(fk)
        prog += [(1, send, recv), (2, send)] if send else [(1, send, recv)]
        if recv:
            pending_f.append(recv)
        if not (last and table[k][1] == 0) and pending_b:
            prog.append((2, pending_b.popleft()))
        prog.append((0, 1, table[k][0], bwd_vs(k)))
        recv, send = recv_next(k), send_b(k)
        prog.append((1, send, recv))
        if old_send_b:
            prog.append((2, old_send_b))
        old_send_b = send
        if recv:
            pending_b.append(recv)
    if all_warmup and not last:
        prog += _blocking((), ((1, 0, (vpp - 1) * pp + s + 1),))
    for k in range(remaining, total):
        if not (last and table[k][1] == 0) and k != 0 and pending_b:
            prog.append((2, pending_b.popleft()))
        prog.append((0, 1, table[k][0], bwd_vs(k)))
        prog += _blocking(send_b(k), () if k == total - 1 else recv_next(k))
    if old_send_b:
        prog.append((2, old_send_b))
    return prog


@lru_cache(maxsize=32)
def stage_programs(schedule: Schedule, pp: int, vpp: int, m: int) -> tuple[tuple[tuple, ...], ...]:
    """The op sequence of every pipeline rank under ``schedule`` (cached)."""
    if schedule == "interleaved":
        programs = [_interleaved(s, pp, vpp, m) for s in range(pp)]
    elif schedule == "gpipe":
        programs = [_gpipe(s, pp, m) for s in range(pp)]
    else:
        programs = [_one_f_one_b(s, pp, m) for s in range(pp)]
    return tuple(tuple(program) for program in programs)


class TimelineOp(NamedTuple):
    """One op of the timeline, on one pipeline stage."""

    stage: int
    kind: str  # forward backward send recv dp_sync embedding_sync optimizer param_gather
    micro_batch: int  # -1 where not applicable
    chunk: int  # model chunk on this stage; -1 where not applicable
    start_s: float
    end_s: float
    peer: int  # the other stage of a send/recv; -1 otherwise


@dataclass(frozen=True)
class Timeline:
    """What the simulator saw: every op with its start and end, per stage.

    ``ops`` are in no particular order (:meth:`stage_ops` sorts them);
    ``stage_gpus[s]`` lists the GPUs that run stage ``s`` of the simulated
    replica, so an op of stage ``s`` happens on all of them.
    """

    ops: tuple[TimelineOp, ...]
    num_stages: int
    schedule: Schedule
    pipeline_time_s: float
    iteration_time_s: float
    stage_end_s: tuple[float, ...]
    stage_gpus: tuple[tuple[int, ...], ...] = ()

    def stage_ops(self, stage: int, kind: str | None = None) -> list[TimelineOp]:
        """The ops of one stage (optionally of one kind), in start order."""
        ops = [o for o in self.ops if o.stage == stage and (kind is None or o.kind == kind)]
        return sorted(ops, key=lambda o: (o.start_s, o.end_s))

    def busy_s(self, stage: int, kinds: tuple[str, ...] = ("forward", "backward")) -> float:
        """Total duration of the ops of ``kinds`` on ``stage``, s."""
        return sum(o.end_s - o.start_s for o in self.ops if o.stage == stage and o.kind in kinds)


class SimulationResult(NamedTuple):
    """Raw output of :func:`simulate_pipeline`."""

    pipeline_time_s: float
    stage_end_s: np.ndarray
    last_backward_s: np.ndarray
    records: list[tuple]


def simulate_pipeline(inputs: PipelineInputs, *, record: bool = True) -> SimulationResult:
    """Run the schedule of ``inputs`` event by event; return its makespan and ops.

    Each stage executes its program (:func:`stage_programs`) in order.  A stage blocked in a wait is woken when the missing transfer's
    other side posts it.  A deadlock (a program bug) raises ``RuntimeError``.
    """
    pp, vpp = inputs.pp, inputs.vpp
    fwd = np.asarray(inputs.forward_s, dtype=float).tolist()
    bwd = np.asarray(inputs.backward_s, dtype=float).tolist()
    fhop = np.asarray(inputs.fwd_hop_s, dtype=float).tolist()
    bhop = np.asarray(inputs.bwd_hop_s, dtype=float).tolist()
    programs = stage_programs(inputs.schedule, pp, vpp, inputs.num_micro_batches)

    send_post: dict[tuple, float] = {}
    recv_post: dict[tuple, float] = {}
    waiter: dict[tuple, int] = {}
    pc = [0] * pp
    clock = [0.0] * pp
    last_bwd = [0.0] * pp
    records: list[tuple] = []
    ready = deque(range(pp))
    queued = [True] * pp

    # a transfer key is (is_backward, micro_batch, sending virtual stage)
    hop_of = {(0, u): fhop[u % pp] for u in range(pp * vpp)}
    hop_of.update({(1, u): bhop[(u % pp - 1) % pp] for u in range(pp * vpp)})

    def duration(key: tuple) -> float:
        return hop_of[key[0], key[2]]

    while ready:
        s = ready.popleft()
        queued[s] = False
        program, i, t = programs[s], pc[s], clock[s]
        while i < len(program):
            op = program[i]
            code = op[0]
            if code == 0:  # compute: (0, is_backward, micro_batch, virtual_stage)
                d = bwd[op[3]] if op[1] else fwd[op[3]]
                if record:
                    records.append((s, op[1], op[2], op[3] // pp, t, t + d))
                t += d
                if op[1]:
                    last_bwd[s] = d
            elif code == 1:  # post: (1, sends, recvs)
                for table, keys in ((send_post, op[1]), (recv_post, op[2])):
                    for key in keys:
                        table[key] = t
                        other = waiter.pop(key, None)
                        if other is not None and not queued[other]:
                            queued[other] = True
                            ready.append(other)
            else:  # wait: (2, keys)
                end = t
                blocked = False
                for key in op[1]:
                    a, b = send_post.get(key), recv_post.get(key)
                    if a is None or b is None:
                        waiter[key] = s
                        blocked = True
                        break
                    done = (a if a > b else b) + hop_of[key[0], key[2]]
                    if done > end:
                        end = done
                if blocked:
                    break
                t = end
            i += 1
        pc[s], clock[s] = i, t
    unfinished = [s for s in range(pp) if pc[s] < len(programs[s])]
    if unfinished:
        raise RuntimeError(f"pipeline schedule deadlocked on stages {unfinished}")
    if record:
        for key, a in send_post.items():
            start = max(a, recv_post[key])
            sender = key[2] % pp
            receiver = (sender + (-1 if key[0] else 1)) % pp
            end = start + duration(key)
            records.append((sender, 2, key[1], key[2] // pp, start, end, receiver))
            records.append((receiver, 3, key[1], key[2] // pp, start, end, sender))
    ends = np.array(clock)
    return SimulationResult(float(ends.max()), ends, np.array(last_bwd), records)


_KINDS = ("forward", "backward", "send", "recv")


def simulate(inputs: PipelineInputs, stage_gpus: tuple[tuple[int, ...], ...] = ()) -> Timeline:
    """Simulate one iteration: the pipeline schedule, then each stage's DP
    gradient sync, the embedding sync and the optimizer step as in
    :func:`pipette_cp.cost.schedule.critical_path.finish_iteration`.

    Examples
    --------
    >>> import numpy as np
    >>> from pipette_cp.cost.schedule.critical_path import PipelineInputs
    >>> x = PipelineInputs.uniform(pp=4, num_micro_batches=8, forward_s=1.0, backward_s=2.0)
    >>> simulate(x).pipeline_time_s  # (m + p - 1)(f + b)
    33.0
    """
    result = simulate_pipeline(inputs)
    tail = finish_iteration(inputs, result.stage_end_s, result.last_backward_s)
    ops = [
        TimelineOp(r[0], _KINDS[r[1]], r[2], r[3], r[4], r[5], r[6] if len(r) > 6 else -1)
        for r in result.records
    ]
    for s in range(inputs.pp):
        if tail.dp_sync_end_s[s] > tail.dp_sync_start_s[s]:
            ops.append(
                TimelineOp(s, "dp_sync", -1, -1, tail.dp_sync_start_s[s], tail.dp_sync_end_s[s], -1)
            )
        if tail.embedding_s > 0 and s in (0, inputs.pp - 1):
            start = tail.embedding_start_s
            ops.append(TimelineOp(s, "embedding_sync", -1, -1, start, start + tail.embedding_s, -1))
        step_end = tail.optimizer_start_s + float(inputs.optimizer_s[s])
        ops.append(TimelineOp(s, "optimizer", -1, -1, tail.optimizer_start_s, step_end, -1))
        if inputs.param_gather_s[s] > 0:  # distributed optimizer: gather after the step
            start = tail.optimizer_start_s + tail.optimizer_s
            end = start + float(inputs.param_gather_s[s])
            ops.append(TimelineOp(s, "param_gather", -1, -1, start, end, -1))
    return Timeline(
        ops=tuple(ops),
        num_stages=inputs.pp,
        schedule=inputs.schedule,
        pipeline_time_s=result.pipeline_time_s,
        iteration_time_s=tail.total_s,
        stage_end_s=tuple(float(x) for x in result.stage_end_s),
        stage_gpus=stage_gpus,
    )
