"""The per-stage times the evaluator builds a plan's schedule from, and to which its
data-parallel and expert-group parts add what the compute does not hide."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class StageTimes(NamedTuple):
    """Forward, backward and TP communication time per virtual stage (one micro-batch),
    and the busiest stage's compute and communication over the iteration, s."""

    forward_s: np.ndarray
    backward_s: np.ndarray
    tp_comm_s: np.ndarray
    #: the busiest stage's forward and backward work, its collectives included
    busy_s: float
    busy_tp_s: float
    #: ZeRO-2/3: the busiest stage's per-layer collectives the compute does not hide
    busy_dp_s: float = 0.0
    busy_cp_s: float = 0.0
    busy_ep_s: float = 0.0
    #: ZeRO-2/3: one layer's gradient reduce-scatter and weight all-gather, s
    layer_collectives_s: tuple[float, float] = (0.0, 0.0)
