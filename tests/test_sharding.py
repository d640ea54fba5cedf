"""Data-parallel sharding levels (none, optim = ZeRO-1, optim_grads = ZeRO-2,
optim_grads_params = ZeRO-3 / FSDP): memory, communication, search space, export."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import small_instance

from pipette_cp.cost.evaluate import Evaluator
from pipette_cp.cost.memory import memory_by_stage, state_bytes_per_param
from pipette_cp.errors import LayoutError
from pipette_cp.report.megatron import megatron_args
from pipette_cp.search.space import enumerate_layouts
from pipette_cp.specs import Plan, SearchSpace
from pipette_cp.specs.layouts import make_plan

LEVELS = ("none", "optim", "optim_grads", "optim_grads_params")


def _plan(level: str, dp: int = 8, pp: int = 1, tp: int = 1) -> Plan:
    return make_plan(num_layers=8, dp=dp, pp=pp, tp=tp, micro_batch_size=1, dp_sharding=level)


def test_state_bytes_follow_zero():
    """Rajbhandari et al. 2020: ZeRO-1 shards the 12 B of Adam state, ZeRO-2 the 4 B of
    gradients too, ZeRO-3 the 2 B of weights too (Megatron mixed precision)."""
    training = small_instance().training
    got = [state_bytes_per_param(training, _plan(level)) for level in LEVELS]
    assert got == [(2, 4, 12), (2, 4, 1.5), (2, 0.5, 1.5), (0.25, 0.5, 1.5)]


def test_more_sharding_never_keeps_more_state():
    inst = small_instance(nodes=2, gpus_per_node=4)
    states = []
    for level in LEVELS:
        stage = memory_by_stage(inst.model, inst.training, _plan(level))[0]
        states.append(stage.weights + stage.gradients + stage.optimizer_state)
    assert states == sorted(states, reverse=True) and len(set(states)) == 4


def test_sharding_the_gradients_needs_pp_1():
    inst = small_instance(nodes=2, gpus_per_node=4)
    with pytest.raises(LayoutError, match=r"plan\.dp_sharding=.optim_grads.*needs pp=1"):
        Evaluator(inst).evaluate(_plan("optim_grads", dp=4, pp=2))


def test_zero3_collectives_show_on_a_slow_ring():
    """Per micro-batch ZeRO-3 gathers every layer twice and reduce-scatters its
    gradient: hidden under compute on fast links, exposed (dp_comm) on slow ones."""

    def dp_comm(bandwidth: float) -> float:
        inst = small_instance(nodes=2, gpus_per_node=4,
                              node_bandwidth=np.full((2, 2), bandwidth))  # fmt: skip
        return Evaluator(inst).evaluate(_plan("optim_grads_params")).breakdown_s["dp_comm"]

    fast, slow = dp_comm(200e9), dp_comm(0.5e9)
    assert slow > 10 * max(fast, 1e-6)


def test_breakdown_still_sums_to_the_iteration_time():
    inst = small_instance(nodes=2, gpus_per_node=4, node_bandwidth=np.full((2, 2), 1e9))
    for level in LEVELS:
        ev = Evaluator(inst).evaluate(_plan(level))
        assert sum(ev.breakdown_s.values()) == pytest.approx(ev.iteration_time_s)


def test_search_space_tries_the_levels_where_they_apply():
    inst = small_instance(nodes=2, gpus_per_node=4)
    space = SearchSpace(dp_sharding=("optim_grads_params", "optim"), recompute=("none",),
                        micro_batch_size=(1,), vpp=(1,))  # fmt: skip
    seen = {(p.dp, p.pp, p.sharding) for p in enumerate_layouts(inst, space)}
    assert (8, 1, "optim_grads_params") in seen and (8, 1, "optim") in seen
    assert all(level != "optim_grads_params" for dp, pp, level in seen if pp > 1)
    assert all(level == "none" for dp, pp, level in seen if dp == 1)
    default = {p.sharding for p in enumerate_layouts(inst, SearchSpace())}
    assert default == {"none", "optim"}  # unchanged unless asked for


def test_plan_json_round_trip_and_old_plans():
    plan = _plan("optim_grads")
    again = Plan.model_validate_json(plan.model_dump_json())
    assert (again.sharding, again.distributed_optimizer, again.layout()) == (
        "optim_grads",
        True,
        "dp8-pp1-tp1-mb1-zero2",
    )
    old = make_plan(num_layers=8, dp=8, pp=1, tp=1, micro_batch_size=1, distributed_optimizer=True)
    assert (old.dp_sharding, old.sharding) == (None, "optim")


def test_megatron_fsdp_flags():
    inst = small_instance(nodes=2, gpus_per_node=4)
    args = megatron_args(inst, _plan("optim_grads_params"))
    assert "--use-distributed-optimizer" in args and "--use-megatron-fsdp" in args
    assert "--data-parallel-sharding-strategy optim_grads_params" in args
    assert "--use-megatron-fsdp" not in megatron_args(inst, _plan("optim"))
