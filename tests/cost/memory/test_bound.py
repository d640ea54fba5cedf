"""'Fits' as a promise: the upper bound (peak + the framework's calibrated margin), the
headroom kept free, the margin every plan reports, and the FSDP state layout."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from pipette_cp.checker import check_plan
from pipette_cp.cli import app
from pipette_cp.cli.options import parse_headroom
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.cost.memory.peak import memory_by_stage, state_bytes_per_param, usable_memory_bytes
from pipette_cp.cost.stack.frameworks import FRAMEWORKS
from pipette_cp.errors import SpecError
from pipette_cp.experiments.models.published_runs import Baseline, RunResult
from pipette_cp.experiments.models.published_runs_fit import MAX_FALSE_OOM, fit_memory_margins
from pipette_cp.specs import Instance
from pipette_cp.specs.layouts import make_plan
from pipette_cp.specs.training import FrameworkProfile, TrainingSpec
from pipette_cp.units import GiB
from tests.conftest import small_instance

PLAN = make_plan(num_layers=8, dp=4, pp=2, tp=1, micro_batch_size=2)


def _with(inst: Instance, **training) -> Instance:
    return inst.model_copy(update={"training": inst.training.model_copy(update=training)})


def test_the_bound_is_the_peak_plus_the_margin_of_the_per_micro_batch_memory():
    inst = small_instance()
    aleph = _with(inst, framework=FrameworkProfile(name="aleph-alpha"))
    for stage in memory_by_stage(aleph.model, aleph.training, PLAN):
        assert stage.margin == pytest.approx(0.17 * stage.dynamic_bytes)
        assert stage.bound_bytes == pytest.approx(stage.total_bytes + stage.margin)
        assert sum(stage.as_dict().values()) == pytest.approx(stage.total_bytes)
    for stage in memory_by_stage(inst.model, inst.training, PLAN):  # Megatron-Core: no margin
        assert stage.bound_bytes == stage.total_bytes


def test_fits_is_judged_on_the_bound_and_the_margin_is_reported():
    """A margin that pushes the bound past the usable memory: the peak fits, the plan does
    not, the checker says so, and the reported margin is negative."""
    inst = small_instance()
    big = FrameworkProfile(name="megatron-core", memory_margin=2.0)
    plan = make_plan(num_layers=8, dp=8, pp=1, tp=1, micro_batch_size=2)
    loose = Evaluator(inst).evaluate(plan)
    tight_inst = _with(inst, framework=big, memory_headroom_bytes=float(inst.cluster.gpu_types[
        inst.cluster.node_gpu_types[0]].memory_bytes - 1.05 * loose.memory_bytes_max))  # fmt: skip
    tight = Evaluator(tight_inst).evaluate(plan)
    assert tight.memory_bytes_max == loose.memory_bytes_max < tight.memory_limit_bytes
    assert not tight.fits and tight.memory_margin_bytes < 0
    assert max(tight.memory_bound_bytes_by_stage) - tight.memory_limit_bytes == pytest.approx(
        -tight.memory_margin_bytes
    )
    assert [v.family for v in check_plan(tight_inst, plan)] == ["memory_limit"]
    assert loose.fits and loose.memory_margin_bytes == pytest.approx(
        loose.memory_limit_bytes - loose.memory_bytes_max
    )


def test_headroom_in_bytes_or_as_a_fraction():
    gpu = small_instance().cluster.gpu_types["A100-SXM4-80GB"]
    base = TrainingSpec(global_batch_size=8, seq_length=1024)
    assert usable_memory_bytes(gpu) == usable_memory_bytes(gpu, base) == gpu.memory_bytes - 0.02 * gpu.memory_bytes  # fmt: skip
    by_bytes = base.model_copy(update={"memory_headroom_bytes": 8 * GiB})
    assert usable_memory_bytes(gpu, by_bytes) == gpu.memory_bytes - 8 * GiB
    by_fraction = base.model_copy(update={"memory_headroom_fraction": 0.25})
    assert usable_memory_bytes(gpu, by_fraction) == pytest.approx(0.75 * gpu.memory_bytes)
    with pytest.raises(ValueError, match="not both"):
        TrainingSpec(global_batch_size=8, seq_length=1024, memory_headroom_bytes=1.0,
                     memory_headroom_fraction=0.1)  # fmt: skip


@pytest.mark.parametrize(
    "text, field, value",
    [("4", "memory_headroom_bytes", 4 * GiB), ("6GiB", "memory_headroom_bytes", 6 * GiB),
     ("0.05", "memory_headroom_fraction", 0.05), ("10%", "memory_headroom_fraction", 0.1)],
)  # fmt: skip
def test_memory_headroom_option_parses(text, field, value):
    assert parse_headroom(text)[field] == pytest.approx(value)


@pytest.mark.parametrize("text", ["abc", "0", "-1", "0.5GiB", "100%", "inf", "nan"])
def test_memory_headroom_option_refuses_nonsense(text):
    with pytest.raises(SpecError, match="--memory-headroom"):
        parse_headroom(text)


def test_memory_headroom_on_the_command_line():
    runner = CliRunner()
    args = ["predict", "gpt3-1.3b-nominal-8", "--tp", "1", "--pp", "2", "--json"]
    plain = json.loads(runner.invoke(app, args).stdout)
    kept = json.loads(runner.invoke(app, [*args, "--memory-headroom", "10GiB"]).stdout)
    assert plain["memory_limit_gb"] - kept["memory_limit_gb"] == pytest.approx(
        (10 * GiB - 0.02 * 80 * GiB) / 1e9, rel=1e-6
    )
    assert kept["memory_margin_gb"] == pytest.approx(
        kept["memory_limit_gb"] - max(kept["memory_bound_gb_by_stage"])
    )
    too_much = runner.invoke(app, [*args, "--memory-headroom", "100GiB"])
    assert too_much.exit_code == 2 and "memory_headroom_bytes" in too_much.output
    unknown = runner.invoke(app, [*args, "--framework", "nope"])
    assert unknown.exit_code == 2 and "training.framework.name='nope'" in unknown.output


def test_fsdp_keeps_no_compute_copy_under_full_sharding():
    """PyTorch FSDP (llm-foundry, torchtitan): 16 B per parameter over the shard group at
    ZeRO-3 (fp32 shard, fp32 gradient, two moments); Megatron/DeepSpeed keep 18."""
    inst = small_instance()
    plan = make_plan(num_layers=8, dp=8, pp=1, tp=1, micro_batch_size=1, dp_sharding="optim_grads_params")  # fmt: skip
    for name, total in (("llm-foundry", 16), ("torchtitan", 16), ("megatron-core", 18)):
        training = inst.training.model_copy(update={"framework": FrameworkProfile(name=name)})
        assert sum(state_bytes_per_param(training, plan)) * 8 == pytest.approx(total), name
    zero2 = plan.model_copy(update={"dp_sharding": "optim_grads"})
    training = inst.training.model_copy(update={"framework": FrameworkProfile(name="llm-foundry")})
    assert state_bytes_per_param(training, zero2)[0] == 2.0  # the gathered bf16 weights stay


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(list(FRAMEWORKS)), st.sampled_from([1, 2, 4]),
       st.sampled_from(["none", "selective", "full"]))  # fmt: skip
def test_the_bound_never_lies_below_the_peak(name, mb, recompute):
    inst = small_instance()
    training = inst.training.model_copy(update={"framework": FrameworkProfile(name=name)})
    plan = make_plan(num_layers=8, dp=2, pp=2, tp=2, micro_batch_size=mb, recompute=recompute)
    for stage in memory_by_stage(inst.model, training, plan):
        assert stage.bound_bytes >= stage.total_bytes >= stage.dynamic_bytes > 0


def _row(slack: float, oom: bool) -> RunResult:
    return RunResult("hagemann", "s", "fit", oom, True, 1.0, 1.0, memory_slack=slack)


def test_the_margin_rule_trades_false_fits_for_at_most_five_percent_false_ooms():
    """20 runs that ran (slack 0.5 each, one at 0.1) and 3 that ran out of memory (slack
    0.05, 0.3 and 0.9): margins up to 0.1 keep every run that ran; 0.3 would call one of
    the 20 (5 %) out of memory and is allowed, so the rule takes the smallest margin that
    calls the two nearest OOM runs right: 0.31 (the one at 0.9 stays a false fit)."""
    rows = [_row(0.5, False)] * 19 + [_row(0.1, False)] + [_row(s, True) for s in (0.05, 0.3, 0.9)]
    assert MAX_FALSE_OOM == 0.05
    margins = fit_memory_margins(Baseline(tuple(rows), Counter()))
    assert margins == {"aleph-alpha": 0.31}


def test_fsdp_runtime_leaves_out_deepspeeds_buckets():
    """The runtime constant fitted on Megatron-DeepSpeed includes DeepSpeed's reduce and
    all-gather buckets (5e8 fp16 elements each); PyTorch FSDP frameworks have neither."""
    inst = small_instance()
    runtimes = {}
    for name in ("megatron-deepspeed", "llm-foundry", "torchtitan"):
        training = inst.training.model_copy(update={"framework": FrameworkProfile(name=name)})
        runtimes[name] = memory_by_stage(inst.model, training, PLAN)[0].runtime
    assert runtimes["megatron-deepspeed"] - runtimes["llm-foundry"] == pytest.approx(2e9)
    assert runtimes["llm-foundry"] == runtimes["torchtitan"]


def test_any_training_field_on_the_command_line():
    runner = CliRunner()
    args = ["predict", "llama-2-7b-g3-32", "--tp", "2", "--pp", "1", "--json"]
    plain = json.loads(runner.invoke(app, args).stdout)
    stack = ["--training", "fused_norm=false", "--training", "fused_bias_activation=false"]
    slow = json.loads(runner.invoke(app, [*args, *stack]).stdout)
    assert slow["iteration_time_s"] > plain["iteration_time_s"]
    assert slow["memory_gb_per_gpu_max"] > plain["memory_gb_per_gpu_max"]
