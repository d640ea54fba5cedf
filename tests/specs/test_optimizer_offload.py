"""Optimizer CPU offload (Megatron-Core --optimizer-cpu-offload --optimizer-offload-fraction):
the offloaded share of the optimizer state leaves the GPU, the step pays the host
transfers and the CPU Adam update; its rules, label and flags; the default space does
not grow."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pipette_cp.cli import app
from pipette_cp.cli.knob_flags import parse_space
from pipette_cp.cost.compute.optimizer_step import optimizer_step_time_s
from pipette_cp.cost.evaluator.evaluate import Evaluator, evaluate, validate_layout
from pipette_cp.cost.memory.peak import memory_by_stage
from pipette_cp.cost.memory.state import state_bytes_per_param
from pipette_cp.cost.stack.frameworks import host_optimizer_time_s
from pipette_cp.cost.workload.parameters import stage_params_per_gpu
from pipette_cp.errors import LayoutError
from pipette_cp.report.megatron.flags import check_flags, megatron_args
from pipette_cp.search.capacity import model_capacity
from pipette_cp.search.space import enumerate_layouts
from pipette_cp.specs import Instance, Plan, SearchSpace
from pipette_cp.specs.layouts import make_plan
from pipette_cp.specs.training import FrameworkProfile
from tests.conftest import small_instance
from tests.placement_checks import assert_master_prices_as_evaluator

DP = 8


def _plan(**knobs: object) -> Plan:
    return make_plan(num_layers=8, dp=DP, pp=1, tp=1, micro_batch_size=1, **knobs)


def _with(instance: Instance, **training: object) -> Instance:
    return instance.model_copy(update={"training": instance.training.model_copy(update=training)})


@pytest.mark.parametrize(("fraction", "left"), [(0.0, 12.0), (0.5, 6.0), (1.0, 0.0)])
def test_the_offloaded_share_of_the_optimizer_state_leaves_the_gpu(
    fraction: float, left: float
) -> None:
    # Megatron-Core's HybridDeviceOptimizer: the first f of the shard on the host, the
    # rest with an fp32 copy and torch's Adam moments on the GPU (12 B per parameter)
    training = small_instance().training
    plan = _plan(dp_sharding="optim", optimizer_offload_fraction=fraction)
    assert state_bytes_per_param(training, plan) == (2.0, 4.0, left / DP)


def test_the_host_part_of_the_step() -> None:
    # PCIe 4.0 x16 at 80 %: 25.2 GB/s for 8 B per parameter; host Adam 28 B at 20 GB/s
    assert host_optimizer_time_s(1e9) == pytest.approx(8 / 25.2 + 28 / 20.0, rel=1e-12)
    instance = small_instance()
    model, training = instance.model, instance.training
    gpu = instance.cluster.gpu_of_node(0)
    off = optimizer_step_time_s(model, training, gpu, _plan(dp_sharding="optim"), 0)
    on = _plan(dp_sharding="optim", optimizer_offload_fraction=1.0)
    shard = stage_params_per_gpu(model, on, 0) / DP
    assert optimizer_step_time_s(model, training, gpu, on, 0) > host_optimizer_time_s(shard) > off


def test_it_trades_memory_for_step_time_in_the_evaluator_and_the_master() -> None:
    instance = small_instance()
    model, training = instance.model, instance.training
    off, on = _plan(dp_sharding="optim"), _plan(dp_sharding="optim", optimizer_offload_fraction=1.0)
    (before,), (after,) = (
        memory_by_stage(model, training, off),
        memory_by_stage(model, training, on),
    )
    assert after.optimizer_state == 0.0 < before.optimizer_state
    assert before.total_bytes - after.total_bytes == pytest.approx(before.optimizer_state)
    slow, fast = evaluate(instance, on), evaluate(instance, off)
    assert slow.breakdown_s.optimizer > fast.breakdown_s.optimizer
    assert slow.memory_bytes_max < fast.memory_bytes_max
    plan = make_plan(num_layers=8, dp=4, pp=2, tp=1, micro_batch_size=1, dp_sharding="optim",
                     optimizer_offload_fraction=0.5)  # fmt: skip
    evaluator = Evaluator(instance, dp_algorithm="ring", validate=False)
    assert_master_prices_as_evaluator(instance, plan, evaluator, seed=3, draws=4)


def test_label_and_megatron_flags_checked_against_the_argument_table() -> None:
    instance = small_instance()
    plan = _plan(dp_sharding="optim", optimizer_offload_fraction=0.5)
    assert plan.layout() == "dp8-pp1-tp1-mb1-do-offload0.5"
    args = megatron_args(instance, plan)
    for flag in ("--optimizer-cpu-offload", "--optimizer-offload-fraction 0.5",
                 "--use-precision-aware-optimizer"):  # fmt: skip
        assert flag in args
    assert "--exp-avg-dtype bf16" not in args  # the host optimizer keeps fp32 moments
    check_flags(instance, plan)
    assert not any("offload" in a for a in megatron_args(instance, _plan(dp_sharding="optim")))


@pytest.mark.parametrize(
    ("training", "knobs", "message"),
    [
        ({}, {}, "plan.optimizer_offload_fraction=0.5: needs the distributed optimizer "
                 "(dp_sharding optim), dp_sharding is none"),
        ({"optimizer": "sgd"}, {"dp_sharding": "optim"}, "needs Adam (Megatron's offload runs "
                                                         "the precision-aware optimizer), "
                                                         "training.optimizer is sgd"),
        ({}, {"dp_sharding": "optim", "precision_aware_optimizer": True},
         "keeps fp32 Adam state (torch's Adam on host and device): turn "
         "precision_aware_optimizer (bf16 moments) off"),
        ({"framework": FrameworkProfile(name="torchtitan")}, {"dp_sharding": "optim"},
         "not torchtitan"),
    ],
)  # fmt: skip
def test_rules(training: dict[str, object], knobs: dict[str, object], message: str) -> None:
    instance = _with(small_instance(), **training)
    with pytest.raises(LayoutError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate_layout(instance, _plan(optimizer_offload_fraction=0.5, **knobs))


def test_fp8_weights_offload_only_with_delayed_scaling() -> None:
    h100 = small_instance(gpu="h100")
    plan = _plan(dp_sharding="optim", fp8_param_gather=True, optimizer_offload_fraction=1.0)
    validate_layout(_with(h100, precision="fp8"), plan)  # delayed scaling, the default
    with pytest.raises(
        LayoutError, match=r"delayed FP8 recipe \(Megatron\), fp8_recipe is tensorwise"
    ):
        validate_layout(_with(h100, precision="fp8", fp8_recipe="tensorwise"), plan)


def test_the_default_space_does_not_grow_and_the_knob_joins_where_it_runs() -> None:
    instance = small_instance()
    plain = list(enumerate_layouts(instance))
    assert not any(p.optimizer_offload_fraction for p in plain)
    space = SearchSpace(optimizer_offload_fraction=(0.0, 0.5, 1.0))
    three = list(enumerate_layouts(instance, space))
    assert [p for p in three if not p.optimizer_offload_fraction] == plain
    assert len(three) == len(plain) + 2 * sum(p.sharding == "optim" for p in plain)
    assert model_capacity(instance, space).sharded_bytes < model_capacity(instance).sharded_bytes


def test_options() -> None:
    texts = parse_space({"optimizer_offload_fraction": "0,0.5,1"})
    space = SearchSpace.model_validate(
        {"optimizer_offload_fraction": texts["optimizer_offload_fraction"]}
    )
    assert space.optimizer_offload_fraction == (0.0, 0.5, 1.0)
    runner = CliRunner()
    args = ["predict", "gpt3-1.3b-nominal-8", "--dist-opt", "--json"]
    off = json.loads(runner.invoke(app, args).output)
    on = json.loads(runner.invoke(app, [*args, "--optimizer-offload-fraction", "1"]).output)
    assert on["memory_gb_per_gpu_max"] < off["memory_gb_per_gpu_max"]
    assert on["optimizer_offload_fraction"] == 1.0 and on["layout"] == off["layout"] + "-offload1"
    refused = runner.invoke(
        app, ["predict", "gpt3-1.3b-nominal-8", "--optimizer-offload-fraction", "2"]
    )
    assert refused.exit_code == 2
