"""The compute-class ladder: a stage runs at its slowest unit's GPU type (and TP link)."""

from __future__ import annotations

import numpy as np
import pytest

from pipette_cp.solvers.placement.families.compute_classes import ComputeClasses
from pipette_cp.specs import resolve_gpu
from pipette_cp.specs.layouts import make_plan
from tests.conftest import small_instance
from tests.solvers.placement.families.harness import verify


def _instance():
    """Three one-GPU nodes: a V100 on node 0, A100s on nodes 1 and 2."""
    base = small_instance(nodes=3, gpus_per_node=1)
    v100, cluster = resolve_gpu("v100"), base.cluster
    names = (v100.name, *cluster.node_gpu_types[1:])
    cluster = cluster.model_copy(update={"gpu_types": {**cluster.gpu_types, v100.name: v100},
                                         "node_gpu_types": names})  # fmt: skip
    return base.model_copy(update={"cluster": cluster})


INSTANCE = _instance()
PLAN = make_plan(num_layers=8, dp=1, pp=2, tp=1, micro_batch_size=1)


@pytest.mark.parametrize(("assign", "slow"), [([1, 2], [0, 0]), ([0, 1], [1, 0]),
                                              ([2, 0], [0, 1])])  # fmt: skip
def test_a_stage_on_the_slow_gpu_reads_the_slow_class(assign, slow) -> None:
    verifier = verify(INSTANCE, PLAN, ComputeClasses())
    data = verifier.data
    assert data.class_forward.shape[0] == 2 and data.place_class.tolist() == [0, 1, 1]
    pinned = verifier.given(assign)
    assert pinned.reads().tolist() == slow
    pinned.costs(float(sum(slow)))
    forward = data.pipeline_inputs(pinned.reads()).forward_s
    classes = np.array(slow)  # class 0 (slowest) where the stage reaches down to it
    expected = data.class_forward[1 - classes, np.arange(2)]
    np.testing.assert_allclose(forward, expected, rtol=1e-12)
