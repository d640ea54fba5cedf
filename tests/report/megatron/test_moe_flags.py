"""Megatron-LM exports of context parallelism, experts, latent attention and MTP.

The flags of Mixtral-like and DeepSeek-V3-like plans, the ``export --check`` rules
(:func:`pipette_cp.report.megatron.flags.check_flags`, no cost model), hand-broken argument
lists the check must refuse, and the rank layout of the launch files with cp > 1
(Megatron's tp-cp-dp-pp order).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipette_cp.cli import app, options
from pipette_cp.errors import SpecError
from pipette_cp.io.instance_file import instance_from_mapping, list_instances, load_instance
from pipette_cp.report.launch import rank_map, write_launch_files
from pipette_cp.report.megatron import flags as megatron
from pipette_cp.report.megatron.check import argument_table, check_megatron_argv
from pipette_cp.report.megatron.flags import (
    check_export,
    check_flags,
    megatron_args,
    megatron_argv,
    megatron_environment,
    megatron_notes,
)
from pipette_cp.report.megatron.moe_flags import moe_layer_freq, parse_layer_pattern
from pipette_cp.specs import Instance, Plan
from pipette_cp.specs.layouts import make_plan
from tests.report.test_launch import INSTANCE, _check_ranks, _launch, fakes  # noqa: F401 (fixture)

#: Every flag this feature may add; none of them appears in a dense cp = ep = 1 export.
NEW_FLAGS = (
    "--context-parallel-size", "--cp-comm-type", "--expert-model-parallel-size",
    "--expert-tensor-parallel-size", "--num-experts", "--moe-router-topk",
    "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size", "--moe-shared-expert-gate",
    "--moe-layer-freq", "--moe-router-load-balancing-type", "--moe-aux-loss-coeff",
    "--moe-z-loss-coeff", "--moe-expert-capacity-factor", "--moe-pad-expert-input-to-capacity",
    "--moe-router-enable-expert-bias", "--moe-router-score-function",
    "--moe-token-dispatcher-type", "--moe-grouped-gemm", "--multi-latent-attention",
    "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim",
    "--rope-type", "--rotary-scaling-factor", "--mtp-num-layers",
)  # fmt: skip


def _instance(model: str, nodes: int, *, seq: int = 4096, gbs: int = 64, **training) -> Instance:
    return instance_from_mapping({
        "name": f"{model}-{nodes}", "model": model,
        "cluster": {"generator": {"kind": "g1", "nodes": nodes, "seed": 0}},
        "training": {"global_batch_size": gbs, "seq_length": seq, **training},
    })  # fmt: skip


MIXTRAL = _instance("mixtral-8x7b", 2, gbs=16)  # 16 A100s
DEEPSEEK = _instance("deepseek-v3", 8)  # 64 A100s
MIXTRAL_PLAN = make_plan(num_layers=32, dp=2, pp=2, tp=2, cp=2, ep=4, micro_batch_size=1,
                         sequence_parallel=True)  # fmt: skip
DEEPSEEK_PLAN = make_plan(num_layers=61, dp=4, pp=4, tp=2, cp=2, ep=8, etp=1,
                          micro_batch_size=1, sequence_parallel=True)  # fmt: skip


def _given(instance: Instance, plan: Plan) -> dict[str, object]:
    """dest -> value of the export, as Megatron's parser table reads it."""
    parsed = check_megatron_argv(megatron_argv(instance, plan))
    return {dest: value for dest, (_, value) in parsed.items()}


# ------------------------------------------------------------------ the flags
def test_mixtral_flags() -> None:
    given = _given(MIXTRAL, MIXTRAL_PLAN)
    expected = {
        "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2,
        "context_parallel_size": 2, "cp_comm_type": ["p2p"], "expert_model_parallel_size": 4,
        "num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 14336,
        "moe_layer_freq": 1, "moe_router_load_balancing_type": ["aux_loss"],
        "moe_aux_loss_coeff": [0.02], "moe_token_dispatcher_type": "alltoall",
        "moe_grouped_gemm": True, "sequence_parallel": True,
    }  # fmt: skip
    assert {k: given.get(k) for k in expected} == expected
    for absent in ("expert_tensor_parallel_size", "multi_latent_attention", "mtp_num_layers",
                   "moe_shared_expert_intermediate_size", "moe_router_enable_expert_bias",
                   "moe_expert_capacity_factor", "moe_z_loss_coeff"):  # fmt: skip
        assert absent not in given, absent
    assert megatron_environment(MIXTRAL, MIXTRAL_PLAN) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    notes = " ".join(megatron_notes(MIXTRAL, MIXTRAL_PLAN))
    assert "tensor and context parallelism before Blackwell" in notes
    assert "experts: 8 routed (top 2) over ep=4 x etp=2 GPUs" in notes


def test_deepseek_v3_flags() -> None:
    given = _given(DEEPSEEK, DEEPSEEK_PLAN)
    expected = {
        "context_parallel_size": 2, "expert_model_parallel_size": 8,
        "expert_tensor_parallel_size": 1, "num_experts": 256, "moe_router_topk": 8,
        "moe_ffn_hidden_size": 2048, "moe_shared_expert_intermediate_size": 2048,
        "moe_layer_freq": [0] * 3 + [1] * 58, "moe_router_load_balancing_type": ["none"],
        "moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True,
        "multi_latent_attention": True, "q_lora_rank": 1536, "kv_lora_rank": 512,
        "qk_head_dim": 128, "qk_pos_emb_head_dim": 64, "v_head_dim": 128, "qk_layernorm": True,
        "rope_type": "yarn", "rotary_scaling_factor": 40.0, "mtp_num_layers": 1,
        "ffn_hidden_size": 18432, "num_layers": 61,
    }  # fmt: skip
    assert {k: given.get(k) for k in expected} == expected
    assert "group_query_attention" not in given and "kv_channels" not in given
    assert "moe_shared_expert_gate" not in given
    args = megatron_args(DEEPSEEK, DEEPSEEK_PLAN)
    assert "--moe-layer-freq '([0]*3+[1]*58)'" in args  # quoted for the shell
    assert "YaRN x40 over 4096 positions" in " ".join(megatron_notes(DEEPSEEK, DEEPSEEK_PLAN))


def test_every_emitted_flag_is_in_the_table() -> None:
    table = argument_table()
    for instance, plan in ((MIXTRAL, MIXTRAL_PLAN), (DEEPSEEK, DEEPSEEK_PLAN)):
        for flag, _ in megatron.megatron_flags(instance, plan):
            assert flag in table, flag
    assert set(NEW_FLAGS) <= set(table)


def test_optional_expert_settings() -> None:
    """Shared-expert gate, z-loss, capacity with padding, allgather, no grouped GEMM, MLA
    without query compression or YaRN, and the etp default (not written)."""
    base = _instance("deepseek-v3", 8, moe_token_dispatcher="allgather",
                     moe_grouped_gemm=False, moe_pad_to_capacity=True)  # fmt: skip
    model = base.model.model_copy(update={
        "shared_expert_gate": True, "moe_z_loss_coeff": 0.001, "moe_capacity_factor": 1.25,
        "moe_router_aux_loss_coeff": 0.0001, "q_lora_rank": None, "yarn_scaling_factor": None,
        "yarn_original_max_seq_length": None, "mtp_layers": 0, "moe_router_expert_bias": False,
    })  # fmt: skip
    instance = base.model_copy(update={"model": model})
    plan = DEEPSEEK_PLAN.model_copy(update={"etp": None})
    given = _given(instance, plan)
    assert given["moe_shared_expert_gate"] is True and given["moe_z_loss_coeff"] == 0.001
    assert given["moe_expert_capacity_factor"] == 1.25
    assert given["moe_pad_expert_input_to_capacity"] is True
    assert given["moe_router_load_balancing_type"] == ["aux_loss"]
    assert given["moe_aux_loss_coeff"] == [0.0001]
    assert given["moe_token_dispatcher_type"] == "allgather" and "moe_grouped_gemm" not in given
    assert given["rope_type"] == "rope" and "q_lora_rank" not in given
    for absent in ("expert_tensor_parallel_size", "mtp_num_layers", "rotary_scaling_factor",
                   "moe_router_enable_expert_bias", "moe_router_score_function"):  # fmt: skip
        assert absent not in given, absent
    check_flags(instance, plan)
    # padding needs a capacity factor: left out (with a note) for a dropless model
    dropless = instance.model_copy(
        update={"model": model.model_copy(update={"moe_capacity_factor": None})}
    )
    assert "moe_pad_expert_input_to_capacity" not in _given(dropless, plan)
    assert "--moe-pad-expert-input-to-capacity left out" in " ".join(megatron_notes(dropless, plan))


@pytest.mark.parametrize(("first", "freq"), [(0, 1), (0, 2), (0, 3), (3, 1), (1, 2), (2, 3),
                                             (4, 4), (5, 2)])  # fmt: skip
def test_layer_freq_parses_to_the_models_pattern(first: int, freq: int) -> None:
    m = DEEPSEEK.model.model_copy(update={"first_k_dense_layers": first, "moe_layer_freq": freq})
    value = parse_layer_pattern("--moe-layer-freq", moe_layer_freq(m))
    layers = range(m.num_layers)
    pattern = [int(i % value == 0) for i in layers] if isinstance(value, int) else value
    assert pattern == [int(m.is_moe_layer(i)) for i in layers]


@pytest.mark.slow
def test_dense_plans_without_cp_get_no_new_flags() -> None:
    for name in list_instances()[:12]:
        instance = load_instance(name)
        if instance.model.position_embedding == "alibi":
            continue
        plan = make_plan(num_layers=instance.model.num_layers, dp=1, pp=1, tp=1,
                         micro_batch_size=1)  # fmt: skip
        flags = {flag for flag, _ in megatron.megatron_flags(instance, plan)}
        assert not flags & set(NEW_FLAGS), (name, flags & set(NEW_FLAGS))
        assert not any("context" in n or "expert" in n for n in megatron_notes(instance, plan))


def test_dense_context_parallel_plan() -> None:
    instance = load_instance("gpt3-1.3b-nominal-8")
    plan = make_plan(num_layers=24, dp=4, pp=1, tp=1, cp=2, micro_batch_size=1)
    given = _given(instance, plan)
    assert given["context_parallel_size"] == 2 and given["cp_comm_type"] == ["p2p"]
    assert "expert_model_parallel_size" not in given and "num_experts" not in given
    # cp alone needs one CUDA stream before Blackwell too
    assert megatron_environment(instance, plan) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    check_flags(instance, plan)


def test_flags_and_check_need_no_cost_model(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise AssertionError("the export's flags must not evaluate the plan")

    monkeypatch.setattr(megatron, "evaluate", refuse)
    for instance, plan in ((MIXTRAL, MIXTRAL_PLAN), (DEEPSEEK, DEEPSEEK_PLAN)):
        megatron_args(instance, plan)
        megatron_notes(instance, plan)
        check_flags(instance, plan)


def test_check_export_of_moe_is_the_cost_models_call() -> None:
    """check_export also checks memory, which needs the cost model: while it does not
    model experts the refusal is its one-line LayoutError, after that the plan passes."""
    try:
        check_export(MIXTRAL, MIXTRAL_PLAN)
    except SpecError as err:
        assert "not modelled" in str(err) or "does not fit" in str(err), err


# ------------------------------------------------------------------ broken argument lists
def _swap(argv: list[str], flag: str, value: str | None) -> list[str]:
    """``argv`` with ``flag``'s value replaced (or the flag dropped for None)."""
    out, i = [], 0
    while i < len(argv):
        token = argv[i]
        takes = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        if token == flag:
            if value is not None:
                out += [flag, value]
            i += 2 if takes else 1
            continue
        out.append(token)
        i += 1
    return out


def _mixtral() -> list[str]:
    return megatron_argv(MIXTRAL, MIXTRAL_PLAN)


def _deepseek() -> list[str]:
    return megatron_argv(DEEPSEEK, DEEPSEEK_PLAN)


@pytest.mark.parametrize(
    ("make", "world", "message"),
    [
        (lambda: _swap(_mixtral(), "--expert-model-parallel-size", "3"), None,
         "--num-experts=8: must be a multiple of --expert-model-parallel-size 3"),
        (lambda: _swap(_swap(_swap(_mixtral(), "--num-experts", None), "--moe-router-topk", None),
                       "--moe-ffn-hidden-size", None), None,
         "--expert-model-parallel-size=4: needs --num-experts"),
        (lambda: _swap(_mixtral(), "--sequence-parallel", None), None,
         "--num-experts=8: with --tensor-model-parallel-size 2 needs --sequence-parallel"),
        (lambda: [*_swap(_mixtral(), "--bf16", None), "--fp16"], None,
         "--expert-model-parallel-size=4: is not supported with --fp16"),
        (lambda: _swap(_mixtral(), "--disable-bias-linear", None), None,
         "--expert-tensor-parallel-size=2: must be 1 for experts with biases"),
        (lambda: _swap(_deepseek(), "--moe-layer-freq", "([0]*3+[1]*57)"), None,
         "lists 60 layers, --num-layers is 61"),
        (lambda: _swap(_deepseek(), "--moe-layer-freq", "[0]*3+[1]*58 or 1"), None,
         "a pattern has digits and [](),+* only"),
        (lambda: _swap(_deepseek(), "--moe-layer-freq", "([0]*3+[2]*58)"), None,
         "must evaluate to a list of 0 (dense) and 1 (experts)"),
        (lambda: _swap(_deepseek(), "--moe-layer-freq", "0"), None, "must be at least 1"),
        (lambda: _swap(_deepseek(), "--moe-router-score-function", None), None,
         "--moe-router-enable-expert-bias=True: needs --moe-router-score-function sigmoid"),
        (lambda: [*_mixtral(), "--moe-pad-expert-input-to-capacity"], None,
         "--moe-pad-expert-input-to-capacity=True: needs --moe-expert-capacity-factor"),
        (lambda: [*_swap(_mixtral(), "--moe-router-load-balancing-type", "sinkhorn"),
                  "--moe-expert-capacity-factor", "1.0"], None,
         "--moe-expert-capacity-factor=1.0: needs --moe-router-load-balancing-type aux_loss"),
        (lambda: [*_swap(_mixtral(), "--moe-router-load-balancing-type", None),
                  "--moe-router-load-balancing-type", "aux_loss", "sinkhorn"], None,
         "--moe-aux-loss-coeff='0.02': needs one value per --moe-router-load-balancing-type (2)"),
        (lambda: _swap(_mixtral(), "--seq-length", "4098"), None,
         "--seq-length=4098: must be divisible by 2 x --context-parallel-size = 4"),
        (lambda: _swap(_swap(_mixtral(), "--seq-length", "4100"), "--tensor-model-parallel-size",
                       "4"), None, "--seq-length=4100: with --sequence-parallel must be divisible "
         "by cp x tp = 8"),
        (_mixtral, 12, "world size=12: must be divisible by tp x pp x cp = 2 x 2 x 2 = 8"),
        (lambda: _swap(_mixtral(), "--expert-model-parallel-size", "8"), 16,
         "world size=16: must be divisible by etp x ep x pp = 2 x 8 x 2 = 32"),
        (lambda: [*_mixtral(), "--expert-tensor-parallel-size", "4"], 16,
         "world size=16: must be divisible by etp x ep x pp = 4 x 4 x 2 = 32"),
    ],
)  # fmt: skip
def test_broken_flag_lists_fail_the_check(make, world: int | None, message: str) -> None:
    argv = make()
    with pytest.raises(SpecError) as err:
        check_megatron_argv(argv, world_size=world)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_valid_exports_pass_with_their_world_size_and_environment() -> None:
    for instance, plan in ((MIXTRAL, MIXTRAL_PLAN), (DEEPSEEK, DEEPSEEK_PLAN)):
        env = megatron_environment(instance, plan)
        check_megatron_argv(megatron_argv(instance, plan), env, world_size=plan.num_gpus)
        with pytest.raises(SpecError, match="CUDA_DEVICE_MAX_CONNECTIONS='<inherited>'"):
            check_megatron_argv(megatron_argv(instance, plan), {}, world_size=plan.num_gpus)


def test_dense_ep_is_refused() -> None:
    instance = load_instance("gpt3-1.3b-nominal-8")
    ep = make_plan(num_layers=24, dp=4, pp=1, tp=2, ep=2, micro_batch_size=1)
    with pytest.raises(SpecError, match="--expert-model-parallel-size=2: needs --num-experts"):
        check_flags(instance, ep)


def test_cp_connections_rule_on_its_own() -> None:
    with pytest.raises(SpecError, match="must be 1 with tensor or context parallelism"):
        check_megatron_argv(["--context-parallel-size", "2", "--seq-length", "4096"], {})
    check_megatron_argv(["--context-parallel-size", "2"], {}, before_blackwell=False)


# ------------------------------------------------------------------ launch files with cp
def _scattered_cp_plan() -> Plan:
    """dp=2, cp=2, tp=2, pp=2 on INSTANCE's 2 nodes x 8 GPUs, tensor pairs shuffled
    over both nodes (and reversed inside each pair), so no rank sits where the default
    placement puts it."""
    pairs = [(g + 1, g) for g in range(0, 16, 2)]
    random.Random(7).shuffle(pairs)
    return make_plan(num_layers=24, dp=2, pp=2, tp=2, cp=2, micro_batch_size=1,
                     sequence_parallel=True, placement=tuple(pairs))  # fmt: skip


def test_rank_map_follows_tp_cp_dp_pp(tmp_path: Path) -> None:
    plan = _scattered_cp_plan()
    assert plan.placement != make_plan(num_layers=24, dp=2, pp=2, tp=2, cp=2,
                                       micro_batch_size=1).placement  # fmt: skip
    slots = rank_map(INSTANCE, plan)
    names = INSTANCE.cluster.node_names
    gpu_of_rank = {s.rank: names.index(s.host) * 8 + s.local_gpu for s in slots}
    assert sorted(gpu_of_rank) == list(range(16))
    tp, cp, dp = 2, 2, 2
    for stage in range(2):
        for d in range(dp):
            for c in range(cp):
                replica = d * cp + c
                for t in range(tp):
                    rank = t + tp * (replica + plan.replicas * stage)
                    # Megatron's tp-cp-dp-pp order, spelled out independently
                    assert rank == t + tp * (c + cp * (d + dp * stage))
                    assert gpu_of_rank[rank] == plan.placement[stage * 4 + replica][t]
                    slot = slots[rank]
                    assert (slot.stage, slot.dp_rank, slot.cp_rank, slot.tp_rank) == (
                        stage, d, c, t,
                    )  # fmt: skip
    write_launch_files(INSTANCE, plan, tmp_path)
    rows = (tmp_path / "rank_map.csv").read_text().splitlines()
    assert rows[0] == "rank,host,local_gpu,stage,dp_rank,cp_rank,tp_rank"
    for row, slot in zip(rows[1:], slots, strict=True):
        values = (slot.rank, slot.host, slot.local_gpu, slot.stage, slot.dp_rank, slot.cp_rank,
                  slot.tp_rank)  # fmt: skip
        assert row == ",".join(map(str, values))
    hosts = [names[gpu_of_rank[r] // 8] for r in range(16)]
    assert (tmp_path / "slurm_hostfile").read_text().splitlines() == hosts
    rankfile = [line for line in (tmp_path / "rankfile").read_text().splitlines()
                if not line.startswith("#")]  # fmt: skip
    assert rankfile == hosts
    wrapper = (tmp_path / "rank_wrapper.sh").read_text()
    assert "gpus=(" + " ".join(str(gpu_of_rank[r] % 8) for r in range(16)) + ")" in wrapper
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in wrapper
    assert "--context-parallel-size 2" in wrapper


def test_dense_rank_map_csv_keeps_its_columns(tmp_path: Path) -> None:
    plan = make_plan(num_layers=24, dp=4, pp=2, tp=2, micro_batch_size=1)
    write_launch_files(INSTANCE, plan, tmp_path)
    rows = (tmp_path / "rank_map.csv").read_text().splitlines()
    assert rows[0] == "rank,host,local_gpu,stage,dp_rank,tp_rank" and rows[3] == "2,node000,2,0,1,0"


@pytest.mark.parametrize("launcher", ["slurm", "mpirun"])
def test_launchers_start_cp_ranks_where_the_plan_puts_them(
    launcher: str,
    fakes: Path,  # noqa: F811 (the fixture of test_launchers)
    tmp_path: Path,
) -> None:
    plan = _scattered_cp_plan()
    write_launch_files(INSTANCE, plan, tmp_path / "launch")
    record = tmp_path / "record"
    record.mkdir()
    _launch(launcher, tmp_path / "launch", plan, fakes, record)
    argv = _check_ranks(launcher, plan, record)
    assert argv[argv.index("--context-parallel-size") + 1] == "2"


# ------------------------------------------------------------------ the CLI
runner = CliRunner()


def _plan_file(tmp_path: Path, plan: Plan, instance: str) -> str:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.model_copy(update={"instance": instance})
                               .model_dump(mode="json")))  # fmt: skip
    return str(path)


class _Fits:
    """What check_export reads of an evaluation that fits."""

    fits = True


def _without_cost_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's export path with the cost model's calls stubbed out (its pricing of
    context and expert parallelism is not this module's subject): the layout rules at
    plan loading and the memory check of check_export."""
    monkeypatch.setattr(megatron, "evaluate", lambda *_: _Fits())
    monkeypatch.setattr(options, "validate_layout", lambda *_: None)


def test_cli_exports_a_context_parallel_plan(tmp_path: Path, monkeypatch) -> None:
    _without_cost_model(monkeypatch)
    plan = make_plan(num_layers=24, dp=2, pp=2, tp=2, cp=2, micro_batch_size=1,
                     placement=_scattered_cp_plan().placement)  # fmt: skip
    launch = tmp_path / "launch"
    result = runner.invoke(app, ["export", _plan_file(tmp_path, plan, "gpt3-1.3b-g5-16"),
                                 "--megatron", "--hostfile", str(launch)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "--context-parallel-size 2" in result.output and "--cp-comm-type p2p" in result.output
    assert "--expert-model-parallel-size" not in result.output
    assert (
        (launch / "rank_map.csv")
        .read_text()
        .startswith("rank,host,local_gpu,stage,dp_rank,cp_rank,tp_rank\n")
    )
    assert (launch / "slurm_hostfile").read_text().splitlines() == [
        s.host for s in rank_map(INSTANCE, plan)
    ]


def _moe_plan_file(tmp_path: Path) -> str:
    inst = tmp_path / "mixtral.yaml"
    inst.write_text(json.dumps({
        "model": "mixtral-8x7b", "cluster": {"generator": {"kind": "g1", "nodes": 2, "seed": 0}},
        "training": {"global_batch_size": 16, "seq_length": 4096},
    }))  # fmt: skip
    return _plan_file(tmp_path, MIXTRAL_PLAN, str(inst))


def test_cli_exports_and_checks_a_moe_plan(tmp_path: Path, monkeypatch) -> None:
    _without_cost_model(monkeypatch)
    result = runner.invoke(app, ["export", _moe_plan_file(tmp_path), "--megatron"])
    assert result.exit_code == 0, result.output
    for text in ("--num-experts 8", "--expert-model-parallel-size 4", "--moe-router-topk 2",
                 "--context-parallel-size 2", "--moe-layer-freq 1", "# experts: 8 routed"):  # fmt: skip
        assert text in result.output, text
    # a plan the check refuses: MoE with tensor parallelism but no sequence parallelism
    broken = MIXTRAL_PLAN.model_copy(update={"sequence_parallel": False})
    path = _plan_file(tmp_path, broken, str(tmp_path / "mixtral.yaml"))
    result = runner.invoke(app, ["export", path, "--megatron"])
    assert result.exit_code == 2 and "exported --num-experts=8: with " in result.output
    assert "needs --sequence-parallel" in result.output and result.output.count("\n") == 1
    assert runner.invoke(app, ["export", path, "--megatron", "--no-check"]).exit_code == 0


def test_cli_export_of_a_moe_plan_today(tmp_path: Path) -> None:
    """Without stubs the CLI loads the plan through the cost model's layout rules: while
    they do not model experts that is a one-line refusal, afterwards the flags."""
    result = runner.invoke(app, ["export", _moe_plan_file(tmp_path), "--megatron"])
    if "not modelled" in result.output:
        assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
        return
    assert result.exit_code == 0, result.output
    assert "--num-experts 8" in result.output


def test_flex_dispatcher_names_its_deepep_backend() -> None:
    training = MIXTRAL.training.model_copy(update={"moe_token_dispatcher": "flex"})
    instance = MIXTRAL.model_copy(update={"training": training})
    given = _given(instance, MIXTRAL_PLAN)
    assert given["moe_token_dispatcher_type"] == "flex"
    assert given["moe_flex_dispatcher_backend"] == "deepep"
    check_flags(instance, MIXTRAL_PLAN)
