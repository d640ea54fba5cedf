"""FP8 primary weights (Megatron --fp8-param-gather, Transformer Engine fp8_model_init):
the layer GEMM weights kept in FP8 only (no bf16 copy beside TE's row- and column-wise
FP8 copies), the distributed optimizer's parameter all-gather in FP8 in the evaluator and
the placement masters; its rules, label and flags; the default space does not grow."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from pipette_cp.cli import app
from pipette_cp.cost.evaluator.evaluate import Evaluator, evaluate, validate_layout
from pipette_cp.cost.memory import state
from pipette_cp.cost.memory.peak import memory_by_stage
from pipette_cp.cost.network.data_parallel import param_wire_bytes
from pipette_cp.cost.workload.parameters import layer_gemm_params_per_gpu
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


def _fp8(**training: object) -> Instance:
    instance = small_instance(gpu="h100")
    update = {"precision": "fp8", **training}
    return instance.model_copy(update={"training": instance.training.model_copy(update=update)})


def _plan(**knobs: object) -> Plan:
    return make_plan(num_layers=8, dp=DP, pp=1, tp=1, micro_batch_size=1, **knobs)


def test_default_is_off_and_keeps_the_bf16_weights_beside_the_fp8_copies() -> None:
    instance = _fp8()
    model, training = instance.model, instance.training
    plan = _plan(dp_sharding="optim")
    assert plan.fp8_param_gather is False
    gemm = 8 * layer_gemm_params_per_gpu(model, 1)
    assert state.stage_fp8_weight_bytes(model, training, plan, 0) == gemm * 2.0
    assert param_wire_bytes(training, plan) == 2.0


def test_fp8_weights_replace_the_bf16_copy_of_the_gemm_weights() -> None:
    instance = _fp8()
    model, training = instance.model, instance.training
    off, on = _plan(dp_sharding="optim"), _plan(dp_sharding="optim", fp8_param_gather=True)
    gemm = 8 * layer_gemm_params_per_gpu(model, 1)
    # the FP8 tensors are the weights: 2 x 1 B (row- and column-wise) instead of 2 + 2 x 1 B
    assert state.stage_fp8_weight_bytes(model, training, on, 0) == 0.0
    (before,), (after,) = (
        memory_by_stage(model, training, off),
        memory_by_stage(model, training, on),
    )
    assert before.weights - after.weights == pytest.approx(2.0 * gemm, rel=1e-12)
    assert (after.gradients, after.optimizer_state) == (before.gradients, before.optimizer_state)
    assert evaluate(instance, on).memory_bytes_max < evaluate(instance, off).memory_bytes_max


def test_no_remainders_of_fp8_weights_with_the_precision_aware_optimizer() -> None:
    training = _fp8().training
    both = _plan(dp_sharding="optim", precision_aware_optimizer=True, fp8_param_gather=True)
    # TE FusedAdam stores remainders of bf16 weights only: the fp32 master stays (4 B)
    assert state.state_bytes_per_param(training, both) == (2.0, 4.0, (4.0 + 4.0) / DP)
    bf16 = _plan(dp_sharding="optim", precision_aware_optimizer=True)
    assert state.state_bytes_per_param(training, bf16) == (2.0, 4.0, (2.0 + 4.0) / DP)


def test_the_parameter_gather_moves_fp8_in_the_evaluator_and_the_master() -> None:
    instance = _fp8()
    plan = make_plan(num_layers=8, dp=4, pp=2, tp=1, micro_batch_size=1, dp_sharding="optim")
    on = plan.model_copy(update={"fp8_param_gather": True})
    assert param_wire_bytes(instance.training, on) == 1.0
    off_data, on_data = (build_placement_data(instance, p) for p in (plan, on))
    assert on_data.gather_ratio == pytest.approx(off_data.gather_ratio / 2, rel=1e-15)
    np.testing.assert_array_equal(on_data.ring_bytes, off_data.ring_bytes)
    assert evaluate(instance, on).breakdown_s.dp_comm < evaluate(instance, plan).breakdown_s.dp_comm
    evaluator = Evaluator(instance, dp_algorithm="ring", validate=False)
    assert_master_prices_as_evaluator(instance, on, evaluator, seed=2, draws=4)


def test_the_expert_rings_gather_fp8_too() -> None:
    from tests.solvers.placement.test_group_masters import setup

    inst, plan = setup((4, 1, 1, 1, 2, None), 2)
    on = plan.model_copy(update={"fp8_param_gather": True})
    ring = Evaluator(inst, dp_algorithm="ring", validate=False)
    assert_master_prices_as_evaluator(inst, on, ring, seed=0, draws=3)


def test_label_and_megatron_flags_checked_against_the_argument_table() -> None:
    instance = _fp8()
    plan = _plan(dp_sharding="optim", fp8_param_gather=True)
    assert plan.layout() == "dp8-pp1-tp1-mb1-do-fp8param"
    assert "--fp8-param-gather" in megatron_args(instance, plan)
    check_flags(instance, plan)


@pytest.mark.parametrize(
    ("training", "knobs", "message"),
    [
        ({"precision": "bf16"}, {"dp_sharding": "optim"},
         "plan.fp8_param_gather=True: needs FP8 training (precision fp8), precision is bf16"),
        ({}, {}, "needs the distributed optimizer (dp_sharding optim), dp_sharding is none"),
        ({}, {"dp_sharding": "optim_grads"}, "dp_sharding is optim_grads"),
        ({"framework": FrameworkProfile(name="torchtitan")}, {"dp_sharding": "optim"},
         "not torchtitan"),
    ],
)  # fmt: skip
def test_rules(training: dict[str, object], knobs: dict[str, object], message: str) -> None:
    with pytest.raises(LayoutError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate_layout(_fp8(**training), _plan(fp8_param_gather=True, **knobs))


def test_the_default_space_does_not_grow_and_the_knob_joins_where_it_runs() -> None:
    instance = _fp8()
    plain = list(enumerate_layouts(instance))
    assert not any(p.fp8_param_gather for p in plain)
    both = list(enumerate_layouts(instance, SearchSpace(fp8_param_gather=(False, True))))
    on = [p for p in both if p.fp8_param_gather]
    assert [p for p in both if not p.fp8_param_gather] == plain
    assert len(on) == sum(p.sharding == "optim" for p in plain) > 0


def test_predict_takes_it() -> None:
    runner = CliRunner()
    args = ["predict", "llama-3-8b-g2-64", "--training", "precision=fp8", "--dist-opt",
            "--tp", "1", "--pp", "1", "--json"]  # fmt: skip
    off = json.loads(runner.invoke(app, args).stdout)
    on = json.loads(runner.invoke(app, [*args, "--fp8-param-gather"]).stdout)
    # Llama 3 8B: about 7.0e9 GEMM weights (dp 64 shards only the optimizer state), 2 B each
    assert off["memory_gb_per_gpu_max"] - on["memory_gb_per_gpu_max"] == pytest.approx(
        14.0, abs=0.1
    )
    assert on["fp8_param_gather"] is True and on["layout"] == off["layout"] + "-fp8param"
