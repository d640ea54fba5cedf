"""Megatron-LM exports of hybrid Mamba-Transformer models (Nemotron-H 8B, Nemotron 3 Nano).

The flags of the bundled Nemotron models (``--hybrid-layer-pattern`` with one ``|``
segment per virtual stage instead of ``--num-layers`` and the split flags, the layer
specs, the Mamba widths, experts without ``--moe-layer-freq``), the ``export --check``
rules on them (:func:`pipette_cp.report.megatron.flags.check_flags`, no cost model),
hand-broken hybrid argument lists the check must refuse, and ``check_export`` with the
cost model.
"""

from __future__ import annotations

import shlex

import pytest

from pipette_cp.errors import LayoutError, SpecError, UnsupportedError
from pipette_cp.io.instance_file import instance_from_mapping
from pipette_cp.report.megatron.check import check_megatron_argv
from pipette_cp.report.megatron.flags import (
    check_export,
    check_flags,
    megatron_args,
    megatron_argv,
    megatron_notes,
    split_args,
)
from pipette_cp.report.megatron.hybrid_flags import STACK_SPEC, pipeline_pattern, train_script
from pipette_cp.specs import Instance, Plan
from pipette_cp.specs.layouts import make_plan

H8_PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
NANO_PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"


def _instance(model: str, nodes: int, *, gbs: int = 16, seq: int = 4096) -> Instance:
    return instance_from_mapping({
        "name": f"{model}-{nodes}", "model": model,
        "cluster": {"generator": {"kind": "g1", "nodes": nodes, "seed": 0}},
        "training": {"global_batch_size": gbs, "seq_length": seq, "dropout": False},
    })  # fmt: skip


H8 = _instance("nemotron-h-8b", 1)  # 8 A100s
NANO = _instance("nemotron-3-nano", 2)  # 16 A100s
H8_PLAN = make_plan(num_layers=52, dp=2, pp=2, tp=2, micro_batch_size=1, sequence_parallel=True)
NANO_PLAN = make_plan(num_layers=52, dp=2, pp=4, tp=2, ep=2, micro_batch_size=1,
                      sequence_parallel=True)  # fmt: skip


def _given(instance: Instance, plan: Plan) -> dict[str, object]:
    """dest -> value of the export, as Megatron's parser table reads it."""
    parsed = check_megatron_argv(megatron_argv(instance, plan))
    return {dest: value for dest, (_, value) in parsed.items()}


def _argv_without(argv: list[str], flag: str) -> list[str]:
    """``argv`` less ``flag`` and its value tokens."""
    out, skip = [], False
    for token in argv:
        if token.startswith("--"):
            skip = token == flag
        if not skip:
            out.append(token)
    return out


# ------------------------------------------------------------------ the flags
def test_nemotron_h_8b_flags() -> None:
    given = _given(H8, H8_PLAN)
    segments = given["hybrid_layer_pattern"].split("|")  # type: ignore[attr-defined]
    assert segments == [H8_PATTERN[:26], H8_PATTERN[26:]]  # one per stage, pp = 2
    expected = {
        "hidden_size": 4096, "ffn_hidden_size": 21504, "num_attention_heads": 32,
        "num_query_groups": 8, "squared_relu": True, "add_bias_linear": False,
        "normalization": "RMSNorm", "untie_embeddings_and_output_weights": True,
        "mamba_num_heads": 128, "spec": STACK_SPEC.split(),
    }  # fmt: skip
    assert {k: given[k] for k in expected} == expected
    # the pattern gives the layers; Megatron's defaults give the other Mamba widths
    for dest in ("num_layers", "mamba_head_dim", "mamba_state_dim", "mamba_num_groups",
                 "num_experts", "moe_layer_freq", "kv_channels", "swiglu"):  # fmt: skip
        assert dest not in given, dest
    check_flags(H8, H8_PLAN)


def test_nemotron_3_nano_flags_place_experts_by_the_pattern() -> None:
    given = _given(NANO, NANO_PLAN)
    assert given["hybrid_layer_pattern"].replace("|", "") == NANO_PATTERN  # type: ignore[attr-defined]
    assert given["hybrid_layer_pattern"].count("|") == 3  # type: ignore[attr-defined]
    expected = {
        "num_experts": 128, "moe_router_topk": 6, "moe_ffn_hidden_size": 1856,
        "moe_shared_expert_intermediate_size": 3712, "moe_router_enable_expert_bias": True,
        "moe_router_score_function": "sigmoid", "expert_model_parallel_size": 2,
        "num_query_groups": 2, "kv_channels": 128, "mamba_num_heads": 64,
    }  # fmt: skip
    assert {k: given[k] for k in expected} == expected
    assert "moe_layer_freq" not in given and "num_layers" not in given
    check_flags(NANO, NANO_PLAN)


def test_nemotron_3_super_latent_experts_and_mtp_block() -> None:
    instance = _instance("nemotron-3-super", 8, gbs=64)  # 64 A100s
    plan = make_plan(num_layers=88, dp=8, pp=8, tp=1, ep=8, micro_batch_size=1)
    given = _given(instance, plan)
    main, *mtp = given["hybrid_layer_pattern"].split("/")  # type: ignore[attr-defined]
    assert mtp == ["*E", "*E"] and main.count("|") == 7  # the block once per depth
    assert main.replace("|", "") == instance.model.hybrid_pattern
    assert (given["moe_latent_size"], given["mtp_num_layers"]) == (1024, 2)
    check_flags(instance, plan)


def test_pattern_is_quoted_for_the_shell() -> None:
    args = megatron_args(H8, H8_PLAN)
    (pattern_arg,) = [a for a in args if a.startswith("--hybrid-layer-pattern ")]
    assert shlex.split(pattern_arg)[1] == f"{H8_PATTERN[:26]}|{H8_PATTERN[26:]}"
    assert split_args(H8, H8_PLAN) == [pattern_arg]


def test_uneven_interleaved_split_is_one_segment_per_virtual_stage() -> None:
    # chunk c of stage s is segment c * pp + s, Megatron's select_pipeline_segment order
    split = (12, 14, 13, 13)
    plan = make_plan(num_layers=52, dp=2, pp=2, tp=2, vpp=2, micro_batch_size=1,
                     sequence_parallel=True).model_copy(update={"layer_split": split})  # fmt: skip
    pattern = pipeline_pattern(H8.model, plan)
    assert [len(s) for s in pattern.split("|")] == list(split)
    assert pattern.replace("|", "") == H8_PATTERN
    given = _given(H8, plan)
    for dest in ("num_virtual_stages_per_pipeline_rank", "pipeline_model_parallel_layout",
                 "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"):  # fmt: skip
        assert dest not in given, dest
    check_flags(H8, plan)


def test_one_stage_has_no_segments() -> None:
    plan = make_plan(num_layers=52, dp=8, pp=1, tp=1, micro_batch_size=1)
    assert _given(H8, plan)["hybrid_layer_pattern"] == H8_PATTERN


def test_empty_virtual_stage_is_refused() -> None:
    plan = H8_PLAN.model_copy(update={"layer_split": (52, 0)})
    with pytest.raises(LayoutError, match="stage 1 has no transformer layers"):
        megatron_args(H8, plan)


def test_non_default_mamba_widths_are_given() -> None:
    wide = H8.model.model_copy(update={"mamba_head_dim": 80, "mamba_num_heads": 64,
                                       "mamba_state_dim": 256})  # fmt: skip
    given = _given(H8.model_copy(update={"model": wide}), H8_PLAN)
    assert (given["mamba_head_dim"], given["mamba_state_dim"], given["mamba_num_heads"]) == (80, 256, 64)  # fmt: skip
    assert "mamba_num_groups" not in given


def test_mamba_convolution_other_than_four_taps_is_refused() -> None:
    model = H8.model.model_copy(update={"mamba_conv_kernel": 3})
    with pytest.raises(UnsupportedError, match=r"^model.mamba_conv_kernel=3: .*d_conv of 4"):
        megatron_args(H8.model_copy(update={"model": model}), H8_PLAN)


def test_notes_name_the_hybrid_script() -> None:
    notes = " ".join(megatron_notes(H8, H8_PLAN))
    assert "pretrain_hybrid.py" in notes and "pretrain_mamba.py" in notes
    # Nemotron-H's attention has no position embedding: a flag, not a note
    assert "--position-embedding-type" not in notes
    assert "--position-embedding-type none" in megatron_args(H8, H8_PLAN)
    assert "--num-layers-per-virtual-pipeline-stage" not in notes
    assert train_script(H8.model) == "pretrain_hybrid.py"
    assert train_script(_instance("llama-2-7b", 1).model) == "pretrain_gpt.py"


# ------------------------------------------------------------------ the check
@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda a: [*a, "--num-virtual-stages-per-pipeline-rank", "2"],
         "--num-virtual-stages-per-pipeline-rank=2: cannot be combined with '|' segments"),
        (lambda a: [*a, "--num-layers", "50"], "--num-layers=50: --hybrid-layer-pattern has 52 layers"),
        (lambda a: [*_argv_without(a, "--hybrid-layer-pattern"), "--hybrid-layer-pattern", "M-|M*|M-"],
         "--hybrid-layer-pattern='M-|M*|M-': has 3 pipeline segments ('|'), not a multiple of"),
        (lambda a: [*_argv_without(a, "--hybrid-layer-pattern"), "--hybrid-layer-pattern", "ME|ME"],
         "--hybrid-layer-pattern='ME|ME': has mixture-of-experts layers (E): needs --num-experts"),
        (lambda a: [*_argv_without(a, "--hybrid-layer-pattern"), "--hybrid-layer-pattern", "M*|M-/*-", "--mtp-num-layers", "2"],
         "--mtp-num-layers=2: --hybrid-layer-pattern has 1 depths after '/'"),
        (lambda a: [*a, "--mamba-num-groups", "3"],
         "--mamba-num-groups=3: must be divisible by --tensor-model-parallel-size 2"),
    ],
)  # fmt: skip
def test_check_refuses_broken_hybrid_argv(edit, message: str) -> None:  # type: ignore[no-untyped-def]
    argv = edit(megatron_argv(H8, H8_PLAN))
    with pytest.raises(SpecError) as err:
        check_megatron_argv(argv)
    assert str(err.value).startswith(message), str(err.value)


# ------------------------------------------------------------------ with the cost model
@pytest.mark.parametrize(
    ("instance", "plan"), [(H8, H8_PLAN), (NANO, NANO_PLAN)], ids=["8b", "nano"]
)
def test_check_export(instance: Instance, plan: Plan) -> None:
    check_export(instance, plan)


def test_launch_files_run_the_hybrid_script(tmp_path) -> None:
    from pipette_cp.report.launch import write_launch_files

    paths = {p.name: p for p in write_launch_files(H8, H8_PLAN, tmp_path)}
    wrapper = paths["rank_wrapper.sh"].read_text()
    assert '"${PIPETTE_CP_TRAIN_SCRIPT:-pretrain_hybrid.py}"' in wrapper
    assert "pretrain_gpt.py" not in "".join(p.read_text() for p in paths.values())
    assert any(
        "PIPETTE_CP_TRAIN_SCRIPT=pretrain_mamba.py" in n for n in megatron_notes(H8, H8_PLAN)
    )
