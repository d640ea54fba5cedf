"""Launch outputs: Megatron arguments and rank orders that realise a plan's placement."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from pipette_cp.cli import app
from pipette_cp.errors import LayoutError, SpecError, UnsupportedError
from pipette_cp.io.instance_file import list_instances, load_instance
from pipette_cp.io.model_file import load_model
from pipette_cp.report.launch import rank_map, torchrun_layout, write_launch_files
from pipette_cp.report.megatron.check import argument_table, check_megatron_argv
from pipette_cp.report.megatron.flags import (
    before_blackwell,
    check_export,
    megatron_args,
    megatron_argv,
    megatron_environment,
    megatron_notes,
    split_args,
)
from pipette_cp.specs import Instance, Plan
from pipette_cp.specs.layouts import make_plan
from tests.conftest import small_instance


def megatron_units(slots, names, g: int, dp: int, pp: int, tp: int) -> tuple[tuple[int, ...], ...]:
    """Megatron's groups re-derived independently from a rank -> (host, GPU) list: the tp
    group of (stage s, replica d) is ranks s*dp*tp + d*tp + [0, tp) (order tp-dp-pp)."""
    gpu_of_rank = {slot.rank: names.index(slot.host) * g + slot.local_gpu for slot in slots}
    units = []
    for s in range(pp):
        for d in range(dp):
            base = (s * dp + d) * tp
            units.append(tuple(gpu_of_rank[base + t] for t in range(tp)))
    return tuple(units)


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from([(2, 2, 2), (4, 2, 1), (1, 4, 2), (2, 1, 4), (8, 1, 1)]), st.integers(0, 10_000)
)
def test_rank_map_realises_any_placement(degrees: tuple[int, int, int], seed: int) -> None:
    dp, pp, tp = degrees
    instance = small_instance(nodes=4, gpus_per_node=4, global_batch_size=64)
    rng = random.Random(seed)
    slots_per_node = [list(range(n * 4, n * 4 + 4, tp)) for n in range(4)]
    blocks = [b for node in slots_per_node for b in node]
    rng.shuffle(blocks)
    units = tuple(tuple(range(b, b + tp)) for b in blocks[: dp * pp])
    plan = make_plan(num_layers=8, dp=dp, pp=pp, tp=tp, micro_batch_size=1, placement=units)
    slots = rank_map(instance, plan)
    names = instance.cluster.node_names
    assert megatron_units(slots, names, 4, dp, pp, tp) == plan.placement
    assert [s.rank for s in slots] == list(range(dp * pp * tp))


def test_torchrun_only_when_node_ranks_are_consecutive(tmp_path) -> None:
    instance = small_instance(nodes=2, gpus_per_node=4)
    default = make_plan(num_layers=8, dp=2, pp=2, tp=2, micro_batch_size=1)
    layout = torchrun_layout(rank_map(instance, default))
    assert layout == [("node000", [0, 1, 2, 3]), ("node001", [0, 1, 2, 3])]
    # stage 0 replicas on different nodes: node 0 holds ranks 0-1 and 4-5, not consecutive
    mixed = make_plan(
        num_layers=8,
        dp=2,
        pp=2,
        tp=2,
        micro_batch_size=1,
        placement=((0, 1), (4, 5), (2, 3), (6, 7)),
    )
    assert torchrun_layout(rank_map(instance, mixed)) is None
    paths = write_launch_files(instance, mixed, tmp_path, megatron_args(instance, mixed))
    assert {p.name for p in paths} == {
        "rank_map.csv", "rankfile", "slurm_hostfile", "rank_wrapper.sh",
        "launch_slurm.sh", "launch_mpirun.sh", "launch_torchrun.sh", "torchrun.txt",
    }  # fmt: skip
    assert "cannot realise" in (tmp_path / "torchrun.txt").read_text()
    # Open MPI's sequential mapper: host lines only, line R = rank R (no CPU slot= claims)
    hosts = [x for x in (tmp_path / "rankfile").read_text().splitlines() if not x.startswith("#")]
    assert hosts == [s.host for s in rank_map(instance, mixed)]
    assert hosts[2] == "node001" and "slot=" not in (tmp_path / "rankfile").read_text()
    assert (tmp_path / "slurm_hostfile").read_text().splitlines() == hosts
    assert all(os.access(tmp_path / n, os.X_OK) for n in ("rank_wrapper.sh", "launch_mpirun.sh"))
    usage = next(
        x for x in (tmp_path / "launch_slurm.sh").read_text().splitlines() if "sbatch" in x
    )
    for option in ("--nodes=2", "--nodelist=node000,node001", "--ntasks=8", "--gpus-per-node=4"):
        assert option in usage


def test_torchrun_commands_are_complete(tmp_path) -> None:
    instance = small_instance(nodes=2, gpus_per_node=4)
    plan = make_plan(num_layers=8, dp=2, pp=2, tp=2, micro_batch_size=1)
    write_launch_files(instance, plan, tmp_path)
    text = (tmp_path / "torchrun.txt").read_text()
    for k, host in enumerate(("node000", "node001")):
        command = next(x for x in text.splitlines() if x.startswith(f"{host}: "))
        for option in ("--nnodes=2", "--nproc-per-node=4", f"--node-rank={k}",
                       "--master-addr=node000", "--master-port=6000", "--no-python"):  # fmt: skip
            assert option in command, command


@pytest.mark.parametrize("name", ["node\n1", "$(touch x)", "a b", "-lead", "a..b", "x" * 64])
def test_launch_files_refuse_unsafe_host_names(name: str, tmp_path) -> None:
    instance = small_instance(nodes=2, gpus_per_node=4)
    names = ("node000", name)
    bad = instance.model_copy(
        update={"cluster": instance.cluster.model_copy(update={"node_names": names})}
    )
    plan = make_plan(num_layers=8, dp=2, pp=2, tp=2, micro_batch_size=1)
    with pytest.raises(SpecError) as err:
        write_launch_files(bad, plan, tmp_path)
    message = str(err.value)
    assert message.startswith("cluster.node_names[1]=") and "RFC 1123" in message
    assert "\n" not in message and not list(tmp_path.iterdir())


def _plan(split: tuple[int, ...], pp: int, vpp: int = 1) -> Plan:
    return make_plan(
        num_layers=sum(split), dp=1, pp=pp, tp=1, micro_batch_size=1, vpp=vpp, layer_split=split
    )


@pytest.mark.parametrize(
    ("split", "pp", "vpp", "expected"),
    [
        ((2, 2, 2, 2), 4, 1, []),
        (
            (1, 3, 3, 1),
            4,
            1,
            ["--decoder-first-pipeline-num-layers 1", "--decoder-last-pipeline-num-layers 1"],
        ),
        ((1, 3, 3, 3), 4, 1, ["--decoder-first-pipeline-num-layers 1"]),
        (
            (3, 2, 1, 2),
            4,
            1,
            ["--pipeline-model-parallel-layout 'Et*3|t*2|t|t*2L'"],
        ),
    ],
)
def test_split_args(split: tuple[int, ...], pp: int, vpp: int, expected: list[str]) -> None:
    instance = small_instance(layers=sum(split))
    assert split_args(instance, _plan(split, pp, vpp)) == expected


def test_megatron_args_cover_every_knob() -> None:
    instance = small_instance()
    plan = make_plan(
        num_layers=8, dp=2, pp=2, tp=2, micro_batch_size=2, vpp=2, sequence_parallel=True,
        recompute="full", distributed_optimizer=True,
    )  # fmt: skip
    args = megatron_args(instance, plan)
    for flag in (
        "--tensor-model-parallel-size 2", "--pipeline-model-parallel-size 2", "--micro-batch-size 2",
        "--global-batch-size 16", "--num-virtual-stages-per-pipeline-rank 2", "--sequence-parallel",
        "--recompute-granularity full", "--use-distributed-optimizer", "--num-layers 8", "--bf16",
    ):  # fmt: skip
        assert flag in args


def test_plots_write_pngs(tmp_path) -> None:
    from pipette_cp.cost.evaluator.evaluate import simulate
    from pipette_cp.report.plots import placement_figure, timeline_figure

    instance = small_instance(nodes=2, gpus_per_node=4)
    plan = make_plan(num_layers=8, dp=2, pp=2, tp=2, micro_batch_size=1, vpp=2)
    timeline = simulate(instance, plan)
    timeline_figure(timeline).savefig(tmp_path / "t.png")
    placement_figure(instance, plan).savefig(tmp_path / "p.png")
    assert (tmp_path / "t.png").stat().st_size > 10_000 and (
        tmp_path / "p.png"
    ).stat().st_size > 10_000
    kinds = {op.kind for op in timeline.ops}
    assert {"forward", "backward", "send"} <= kinds


# ------------------------------------------------------- split flags and the interleaving
def _flags(args: list[str]) -> list[str]:
    return [a.split(" ", 1)[0] for a in args]


@pytest.mark.parametrize(
    ("split", "vpp", "virtual", "older"),
    [
        ((2, 2, 2, 2), 2, "--num-virtual-stages-per-pipeline-rank", True),
        ((1, 3, 1, 3), 2, "--num-virtual-stages-per-pipeline-rank", False),  # first/last flags
        ((1, 2, 3, 2), 2, "--pipeline-model-parallel-layout", False),
    ],
)
def test_interleaving_is_given_exactly_once(split, vpp, virtual, older) -> None:
    instance = small_instance()
    plan = make_plan(num_layers=8, dp=4, pp=2, tp=1, micro_batch_size=1, vpp=vpp,
                     layer_split=split)  # fmt: skip
    flags = _flags(megatron_args(instance, plan))
    three = {"--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
             "--pipeline-model-parallel-layout"}  # fmt: skip
    assert [f for f in flags if f in three] == [virtual]
    notes = " ".join(megatron_notes(instance, plan))
    # the older flag builds an even split: suggested only when the split is even
    assert ("--num-layers-per-virtual-pipeline-stage 2" in notes) == older
    check_megatron_argv(megatron_argv(instance, plan), megatron_environment(instance, plan))


def test_empty_stage_is_refused() -> None:
    instance = small_instance()
    plan = make_plan(num_layers=8, dp=2, pp=4, tp=1, micro_batch_size=1, layer_split=(0, 3, 3, 2))
    with pytest.raises(LayoutError, match=r"layer_split=\(0, 3, 3, 2\): stage 0 has no"):
        megatron_args(instance, plan)
    interleaved = make_plan(num_layers=8, dp=4, pp=2, tp=1, micro_batch_size=1, vpp=2,
                            layer_split=(3, 3, 2, 0))  # fmt: skip
    with pytest.raises(LayoutError, match="chunk 1 of stage 1 has no transformer layers"):
        check_export(instance, interleaved)


# ------------------------------------------------------------------ the model flags
def _with_model(name: str, **training: object) -> Instance:
    inst = load_instance("llama-3-8b-g2-64")
    return inst.model_copy(update={
        "model": load_model(name),
        "training": inst.training.model_copy(update=training),
    })  # fmt: skip


def _value(args: list[str], flag: str) -> str | None:
    return next((a.split(" ", 1)[1] for a in args if a.split(" ", 1)[0] == flag), None)


def test_model_flags_reproduce_llama_3() -> None:
    plan = make_plan(num_layers=32, dp=32, pp=1, tp=2, micro_batch_size=1, sequence_parallel=True)
    args = megatron_args(_with_model("llama-3-8b"), plan)
    for flag in ("--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
                 "--group-query-attention", "--bf16"):  # fmt: skip
        assert flag in args
    expected = {
        "--rotary-base": "500000", "--normalization": "RMSNorm", "--norm-epsilon": "1e-05",
        "--num-query-groups": "8", "--position-embedding-type": "rope",
        "--attention-dropout": "0.0", "--hidden-dropout": "0.0", "--ffn-hidden-size": "14336",
    }  # fmt: skip
    assert {f: _value(args, f) for f in expected} == expected
    assert "--use-rope-scaling" not in args and "--add-qkv-bias" not in args
    notes = " ".join(megatron_notes(_with_model("llama-3-8b"), plan))
    assert "128256 tokens" in notes and "--vocab-size 128255" in notes
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1" in notes


def test_model_flags_llama_31_rope_scaling_and_qwen2_qkv_bias() -> None:
    plan = make_plan(num_layers=126, dp=1, pp=63, tp=1, micro_batch_size=1)
    big = megatron_args(_with_model("llama-3.1-405b"), plan)
    assert "--use-rope-scaling" in big and _value(big, "--rope-scaling-factor") == "8.0"
    qwen = megatron_args(_with_model("qwen2-7b"), make_plan(num_layers=28, dp=64, pp=1, tp=1,
                                                            micro_batch_size=1))  # fmt: skip
    assert {"--disable-bias-linear", "--add-qkv-bias"} <= set(qwen)
    assert (_value(qwen, "--rotary-base"), _value(qwen, "--norm-epsilon")) == ("1000000", "1e-06")
    neox = megatron_args(_with_model("gpt-neox-20b"), make_plan(num_layers=44, dp=64, pp=1, tp=1,
                                                                micro_batch_size=1))  # fmt: skip
    assert _value(neox, "--rotary-percent") == "0.25" and "--disable-bias-linear" not in neox


def test_dropout_follows_training_dropout() -> None:
    plan = make_plan(num_layers=24, dp=8, pp=1, tp=1, micro_batch_size=1)
    on = megatron_args(_with_model("gpt3-1.3b"), plan)
    assert (_value(on, "--attention-dropout"), _value(on, "--hidden-dropout")) == ("0.1", "0.1")
    off = megatron_args(_with_model("gpt3-1.3b", dropout=False), plan)
    assert (_value(off, "--attention-dropout"), _value(off, "--hidden-dropout")) == ("0.0", "0.0")
    llama = _with_model("llama-2-7b")  # no dropout in the model, masks counted by the memory model
    plan32 = make_plan(num_layers=32, dp=8, pp=1, tp=1, micro_batch_size=1)
    assert "training.dropout is on" in " ".join(megatron_notes(llama, plan32))


def test_alibi_is_refused() -> None:
    plan = make_plan(num_layers=70, dp=4, pp=1, tp=8, micro_batch_size=1)
    with pytest.raises(UnsupportedError, match="position_embedding='alibi'"):
        megatron_args(load_instance("bloom-176b-g3-384"), plan)


def test_sequence_parallel_and_tp_overlap_only_with_tp() -> None:
    instance = small_instance()
    overlap = instance.model_copy(
        update={"training": instance.training.model_copy(update={"tp_comm_overlap": True})}
    )
    tp1 = make_plan(num_layers=8, dp=8, pp=1, tp=1, micro_batch_size=1, sequence_parallel=True)
    assert "--sequence-parallel" not in megatron_args(instance, tp1)
    assert "left out" in " ".join(megatron_notes(instance, tp1))
    no_sp = make_plan(num_layers=8, dp=4, pp=1, tp=2, micro_batch_size=1)
    assert "--tp-comm-overlap" not in megatron_args(overlap, no_sp)
    sp = no_sp.model_copy(update={"sequence_parallel": True})
    assert "--tp-comm-overlap" in megatron_args(overlap, sp)


def test_environment_rule() -> None:
    instance = small_instance()
    tp2 = make_plan(num_layers=8, dp=4, pp=1, tp=2, micro_batch_size=1)
    fsdp = make_plan(num_layers=8, dp=4, pp=1, tp=2, micro_batch_size=1,
                     dp_sharding="optim_grads_params")  # fmt: skip
    assert megatron_environment(instance, tp2) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert megatron_environment(instance, fsdp) == {"CUDA_DEVICE_MAX_CONNECTIONS": None}
    blackwell = small_instance(gpu={"name": "B200", "memory_bytes": 192e9, "peak_flops_per_s": 2e15,
                                    "hbm_bandwidth_bytes_per_s": 8e12,
                                    "nvlink_bandwidth_bytes_per_s": 9e11})  # fmt: skip
    assert not before_blackwell(blackwell) and megatron_environment(blackwell, tp2) == {}
    assert before_blackwell(instance)


# ------------------------------------------------------------------ the argument table
def test_table_is_megatrons_parser() -> None:
    table = argument_table()
    assert len(table) == 877
    assert table["--norm-epsilon"].dest == "layernorm_epsilon"
    assert table["--disable-bias-linear"].store_false and table["--disable-bias-linear"].switch
    assert table["--no-align-grad-reduce"].dest == table["--disable-align-grad-reduce"].dest


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--num-layer", "8"], "'--num-layer': not an option"),
        (["num-layers"], "expected an option"),
        (["--num-layers", "eight"], "--num-layers='eight': expected an int"),
        (["--num-layers"], "--num-layers=None: expects one value"),
        (["--swiglu", "yes"], "--swiglu='yes': is a switch"),
        (["--swiglu=1"], "--swiglu='1': is a switch"),
        (["--normalization", "rmsnorm"], "expected one of LayerNorm, RMSNorm"),
        (["--attention-backend", "flash2"], "expected one of auto, flash, fused, local, unfused"),
        (["--num-layers", "8", "--num-layers=9"], "given twice"),
        (["--num-virtual-stages-per-pipeline-rank", "2", "--pipeline-model-parallel-layout",
          "Et|t|t|tL"], "--pipeline-model-parallel-layout='Et|t|t|tL': cannot be combined"),
        (["--num-layers-per-virtual-pipeline-stage", "1", "--num-virtual-stages-per-pipeline-rank",
          "2"], "cannot be combined with --num-layers-per-virtual-pipeline-stage"),
        (["--pipeline-model-parallel-layout", "Et|tL", "--decoder-last-pipeline-num-layers", "1"],
         "--decoder-last-pipeline-num-layers=1: cannot be combined"),
        (["--sequence-parallel"], "--sequence-parallel=True: needs --tensor-model-parallel-size"),
        (["--tensor-model-parallel-size", "2", "--tp-comm-overlap"], "needs --sequence-parallel"),
    ],
)  # fmt: skip
def test_checker_rejects(argv: list[str], message: str) -> None:
    with pytest.raises(SpecError) as err:
        check_megatron_argv(argv)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("argv", "env", "ok"),
    [
        (["--tensor-model-parallel-size", "2"], {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, True),
        (["--tensor-model-parallel-size", "2"], {}, False),
        (["--tensor-model-parallel-size", "2"], {"CUDA_DEVICE_MAX_CONNECTIONS": "8"}, False),
        (["--context-parallel-size", "2"], {"CUDA_DEVICE_MAX_CONNECTIONS": None}, False),
        (["--tensor-model-parallel-size", "1"], {}, True),
        (["--tensor-model-parallel-size", "2", "--use-megatron-fsdp"],
         {"CUDA_DEVICE_MAX_CONNECTIONS": None}, True),
        (["--tensor-model-parallel-size", "2", "--use-megatron-fsdp"],
         {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, False),
        (["--use-megatron-fsdp"], {}, False),
        (["--data-path", "a b", "c", "--split", "99,1,0", "--exit-signal", "15"], {}, True),
    ],
)  # fmt: skip
def test_checker_environment_rule(argv: list[str], env: dict, ok: bool) -> None:
    if ok:
        check_megatron_argv(argv, env)
    else:
        with pytest.raises(SpecError, match="CUDA_DEVICE_MAX_CONNECTIONS="):
            check_megatron_argv(argv, env)
    if "--use-megatron-fsdp" not in argv:  # on Blackwell only FSDP has a rule
        check_megatron_argv(argv, env, before_blackwell=False)


def _plan_from_label(instance: Instance, label: str) -> Plan:
    """A plan from a layout label (Plan.layout()), even split, Megatron's placement."""
    knobs: dict[str, object] = {}
    degrees: dict[str, int] = {}
    sharding = {"do": "optim", "zero2": "optim_grads", "zero3": "optim_grads_params"}
    for part in (
        label.replace("fused-softmax", "fused_softmax").replace("sdpa-math", "sdpa_math").split("-")
    ):
        head = part.rstrip("0123456789")
        if head in ("dp", "pp", "tp", "mb", "vpp", "hsdp") and part[len(head) :]:
            degrees[head] = int(part[len(head) :])
        elif part in ("sel", "full"):
            knobs["recompute"] = {"sel": "selective", "full": "full"}[part]
        elif part in sharding:
            knobs["dp_sharding"] = sharding[part]
        elif part in ("sp", "nofa", "nofusednorm"):
            knobs[{"sp": "sequence_parallel", "nofa": "flash_attention",
                   "nofusednorm": "fused_norm"}[part]] = part == "sp"  # fmt: skip
        else:
            knobs["attention_kernel"] = part.replace("_", "-")
    if "hsdp" in degrees:
        knobs["dp_shard_size"] = degrees["hsdp"]
    return make_plan(num_layers=instance.model.num_layers, dp=degrees["dp"], pp=degrees["pp"],
                     tp=degrees["tp"], micro_batch_size=degrees["mb"], vpp=degrees.get("vpp", 1),
                     **knobs)  # type: ignore[arg-type]  # fmt: skip


@pytest.mark.parametrize("name", list_instances())
def test_every_bundled_best_plan_exports_flags_megatron_accepts(name: str) -> None:
    instance = load_instance(name)
    if instance.best_known is None or not instance.best_known.layout:
        pytest.skip("no best-known layout")
    plan = _plan_from_label(instance, instance.best_known.layout)
    assert plan.layout() == instance.best_known.layout
    if instance.model.position_embedding == "alibi":
        with pytest.raises(UnsupportedError, match="alibi"):
            megatron_argv(instance, plan)
        return
    given = check_megatron_argv(
        megatron_argv(instance, plan),
        megatron_environment(instance, plan),
        before_blackwell=before_blackwell(instance),
    )
    assert given["num_layers"][1] == instance.model.num_layers
    assert given["tensor_model_parallel_size"][1] == plan.tp


# ------------------------------------------------------------------ the CLI
runner = CliRunner()


def _plan_file(tmp_path: Path, plan: Plan, instance: str = "gpt3-1.3b-nominal-8") -> str:
    path = tmp_path / "plan.json"
    path.write_text(
        json.dumps(plan.model_copy(update={"instance": instance}).model_dump(mode="json"))
    )
    return str(path)


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        (make_plan(num_layers=24, dp=8, pp=1, tp=1, micro_batch_size=64),
         "plan='dp8-pp1-tp1-mb64': does not fit in memory: stage 0 needs"),
        (make_plan(num_layers=24, dp=2, pp=4, tp=1, micro_batch_size=1, layer_split=(0, 8, 8, 8)),
         "plan.layer_split=(0, 8, 8, 8): stage 0 has no transformer layers"),
    ],
)  # fmt: skip
def test_cli_export_refuses_unfit_and_empty_plans(plan: Plan, message: str, tmp_path) -> None:
    result = runner.invoke(app, ["export", _plan_file(tmp_path, plan), "--hostfile",
                                 str(tmp_path / "launch")])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and message in result.output, result.output
    assert not (tmp_path / "launch").exists()


def test_cli_export_checks_by_default(tmp_path) -> None:
    plan = make_plan(num_layers=24, dp=2, pp=4, tp=1, micro_batch_size=1, vpp=2,
                     layer_split=(3, 3, 4, 2, 4, 4, 3, 1))  # fmt: skip
    for extra in ([], ["--no-check"]):
        result = runner.invoke(app, ["export", _plan_file(tmp_path, plan), "--megatron", *extra])
        assert result.exit_code == 0, result.output
        assert "--pipeline-model-parallel-layout 'Et*3|t*3|t*4|t*2|t*4|t*4|t*3|tL'" in result.output
        assert "--num-virtual-stages-per-pipeline-rank" not in result.output
