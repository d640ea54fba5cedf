"""The precision-aware optimizer knob (Megatron-Core, bf16 Adam moments): what it saves
in memory and time, its rules, label and Megatron flags, and that the default search
space does not grow."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pipette_cp.cli import app
from pipette_cp.cli.knob_flags import parse_space
from pipette_cp.cost.evaluator.evaluate import evaluate, validate_layout
from pipette_cp.cost.memory.state import state_bytes_per_param
from pipette_cp.cost.stack.frameworks import optimizer_update_bytes
from pipette_cp.errors import LayoutError
from pipette_cp.report.megatron.flags import check_flags, megatron_args
from pipette_cp.search.capacity import model_capacity
from pipette_cp.search.space import enumerate_layouts
from pipette_cp.specs import Instance, Plan, SearchSpace
from pipette_cp.specs.layouts import make_plan
from pipette_cp.specs.training import FrameworkProfile
from tests.conftest import small_instance

DP = 8


def _plan(**knobs: object) -> Plan:
    return make_plan(num_layers=8, dp=DP, pp=1, tp=1, micro_batch_size=1, **knobs)


def _with(instance: Instance, **training: object) -> Instance:
    return instance.model_copy(update={"training": instance.training.model_copy(update=training)})


def test_default_is_off_and_costs_as_before() -> None:
    plan = _plan(dp_sharding="optim")
    assert plan.precision_aware_optimizer is False
    assert state_bytes_per_param(small_instance().training, plan) == (2.0, 4.0, 12.0 / DP)


def test_it_halves_the_moments_and_keeps_the_master_weights_as_remainders() -> None:
    training = small_instance().training
    on = _plan(dp_sharding="optim", precision_aware_optimizer=True)
    # 2 B bf16 remainder + 2 x 2 B bf16 moments instead of 4 + 8, sharded over dp
    assert state_bytes_per_param(training, on) == (2.0, 4.0, 6.0 / DP)
    assert optimizer_update_bytes(training, on) == 20.0
    # FP8 with current scaling: the distributed optimizer keeps its fp32 master copy
    fp8 = _with(small_instance(), precision="fp8", fp8_recipe="tensorwise").training
    assert state_bytes_per_param(fp8, on) == (2.0, 4.0, 8.0 / DP)
    assert optimizer_update_bytes(fp8, on) == 22.0


def test_it_lowers_memory_and_the_optimizer_step() -> None:
    instance = small_instance()
    off = evaluate(instance, _plan(dp_sharding="optim"))
    on = evaluate(instance, _plan(dp_sharding="optim", precision_aware_optimizer=True))
    assert on.memory_bytes_max < off.memory_bytes_max
    assert on.breakdown_s.optimizer < off.breakdown_s.optimizer
    assert on.iteration_time_s < off.iteration_time_s
    assert on.breakdown_s.compute == off.breakdown_s.compute


def test_label_and_megatron_flags_checked_against_the_argument_table() -> None:
    instance = small_instance()
    plan = _plan(dp_sharding="optim", precision_aware_optimizer=True)
    assert plan.layout() == "dp8-pp1-tp1-mb1-do-bf16adam"
    args = megatron_args(instance, plan)
    for flag in ("--use-distributed-optimizer", "--use-precision-aware-optimizer",
                 "--exp-avg-dtype bf16", "--exp-avg-sq-dtype bf16"):  # fmt: skip
        assert flag in args
    check_flags(instance, plan)  # Megatron-LM's parser table and rules
    assert not any("precision-aware" in a for a in megatron_args(instance, _plan()))


@pytest.mark.parametrize(
    ("training", "knobs", "message"),
    [
        ({}, {}, "plan.precision_aware_optimizer=True: needs the distributed optimizer "
                 "(dp_sharding optim), dp_sharding is none"),
        ({}, {"dp_sharding": "optim_grads"}, "needs the distributed optimizer (dp_sharding "
                                             "optim), dp_sharding is optim_grads"),
        ({"optimizer": "sgd"}, {"dp_sharding": "optim"}, "needs Adam (Transformer Engine's "
                                                         "FusedAdam), training.optimizer is sgd"),
        ({"precision": "fp16"}, {"dp_sharding": "optim"}, "precision is fp16"),
        ({"framework": FrameworkProfile(name="torchtitan")}, {"dp_sharding": "optim"}, "not torchtitan"),
    ],
)  # fmt: skip
def test_rules(training: dict[str, object], knobs: dict[str, object], message: str) -> None:
    instance = _with(small_instance(), **training)
    with pytest.raises(LayoutError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate_layout(instance, _plan(precision_aware_optimizer=True, **knobs))


def test_the_default_space_does_not_grow_and_the_knob_joins_where_it_runs() -> None:
    instance = small_instance()
    plain = list(enumerate_layouts(instance))
    assert not any(p.precision_aware_optimizer for p in plain)
    space = SearchSpace(precision_aware_optimizer=(False, True))
    both = list(enumerate_layouts(instance, space))
    on = [p for p in both if p.precision_aware_optimizer]
    assert [p for p in both if not p.precision_aware_optimizer] == plain
    assert len(on) == sum(p.sharding == "optim" for p in plain) > 0
    assert all(p.sharding == "optim" for p in on)


def test_options_and_the_memory_bound() -> None:
    assert parse_space({"bf16_adam": "false,true"})["precision_aware_optimizer"] == (
        "false",
        "true",
    )
    instance = small_instance()
    space = SearchSpace(precision_aware_optimizer=(False, True))
    assert SearchSpace.model_validate({"precision_aware_optimizer": ("false", "true")}) == space
    bound = model_capacity(instance, space).sharded_bytes
    assert bound < model_capacity(instance).sharded_bytes


def test_predict_takes_it_and_refuses_it_without_the_distributed_optimizer() -> None:
    runner = CliRunner()
    args = ["predict", "gpt3-1.3b-nominal-8", "--dist-opt", "--json"]
    off = json.loads(runner.invoke(app, args).output)
    on = json.loads(runner.invoke(app, [*args, "--bf16-adam"]).output)
    assert on["memory_gb_per_gpu_max"] < off["memory_gb_per_gpu_max"]
    assert on["layout"] == off["layout"] + "-bf16adam"
    refused = runner.invoke(app, ["predict", "gpt3-1.3b-nominal-8", "--no-dist-opt", "--bf16-adam"])
    assert refused.exit_code == 2 and "needs the distributed optimizer" in refused.output
