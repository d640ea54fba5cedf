"""The bf16 main-gradient knob (Megatron --grad-reduce-in-bf16): the gradient buffer,
the data-parallel collectives' bytes and the optimizer step's reads halve together,
in the evaluator and in the placement masters; its rules, label and flags; the default
space does not grow."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from pipette_cp.cli import app
from pipette_cp.cli.knob_flags import parse_space
from pipette_cp.cost.evaluator.evaluate import Evaluator, evaluate, validate_layout
from pipette_cp.cost.memory.peak import memory_by_stage
from pipette_cp.cost.memory.state import state_bytes_per_param
from pipette_cp.cost.network.data_parallel import gradient_wire_bytes
from pipette_cp.cost.stack.frameworks import (
    GradientBytes,
    gradient_bytes,
    optimizer_update_bytes,
)
from pipette_cp.errors import LayoutError
from pipette_cp.report.megatron.flags import check_flags, megatron_args
from pipette_cp.search.space import enumerate_layouts
from pipette_cp.solvers.placement.build import build_placement_data
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


def test_default_is_off_and_prices_fp32_main_gradients() -> None:
    training = small_instance().training
    plan = _plan(dp_sharding="optim")
    assert plan.grad_reduce_in_bf16 is False
    assert gradient_bytes(training, plan) == gradient_bytes(training) == GradientBytes(4, 4, 4)
    assert state_bytes_per_param(training, plan) == (2.0, 4.0, 12.0 / DP)
    assert optimizer_update_bytes(training, plan) == 30.0


def test_bf16_main_gradients_halve_the_buffer_the_wire_and_the_step_reads() -> None:
    training = small_instance().training
    on = _plan(dp_sharding="optim", grad_reduce_in_bf16=True)
    # Megatron: --grad-reduce-in-bf16 sets accumulate_allreduce_grads_in_fp32 off, so the
    # DDP grad buffer takes the bf16 parameters' dtype: 2 B instead of 4 B per parameter
    assert gradient_bytes(training, on) == GradientBytes(2, 2, 2)
    assert state_bytes_per_param(training, on) == (2.0, 2.0, 12.0 / DP)
    assert gradient_wire_bytes(training, on) == 2.0
    assert optimizer_update_bytes(training, on) == 28.0  # the fp32 gradient read: 4 -> 2 B


def test_it_lowers_memory_and_the_gradient_sync() -> None:
    instance = small_instance()
    model, training = instance.model, instance.training
    off = evaluate(instance, _plan())
    on = evaluate(instance, _plan(grad_reduce_in_bf16=True))
    (off_stage,) = memory_by_stage(model, training, _plan())
    (on_stage,) = memory_by_stage(model, training, _plan(grad_reduce_in_bf16=True))
    assert on_stage.gradients == off_stage.gradients / 2
    assert off.memory_bytes_max - on.memory_bytes_max == pytest.approx(on_stage.gradients)
    assert on.breakdown_s.dp_comm < off.breakdown_s.dp_comm
    assert on.breakdown_s.optimizer < off.breakdown_s.optimizer
    assert on.breakdown_s.compute == off.breakdown_s.compute


@pytest.mark.parametrize("knobs", [{}, {"dp_sharding": "optim"}])
def test_the_placement_master_reads_the_same_ring_bytes(knobs: dict[str, object]) -> None:
    instance = small_instance()
    plan = make_plan(num_layers=8, dp=4, pp=2, tp=1, micro_batch_size=1, **knobs)
    half = plan.model_copy(update={"grad_reduce_in_bf16": True})
    rings = [build_placement_data(instance, p).ring_bytes for p in (plan, half)]
    np.testing.assert_allclose(rings[1], rings[0] / 2, rtol=1e-15)
    evaluator = Evaluator(instance, dp_algorithm="ring", validate=False)
    assert_master_prices_as_evaluator(instance, half, evaluator, seed=1, draws=4)


def test_the_expert_rings_and_their_master_read_it_too() -> None:
    from tests.solvers.placement.test_group_masters import setup

    inst, plan = setup((4, 1, 1, 1, 2, None), 2)
    half = plan.model_copy(update={"grad_reduce_in_bf16": True})
    ring = Evaluator(inst, dp_algorithm="ring", validate=False)
    for placed in (plan, half):
        assert_master_prices_as_evaluator(inst, placed, ring, seed=0, draws=3)


def test_label_and_megatron_flags_checked_against_the_argument_table() -> None:
    instance = small_instance()
    plan = _plan(dp_sharding="optim", grad_reduce_in_bf16=True)
    assert plan.layout() == "dp8-pp1-tp1-mb1-do-bf16grad"
    assert "--grad-reduce-in-bf16" in megatron_args(instance, plan)
    check_flags(instance, plan)  # Megatron-LM's parser table and rules
    assert "--grad-reduce-in-bf16" not in megatron_args(instance, _plan())


@pytest.mark.parametrize(
    ("training", "message"),
    [
        ({"precision": "fp16"}, "plan.grad_reduce_in_bf16=True: --grad-reduce-in-bf16 needs bf16 "
                                "weights (precision bf16 or fp8), precision is fp16"),
        ({"framework": FrameworkProfile(name="torchtitan")}, "not torchtitan"),
    ],
)  # fmt: skip
def test_rules(training: dict[str, object], message: str) -> None:
    instance = _with(small_instance(), **training)
    with pytest.raises(LayoutError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate_layout(instance, _plan(grad_reduce_in_bf16=True))


def test_the_default_space_does_not_grow_and_the_knob_joins_where_it_runs() -> None:
    instance = small_instance()
    plain = list(enumerate_layouts(instance))
    assert not any(p.grad_reduce_in_bf16 for p in plain)
    both = list(enumerate_layouts(instance, SearchSpace(grad_reduce_in_bf16=(False, True))))
    assert [p for p in both if not p.grad_reduce_in_bf16] == plain
    assert len(both) == 2 * len(plain)
    fp16 = _with(instance, precision="fp16")
    space = SearchSpace(grad_reduce_in_bf16=(False, True))
    assert list(enumerate_layouts(fp16, space)) == list(enumerate_layouts(fp16))


def test_options() -> None:
    texts = parse_space({"grad_reduce_in_bf16": "false,true"})
    assert SearchSpace.model_validate({"grad_reduce_in_bf16": texts["grad_reduce_in_bf16"]}) == (
        SearchSpace(grad_reduce_in_bf16=(False, True))
    )
    runner = CliRunner()
    args = ["predict", "gpt3-1.3b-nominal-8", "--dist-opt", "--json"]
    off = json.loads(runner.invoke(app, args).output)
    on = json.loads(runner.invoke(app, [*args, "--grad-reduce-in-bf16"]).output)
    assert on["memory_gb_per_gpu_max"] < off["memory_gb_per_gpu_max"]
    assert on["grad_reduce_in_bf16"] is True and on["layout"] == off["layout"] + "-bf16grad"
