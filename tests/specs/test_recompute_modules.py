"""Megatron-Core's named-module recomputation (--recompute-granularity selective
--recompute-modules, TransformerConfig.recompute_modules): which kept activations each
module drops, what its forward adds to the backward, the evaluator and the placement
masters alike; plain ``selective`` stays core_attn; rules, label, flags, the space."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pipette_cp.cli import app
from pipette_cp.cli.knob_flags import parse_space
from pipette_cp.cost.compute.gemm import gemm_time_s, hbm_time_s
from pipette_cp.cost.compute.model_chunks import layer_times
from pipette_cp.cost.evaluator.evaluate import Evaluator, evaluate, validate_layout
from pipette_cp.cost.evaluator.expert_groups import alltoalls_per_layer
from pipette_cp.cost.memory import moe_activations as moe_terms
from pipette_cp.cost.memory.activations import (
    activation_bytes_per_layer,
    moe_activation_bytes_per_layer,
)
from pipette_cp.cost.stack.calibration import calibration_for
from pipette_cp.cost.stack.frameworks import framework_calibration
from pipette_cp.cost.stack.kernels import norm_bytes
from pipette_cp.cost.workload.flops import layer_gemms
from pipette_cp.cost.workload.tokens import expert_tokens, rank_tokens
from pipette_cp.errors import LayoutError
from pipette_cp.report.megatron.flags import check_flags, megatron_args, megatron_argv
from pipette_cp.search.capacity import model_capacity
from pipette_cp.search.space import enumerate_layouts
from pipette_cp.specs import Instance, Plan, SearchSpace
from pipette_cp.specs.layouts import make_plan
from pipette_cp.specs.training import FrameworkProfile, TrainingSpec
from tests.conftest import small_instance
from tests.cost.deepseek_v3 import DS
from tests.cost.network.test_parallel_groups import _instance, _moe_model
from tests.placement_checks import assert_master_prices_as_evaluator

S = 1024  # the small GPT's sequence: h 1024, f 4096 (GeLU), 16 heads, dropout


def _plan(modules: str | None = None, **knobs: object) -> Plan:
    return make_plan(num_layers=8, dp=8, pp=1, tp=1, micro_batch_size=1, recompute="selective",
                     recompute_modules=modules, **knobs)  # fmt: skip


def _moe(**extra: object) -> Instance:
    return _instance(_moe_model(num_shared_experts=1, **extra), seq=S)


def test_plain_selective_is_core_attn_and_prices_as_before() -> None:
    instance = small_instance()
    assert _plan("core_attn") == _plan() and _plan().recompute_modules is None
    before = evaluate(instance, _plan())
    assert evaluate(instance, _plan("core_attn")) == before
    assert _plan().layout() == "dp8-pp1-tp1-mb1-sel"


def test_mlp_drops_the_fc1_input_and_the_inner_terms() -> None:
    instance = small_instance()
    model, training = instance.model, instance.training
    plain = activation_bytes_per_layer(model, training, _plan())
    # per token: FC1's input 2 B x h and GeLU's input and output 2 x 2 B x f
    assert plain - activation_bytes_per_layer(model, training, _plan("core_attn,mlp")) == (
        S * (2 * 1024 + 4 * 4096)
    )


def test_leaving_core_attn_out_keeps_the_unfused_scores() -> None:
    instance = small_instance()
    model, training = instance.model, instance.training
    unfused = {"flash_attention": False}
    with_core = activation_bytes_per_layer(model, training, _plan("core_attn,mlp", **unfused))
    without = activation_bytes_per_layer(model, training, _plan("mlp", **unfused))
    # Korthikanti et al.: softmax output, dropout mask and output, 5 B per score
    assert without - with_core == 16 * S * S * 5


def test_mlp_adds_its_forward_to_the_backward() -> None:
    instance = small_instance()
    model, training = instance.model, instance.training
    gpu = instance.cluster.gpu_of_node(0)
    cal = framework_calibration(calibration_for(gpu), training)
    plain = layer_times(model, training, gpu, _plan(), 150e9)
    mlp = layer_times(model, training, gpu, _plan("core_attn,mlp"), 150e9)
    gemms = [g for g in layer_gemms(model, S, 1, 1) if g.name in ("fc1", "fc2")]
    # FC1, FC2, the GeLU (read + write 2 B of T f) and the norm fused into FC1 (4 B of T h)
    moved = S * 4096 * 4.0 + S * 1024 * norm_bytes(model, training, _plan())
    extra = sum(gemm_time_s(g, gpu, cal) for g in gemms) + hbm_time_s(moved, gpu, cal)
    assert mlp.recompute_s - plain.recompute_s == pytest.approx(extra, rel=1e-12)
    assert mlp.forward_s == plain.forward_s
    assert mlp.backward_s - plain.backward_s == pytest.approx(extra, rel=1e-12)


def test_the_moe_modules_drop_their_terms() -> None:
    instance = _moe()
    model, training = instance.model, instance.training
    kept = lambda modules: moe_activation_bytes_per_layer(model, training, _plan(modules))  # noqa: E731
    plain, h, routed = kept(None), model.hidden_size, rank_tokens(training, _plan())
    moe_part = moe_terms.moe_mlp_activation_bytes(model, training, _plan())
    assert plain - kept("core_attn,moe") == moe_part - 2.0 * h * routed  # the block's input stays
    shared = moe_terms.shared_expert_activation_bytes(model, training, _plan())
    assert plain - kept("core_attn,shared_experts") == shared > 0
    act = expert_tokens(model, training, _plan()) * model.expert_width * 2.0  # FC2's bf16 input
    assert plain - kept("core_attn,moe_act") == act
    assert plain - kept("core_attn,layernorm") == 2.0 * h * routed  # the router's input
    assert alltoalls_per_layer(_plan("core_attn,moe")) == (2.0, 4.0)
    assert (
        alltoalls_per_layer(_plan("core_attn,moe_act"))
        == alltoalls_per_layer(_plan())
        == (2.0, 2.0)
    )


def test_mla_up_proj_drops_the_up_projected_q_k_v() -> None:
    training = TrainingSpec(global_batch_size=8, seq_length=S)
    plain = activation_bytes_per_layer(DS, training, _plan())
    # DeepSeek-V3: 128 heads of 128 + 64 query/key and 128 value channels, 2 B each
    per_token = 2 * (128 * 192) * 2 + 2 * (128 * 128)
    assert plain - activation_bytes_per_layer(DS, training, _plan("core_attn,mla_up_proj")) == (
        S * per_token
    )


@pytest.mark.parametrize(("layout", "modules"), [((2, 1, 1, 2, 2, None), "moe"),
                                                 ((2, 1, 1, 2, 2, None), "core_attn,moe"),
                                                 ((2, 1, 2, 1, 4, 1), "shared_experts,moe_act")])  # fmt: skip
def test_the_placement_masters_price_the_modules_as_the_evaluator(layout, modules) -> None:
    from tests.solvers.placement.test_group_masters import setup

    inst, plan = setup(layout, 4)
    model = inst.model.model_copy(update={"num_shared_experts": 1})
    inst = inst.model_copy(update={"model": model})
    plan = plan.model_copy(
        update={"recompute": "selective", "recompute_modules": tuple(modules.split(","))}
    )
    ring = Evaluator(inst, dp_algorithm="ring", validate=False)
    assert_master_prices_as_evaluator(inst, plan, ring, seed=0, draws=4)


def test_label_and_megatron_flags_checked_against_the_argument_table() -> None:
    instance = small_instance()
    plan = _plan("mlp,core_attn")
    assert plan.recompute_modules == ("core_attn", "mlp")  # Megatron's order
    assert plan.layout() == "dp8-pp1-tp1-mb1-sel:core_attn+mlp"
    assert "--recompute-modules core_attn mlp" in megatron_args(instance, plan)
    argv = megatron_argv(instance, plan)
    at = argv.index("--recompute-modules")
    assert argv[at : at + 3] == ["--recompute-modules", "core_attn", "mlp"]
    check_flags(instance, plan)
    assert "--recompute-modules" not in megatron_argv(instance, _plan())


@pytest.mark.parametrize(
    ("instance", "knobs", "message"),
    [
        (small_instance(), {"recompute": "full"}, "plan.recompute_modules='mlp': only with "
                                                  "recompute selective, recompute is full"),
        (small_instance(), {}, "moe needs a mixture-of-experts model, small-gpt is dense"),
        (small_instance(), {"modules": "mla_up_proj"}, "mla_up_proj needs latent attention"),
        (small_instance(), {"modules": "layernorm"}, "layernorm recomputes the norms not fused"),
        (_moe(), {"modules": "mlp"}, "mlp recomputes dense MLP layers, tiny-moe has none"),
        (_moe(), {"modules": "moe_act", "grouped": False}, "moe_act needs moe_grouped_gemm"),
        (_moe(), {"modules": "moe_act", "fp8": True}, "moe_act does not run with FP8 delayed "
                                                      "scaling"),
        (small_instance(), {"framework": "torchtitan"}, "are Megatron-Core's (framework "),
    ],
)  # fmt: skip
def test_rules(instance: Instance, knobs: dict[str, object], message: str) -> None:
    training = instance.training.model_copy(update={
        "moe_grouped_gemm": knobs.get("grouped", True),
        "precision": "fp8" if knobs.get("fp8") else "bf16",
        "framework": FrameworkProfile(name=str(knobs.get("framework", "megatron-core"))),
    })  # fmt: skip
    instance = instance.model_copy(update={"training": training})
    default = "moe" if "framework" not in knobs and "recompute" not in knobs else "mlp"
    modules = str(knobs.get("modules", default))
    plan = make_plan(num_layers=4 if instance.model.is_moe else 8, dp=8, pp=1, tp=1,
                     micro_batch_size=1, recompute=knobs.get("recompute", "selective"),
                     recompute_modules=modules)  # fmt: skip
    with pytest.raises(LayoutError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate_layout(instance, plan)


def test_the_default_space_does_not_grow_and_module_sets_join_where_the_model_has_them() -> None:
    instance = small_instance()
    plain = list(enumerate_layouts(instance))
    assert not any(p.recompute_modules for p in plain)
    space = SearchSpace(recompute_modules=(("core_attn",), ("core_attn", "mlp"), ("moe",)))
    more = list(enumerate_layouts(instance, space))
    assert [p for p in more if p.recompute_modules is None] == plain
    named = [p for p in more if p.recompute_modules]
    assert {p.recompute_modules for p in named} == {("core_attn", "mlp")}  # moe: a dense model
    assert len(named) == sum(p.recompute == "selective" for p in plain)
    light = SearchSpace(recompute=("selective",), recompute_modules=(("core_attn", "mlp"),))
    assert (
        model_capacity(instance, light).sharded_bytes
        < model_capacity(instance, SearchSpace(recompute=("selective",))).sharded_bytes
    )


def test_options() -> None:
    texts = parse_space({"recompute_modules": "core_attn,core_attn+mlp"})
    space = SearchSpace.model_validate({"recompute_modules": texts["recompute_modules"]})
    assert space.recompute_modules == (("core_attn",), ("core_attn", "mlp"))
    runner = CliRunner()
    args = ["predict", "gpt3-1.3b-nominal-8", "--recompute", "selective", "--json"]
    off = json.loads(runner.invoke(app, args).output)
    on = json.loads(runner.invoke(app, [*args, "--recompute-modules", "core_attn,mlp"]).output)
    assert on["memory_gb_per_gpu_max"] < off["memory_gb_per_gpu_max"]
    assert on["iteration_time_s"] > off["iteration_time_s"]
    assert on["recompute_modules"] == ["core_attn", "mlp"]
    refused = runner.invoke(app, ["predict", "gpt3-1.3b-nominal-8", "--recompute-modules", "moe"])
    assert refused.exit_code == 2 and "only with recompute selective" in refused.output
