"""What a pipeline schedule model needs, and what follows the pipeline in an iteration.

:class:`PipelineInputs` carries per-stage times and hops to the analytic models
of :mod:`pipette_cp.cost.schedule.critical_path` and to the simulator; :func:`finish_iteration`
adds the gradient syncs and the optimizer step that both append to the
pipeline's end times (both re-exported by :mod:`pipette_cp.cost.schedule.critical_path`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
    def unchecked(cls, **fields: object) -> PipelineInputs:
        """Every field given as is, without ``__post_init__``'s copies and checks: for
        callers that pass read-only float arrays of the right shapes (the evaluator)."""
        inputs = object.__new__(cls)
        inputs.__dict__.update(fields)
        return inputs

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
