"""The evaluator's data-parallel collectives: each stage's gradient sync and parameter
gather over its DP rings, and under ZeRO-2/3 the per-layer collectives the compute does
not hide (:class:`DpCollectives`, a part the
:class:`~pipette_cp.cost.evaluator.evaluate.Evaluator` holds)."""

from __future__ import annotations

from functools import partial

import numpy as np

from pipette_cp.cost.compute.model_chunks import layer_times
from pipette_cp.cost.evaluator.caches import KnobMemo
from pipette_cp.cost.evaluator.layout_rules import knobs_key, num_micro_batches
from pipette_cp.cost.evaluator.stage_times import StageTimes
from pipette_cp.cost.network import collectives as comm
from pipette_cp.cost.network.data_parallel import (
    Ops,
    exposed_per_layer,
    hybrid_times_s,
    per_layer_collectives,
)
from pipette_cp.errors import InfeasibleError
from pipette_cp.specs.gpu import GpuSpec
from pipette_cp.specs.instance import Instance
from pipette_cp.specs.plan import Plan

#: A stage's DP rings: GPU ids in ring order, and each hop's bandwidth and latency,
#: (pp * tp, dp) each
Rings = tuple[np.ndarray, np.ndarray, np.ndarray]


class DpCollectives:
    """The data-parallel rings' collectives of the plans of one instance on ``fabric``
    (``algorithm``: see :class:`~pipette_cp.cost.evaluator.evaluate.Evaluator`), with the
    evaluator's ``memo`` of placement-free costs."""

    def __init__(
        self, instance: Instance, fabric: comm.Fabric, algorithm: comm.Algorithm, memo: KnobMemo
    ) -> None:
        self.instance, self.fabric, self.algorithm, self.memo = instance, fabric, algorithm, memo

    def times(
        self, plan: Plan, rings: np.ndarray, bw: np.ndarray, lat: np.ndarray, ops: Ops
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each stage's DP gradient sync and distributed-optimizer parameter gather
        (:func:`~pipette_cp.cost.network.data_parallel.step_collectives`), s; all stages'
        rings (:data:`Rings`) run at once."""
        pp, tp, algorithm = plan.pp, plan.tp, self.algorithm
        flat_ok = bool(bw.all())
        two_level = algorithm != "ring" and comm.local_group_size(self.fabric, rings) > 1
        what = "a data-parallel gradient sync"
        out = [np.zeros(pp), np.zeros(pp)]
        for op, size, group, phase in ops:
            if not size.any():
                continue  # an operation this plan does not run
            if group != "all":  # HSDP: every shard group (or replica set) at once
                out[phase] += hybrid_times_s(self.fabric, plan, rings, size, op, group, algorithm)
                continue
            if not flat_ok:  # the ring needs a failed link: another algorithm, or an error
                t = comm.collective_times_s(self.fabric, rings, size, op, algorithm, what)
            else:
                t = comm.ring_time_from_links(bw, lat, size, op)
                if two_level:
                    try:  # "hierarchical" keeps the ring only where local groups differ
                        hier = comm.hierarchical_times_s(self.fabric, rings, size, op, what)
                        best = algorithm == "best"
                        t = np.minimum(t, hier) if best else np.where(hier < np.inf, hier, t)
                    except InfeasibleError:
                        pass  # the two-level links include a failed pair; the ring is fine
            out[phase] += t.reshape(pp, tp).max(axis=1)
        return out[0], out[1]

    def sharded_exposure(
        self, plan: Plan, stages: StageTimes, stage_gpu: list[GpuSpec], stage_bw: np.ndarray,
        rings: Rings, cp_bw: np.ndarray,
    ) -> StageTimes:  # fmt: skip
        """ZeRO-2/3: the per-micro-batch collectives the compute does not hide, added to
        each chunk's forward/backward (:mod:`pipette_cp.cost.network.data_parallel`; pp = 1)."""
        model, training = self.instance.model, self.instance.training
        ops = per_layer_collectives(model, training, plan)
        rs, ag = self.times(plan, rings[0], rings[1], rings[2], ops)
        args = (model, training, stage_gpu[0], plan, float(stage_bw[0]))
        key = ("layer", knobs_key(plan), stage_gpu[0].name, args[-1], float(cp_bw[0]))
        make = partial(layer_times, *args, cp_bandwidth_bytes_per_s=float(cp_bw[0]))
        times = self.memo.get(key, make)
        fwd, bwd = exposed_per_layer(plan, times, float(rs[0]), float(ag[0]))
        n = np.asarray(plan.layer_split, dtype=float)
        exposed = num_micro_batches(self.instance, plan) * (fwd + bwd) * float(n.sum())
        return stages._replace(
            forward_s=stages.forward_s + fwd * n,
            backward_s=stages.backward_s + bwd * n,
            busy_s=stages.busy_s + exposed,
            busy_dp_s=exposed,
            layer_collectives_s=(float(rs[0]), float(ag[0])),
        )
