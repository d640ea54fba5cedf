"""Data-parallel sharding levels (none, optim = ZeRO-1, optim_grads = ZeRO-2,
optim_grads_params = ZeRO-3 / FSDP): memory, communication, search space, export."""

from __future__ import annotations

import numpy as np
import pytest

from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.cost.memory.peak import memory_by_stage, stage_params_per_gpu, state_bytes_per_param
from pipette_cp.cost.network import collectives as comm
from pipette_cp.errors import LayoutError
from pipette_cp.report.megatron.flags import megatron_args
from pipette_cp.search.space import enumerate_layouts
from pipette_cp.specs import Plan, SearchSpace
from pipette_cp.specs.layouts import make_plan
from tests.conftest import small_instance

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
        return Evaluator(inst).evaluate(_plan("optim_grads_params")).breakdown_s.dp_comm

    fast, slow = dp_comm(200e9), dp_comm(0.5e9)
    assert slow > 10 * max(fast, 1e-6)


def test_breakdown_still_sums_to_the_iteration_time():
    inst = small_instance(nodes=2, gpus_per_node=4, node_bandwidth=np.full((2, 2), 1e9))
    for level in LEVELS:
        ev = Evaluator(inst).evaluate(_plan(level))
        assert sum(s for _, s in ev.breakdown_s.items()) == pytest.approx(ev.iteration_time_s)


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


# ------------------------------------------------------------------- hybrid (HSDP)
def _hsdp(level: str, group: int | None, dp: int = 8) -> Plan:
    return make_plan(num_layers=8, dp=dp, pp=1, tp=1, micro_batch_size=1, dp_sharding=level,
                     dp_shard_size=group)  # fmt: skip


def test_hybrid_sharding_divides_the_state_by_the_shard_group():
    training = small_instance().training
    assert state_bytes_per_param(training, _hsdp("optim_grads_params", 4)) == (0.5, 1.0, 3.0)
    assert state_bytes_per_param(training, _hsdp("optim", 2)) == (2, 4, 6.0)


@pytest.mark.parametrize("level", LEVELS[1:])
def test_hybrid_memory_lies_between_full_sharding_and_none(level):
    inst = small_instance(nodes=2, gpus_per_node=4)

    def state(plan: Plan) -> float:
        s = memory_by_stage(inst.model, inst.training, plan)[0]
        return s.weights + s.gradients + s.optimizer_state

    full, none = state(_hsdp(level, None)), state(_hsdp("none", None))
    groups = [state(_hsdp(level, g)) for g in (2, 4)]
    assert full < groups[1] < groups[0] < none


def test_hybrid_step_sync_is_the_shard_reduce_scatter_plus_the_replica_all_reduce():
    """ZeRO-1 HSDP on 2 nodes x 4 GPUs, shard groups = the nodes: the gradient sync is a
    reduce-scatter inside each node (150 GB/s) then an all-reduce of each quarter across
    the two nodes (NIC-limited): the ring formula of each, summed."""
    inst = small_instance(nodes=2, gpus_per_node=4)
    ev = Evaluator(inst, dp_algorithm="ring")
    plan = _hsdp("optim", 4)
    inputs, _ = ev.pipeline_inputs(plan)
    params = stage_params_per_gpu(inst.model, plan, 0)
    grad, fabric = 4.0, ev.fabric

    inside = comm.ring_time_s(fabric, np.arange(4), params * grad, "reduce_scatter")
    across = max(
        comm.collective_times_s(fabric, np.array([[i, i + 4] for i in range(4)]),
                                params * grad / 4, "all_reduce", "ring")
    )  # fmt: skip
    assert inputs.dp_sync_s[0] == pytest.approx(inside + across, rel=1e-9)
    assert inputs.param_gather_s[0] == pytest.approx(
        comm.ring_time_s(fabric, np.arange(4), params * 2.0, "all_gather"), rel=1e-9
    )


def test_hybrid_sharding_pays_where_the_nodes_are_far_apart():
    """A slow inter-node fabric: ZeRO-3 gathers every layer across it, its HSDP variant
    only inside the node; the hybrid plan is faster (and uses more memory)."""
    slow = np.full((2, 2), 0.5e9)
    inst = small_instance(nodes=2, gpus_per_node=4, node_bandwidth=slow)
    ev = Evaluator(inst)
    full, hybrid = _hsdp("optim_grads_params", None), _hsdp("optim_grads_params", 4)
    assert ev.iteration_time(hybrid) < ev.iteration_time(full)
    assert hybrid.layout().endswith("zero3-hsdp4")


def test_hybrid_sharding_is_checked_and_exported():
    inst = small_instance(nodes=2, gpus_per_node=4)
    with pytest.raises(LayoutError, match="dp_shard_size=3: must divide dp=8"):
        Evaluator(inst).iteration_time(_hsdp("optim", 3))
    with pytest.raises(LayoutError, match="needs a sharding level"):
        Evaluator(inst).iteration_time(_hsdp("none", 4))
    args = megatron_args(inst, _hsdp("optim_grads_params", 4))
    assert "--num-distributed-optimizer-instances 2" in args
    assert "--outer-dp-sharding-strategy no_shard" in args
    assert "--num-distributed-optimizer-instances" not in " ".join(
        megatron_args(inst, _hsdp("optim", None))
    )


def test_search_space_tries_hybrid_groups_where_they_divide_dp():
    inst = small_instance(nodes=2, gpus_per_node=4)
    space = SearchSpace(tp=(1,), pp=(1,), micro_batch_size=(1,), vpp=(1,), recompute=("none",),
                        sequence_parallel=(False,), flash_attention=(True,),
                        dp_sharding=("none", "optim"), dp_shard_size=(3, 4), use_all_gpus=True)  # fmt: skip
    labels = {p.layout() for p in enumerate_layouts(inst, space)}
    assert labels == {"dp8-pp1-tp1-mb1", "dp8-pp1-tp1-mb1-do", "dp8-pp1-tp1-mb1-do-hsdp4"}


def test_a_hybrid_plan_is_placed_without_an_optimality_claim():
    from pipette_cp.solvers.methods import exact_placement
    from pipette_cp.solvers.options import SolveOptions

    inst = small_instance(nodes=2, gpus_per_node=4)
    placed = exact_placement(inst, _hsdp("optim_grads_params", 4), SolveOptions(time_limit_s=2))
    assert placed.solve_info is not None and placed.solve_info.status == "feasible"
    assert placed.solve_info.bound is None
    assert placed.solve_info.objective == pytest.approx(Evaluator(inst).iteration_time(placed))
