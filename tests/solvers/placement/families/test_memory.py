"""``memory_limit``: a unit only on GPUs whose usable memory holds its stage (a place
its stage does not fit is outside the unit's domain)."""

from __future__ import annotations

import numpy as np

from pipette_cp.checker import CHECKS
from pipette_cp.cost.memory.peak import memory_by_stage
from pipette_cp.solvers.placement.families.hard.memory import MemoryLimit
from pipette_cp.specs.layouts import make_plan
from tests.conftest import small_instance
from tests.solvers.placement.families.harness import verify

PLAN = make_plan(num_layers=8, dp=1, pp=2, tp=1, micro_batch_size=1)


def _instance():
    """Two one-GPU nodes; node 0's GPU holds the smaller stage but not the larger one.
    Returns the instance and the larger stage."""
    base = small_instance(nodes=2, gpus_per_node=1)
    training = base.training.model_copy(update={"memory_headroom_bytes": 0.0})
    need = [m.bound_bytes for m in memory_by_stage(base.model, training, PLAN)]
    cluster = base.cluster
    a100 = cluster.gpu_types[cluster.node_gpu_types[1]]
    tiny = a100.model_copy(update={"name": "tiny", "memory_bytes": sum(need) / 2})
    cluster = cluster.model_copy(update={"gpu_types": {**cluster.gpu_types, "tiny": tiny},
                                         "node_gpu_types": ("tiny", a100.name)})  # fmt: skip
    instance = base.model_copy(update={"cluster": cluster, "training": training})
    return instance, int(np.argmax(need))


INSTANCE, LARGE = _instance()
#: the larger stage on node 0 (the small GPU), the other on node 1; and the reverse
TOO_BIG = [0, 1] if LARGE == 0 else [1, 0]
FITS = TOO_BIG[::-1]


def test_the_stage_that_fits_may_take_the_small_gpu() -> None:
    verifier = verify(INSTANCE, PLAN, MemoryLimit())
    assert not verifier.data.allowed[LARGE, 0] and verifier.data.allowed[1 - LARGE].all()
    verifier.given(FITS).is_feasible()
    assert not CHECKS[MemoryLimit.check](INSTANCE, _placed(FITS))


def test_the_stage_that_does_not_fit_may_not() -> None:
    verify(INSTANCE, PLAN, MemoryLimit()).given(TOO_BIG).is_infeasible()
    assert CHECKS[MemoryLimit.check](INSTANCE, _placed(TOO_BIG))


def _placed(assign: list[int]):
    return PLAN.model_copy(update={"placement": tuple((p,) for p in assign)})
