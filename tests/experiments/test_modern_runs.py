"""The 2024-2026 runs (``modern_runs.csv``): every row built or skipped naming a field, the
split, the report, and the representable rows pinned."""

from __future__ import annotations

import csv
import math
import random
import re
from collections import Counter
from pathlib import Path

import pytest

from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.cost.stack import calibration as calib
from pipette_cp.experiments.models.calibration_split import (
    FIT,
    HELD_OUT,
    assign_modern_split,
    modern_family,
    modern_sweep_key,
)
from pipette_cp.experiments.models.modern_runs import metrics
from pipette_cp.experiments.models.modern_runs.build import (
    MAX_GPUS,
    SHAPE_COLUMNS,
    bridge_fp8_param_gather,
    is_bridge,
    row_model,
    row_recompute,
    row_setup,
)
from pipette_cp.experiments.models.modern_runs.evaluate import ModernResult, ModernSkipped, run
from pipette_cp.experiments.models.modern_runs.features import (
    BUNDLED,
    MLPERF_LORA,
    MODERN_CSV,
    READ_COLUMNS,
    Skip,
    model_key,
    read_modern_rows,
)
from pipette_cp.experiments.models.modern_runs.fit import HALF_SATURATION, fit_blackwell, fit_rows
from pipette_cp.experiments.models.modern_runs.report import format_report, main
from pipette_cp.io.model_file import load_model
from pipette_cp.specs.gpu import resolve_gpu

#: Rows, and those representable today; a change that makes more rows representable
#: updates these deliberately.
ROWS = 143
REPRESENTABLE = 138
#: Skipped rows by their first reason.
SKIP_REASONS = {
    "tp/pp/cp: layout not stated": 3,
    "model_name=Nemotron_3_Ultra: no public configuration of the model": 2,
}
#: Rows per side of the split.
SIDES = {FIT: 92, HELD_OUT: 51}


@pytest.fixture(scope="module")
def rows() -> list[dict[str, str]]:
    return read_modern_rows()


@pytest.fixture(scope="module")
def report() -> tuple[list[ModernResult], list[ModernSkipped]]:
    return run()


def test_the_copy_carries_every_column_the_loader_reads(rows: list[dict[str, str]]) -> None:
    with open(MODERN_CSV, newline="", encoding="utf-8") as handle:
        header = next(csv.reader(handle))
    assert len(header) == len(set(header))
    assert set(READ_COLUMNS) <= set(header), set(READ_COLUMNS) - set(header)
    assert len(rows) == ROWS and all(list(r) == header for r in rows)
    assert len({r["row_id"] for r in rows}) == ROWS


def test_every_row_builds_a_plan_of_its_layout_or_is_skipped_naming_a_field(
    rows: list[dict[str, str]],
) -> None:
    for row in rows:
        try:
            st = row_setup(row)
        except Skip as reason:
            field = re.match(r"([a-z_0-9]+)[=/ :]", str(reason))
            assert field and field.group(1) in row, (row["row_id"], str(reason))
            continue
        plan = st.plan
        degrees = (plan.tp, plan.pp, plan.cp, plan.vpp, plan.micro_batch_size)
        stated = tuple(int(row[c] or 1) for c in ("tp", "pp", "cp", "vp", "micro_batch"))
        assert degrees == stated, row["row_id"]
        assert plan.ep == int(row["ep"] or 1) and plan.num_gpus <= MAX_GPUS
        assert plan.num_gpus * st.dp_scale == pytest.approx(int(row["num_gpus"]))
        assert sum(plan.layer_split) == st.instance.model.num_layers
        ev = Evaluator(st.instance).evaluate(plan)
        assert math.isfinite(ev.iteration_time_s) and ev.iteration_time_s > 0
        assert st.measured_step_s > 0 and st.measured_tokens_per_gpu > 0


def test_the_bundled_models_agree_with_the_shapes_the_rows_state(
    rows: list[dict[str, str]],
) -> None:
    """Only the MLPerf Llama 3.1 405B benchmark's vocabulary (32,256) differs."""
    differ = set()
    for row in rows:
        if (key := model_key(row)) in BUNDLED:
            bundled = load_model(BUNDLED[key])
            for column, field in SHAPE_COLUMNS.items():
                if row[column] and int(row[column]) != getattr(bundled, field):
                    differ.add((key, column, row[column]))
            if row["kind"] == "pretrain":
                assert row_model(row).vocab_size == int(row["vocab_size"] or bundled.vocab_size)
    assert differ == {("llama31405b", "vocab_size", "32256")}


def test_representable_rows_and_skip_reasons_are_pinned(
    report: tuple[list[ModernResult], list[ModernSkipped]],
) -> None:
    results, skipped = report
    assert len(results) == REPRESENTABLE and len(results) + len(skipped) == ROWS
    assert dict(metrics.reasons(skipped)) == SKIP_REASONS


def test_the_split_is_deterministic_whole_sweeps_and_both_sides_per_family(
    rows: list[dict[str, str]],
) -> None:
    sides = assign_modern_split(rows)
    order = list(range(len(rows)))
    random.Random(7).shuffle(order)
    shuffled = assign_modern_split([rows[i] for i in order])
    assert [shuffled[order.index(i)] for i in range(len(rows))] == sides
    assert dict(Counter(sides)) == SIDES
    by_sweep: dict[str, set[str]] = {}
    by_family: dict[str, set[str]] = {}
    for row, side in zip(rows, sides, strict=True):
        by_sweep.setdefault(modern_sweep_key(row), set()).add(side)
        by_family.setdefault(modern_family(row), set()).add(side)
    assert all(len(s) == 1 for s in by_sweep.values())
    assert all(s == {FIT, HELD_OUT} for s in by_family.values()), by_family


def test_the_report_runs_on_a_few_rows() -> None:
    ids = {"r0004", "r0025", "r0082", "r0117", "r0356", "r0357", "r0029"}
    results, skipped = run(row_ids=ids)
    assert {r.info.row_id for r in results} | {s.info.row_id for s in skipped} == ids
    text = format_report(results, skipped)
    for part in ("== coverage", "MAPE", "not to fit", "matched precision pairs",
                 "measured best", "layout not stated"):  # fmt: skip
        assert part in text
    scored, _ = metrics.pairs(results, skipped)
    assert [(p.base.info.row_id, p.to.info.row_id) for p in scored] == [("r0356", "r0357")]
    assert not any(r.info.row_id == "r0082" for r in metrics.counted(results))  # a duplicate


def test_main_writes_the_csv_and_the_plot(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("matplotlib")
    out_csv, out_png = tmp_path / "modern.csv", tmp_path / "modern.png"
    assert main(["--csv", str(out_csv), "--plot", str(out_png)]) == 0
    assert "representable" in capsys.readouterr().out
    with open(out_csv, newline="", encoding="utf-8") as handle:
        lines = list(csv.DictReader(handle))
    assert len(lines) == ROWS
    assert sum(line["outcome"].startswith("skipped") for line in lines) == ROWS - REPRESENTABLE
    assert out_png.stat().st_size > 0


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        ("", ("none", None)),
        ("none", ("none", None)),
        ('recipe at HEAD: granularity unset, modules ["mla_up_proj"]', ("none", None)),
        ('recipe at HEAD: granularity None, modules unset', ("none", None)),
        ('recipe at HEAD: granularity "selective", modules []', ("none", None)),
        ('recipe at HEAD: granularity "selective", modules ["layernorm", "moe_act"]',
         ("selective", ("layernorm", "moe_act"))),
        ("selective modules 'mlp' (RECOMPUTE_MODULES=mlp)", ("selective", ("mlp",))),
        ('recipe at HEAD: granularity "full", modules unset', ("full", None)),
    ],
)  # fmt: skip
def test_the_rows_recomputation_is_read_as_megatron_runs_it(cell: str, expected: tuple) -> None:
    """Megatron-Core recomputes the listed modules only under selective granularity."""
    assert (
        row_recompute({"recompute": cell, "source_repo": "mlcommons/training_results_v5.1"})
        == expected
    )


def test_megatron_bridge_rows_get_its_performance_scripts_settings(
    rows: list[dict[str, str]],
) -> None:
    """Megatron-Bridge's performance scripts set selective granularity with the workload's
    modules, bf16 gradient reduction, and FP8 primary weights with the delayed,
    tensorwise and MXFP8 presets (not blockwise, not under Megatron-FSDP); an MLPerf row
    keeps what it states."""
    bridge = {"recompute": 'recipe at HEAD: granularity unset, modules ["mla_up_proj"]',
              "source_repo": "NVIDIA-NeMo/Megatron-Bridge"}  # fmt: skip
    assert row_recompute(bridge) == ("selective", ("mla_up_proj",))
    assert row_recompute(
        {**bridge, "recompute": "recipe at HEAD: granularity unset, modules []"}
    ) == ("none", None)
    by_id = {row["row_id"]: row for row in rows}
    plans = {
        rid: row_setup(by_id[rid]).plan for rid in ("r0200", "r0410", "r0409", "r0025", "r0030")
    }
    assert plans["r0200"].recompute_modules == ("mla_up_proj",)  # MXFP8, GB200
    assert plans["r0200"].fp8_param_gather and plans["r0200"].grad_reduce_in_bf16
    assert plans["r0409"].fp8_param_gather  # tensorwise
    assert not plans["r0410"].fp8_param_gather and plans["r0410"].grad_reduce_in_bf16  # blockwise
    assert (
        not plans["r0025"].fp8_param_gather and not plans["r0025"].grad_reduce_in_bf16
    )  # MLPerf, unstated
    assert (
        plans["r0030"].fp8_param_gather and not plans["r0030"].grad_reduce_in_bf16
    )  # MLPerf, stated
    fsdp = next(row for row in rows if is_bridge(row) and row["fsdp"].strip() not in ("", "0")
                and row["precision"] == "fp8")  # fmt: skip
    assert not bridge_fp8_param_gather(fsdp)


def test_the_blackwell_fit_reads_only_dense_fit_side_rows_and_gives_the_table() -> None:
    """The fit reads the fit side's dense Blackwell rows alone (FP8 and MXFP8 for the FP8
    ceiling, NVFP4 for the NVFP4 one) and, re-run, reproduces the ceilings the
    calibration table holds for the Blackwell family."""
    results, _ = run()
    by_id = {r.info.row_id: r for r in results}
    rows = fit_rows(results)
    assert len(rows) == 17
    assert all(by_id[r].info.side == "fit" and not by_id[r].info.moe for r in rows)
    assert {by_id[r].info.gpu_type for r in rows} <= {"B200", "GB200", "B300", "GB300"}
    fp4_rows = fit_rows(results, fp4=True)
    assert len(fp4_rows) == 6 and all(by_id[r].info.precision == "nvfp4" for r in fp4_rows)
    assert all(by_id[r].info.side == "fit" and not by_id[r].info.moe for r in fp4_rows)
    fitted = fit_blackwell(results)
    table = calib.GPU_CALIBRATION[calib.BLACKWELL_FAMILY]
    assert fitted.fp8_gemm_efficiency_max == table.fp8_gemm_efficiency_max
    assert fitted.fp4_gemm_efficiency_max == table.fp4_gemm_efficiency_max
    assert table.gemm_half_saturation_flops == HALF_SATURATION
    for name in ("b200", "gb200", "b300", "gb300"):
        assert calib.calibration_for(resolve_gpu(name)) is table


def test_lora_rows_get_the_mlperf_benchmark_adapters_and_stay_out_of_the_fit(
    rows: list[dict[str, str]],
) -> None:
    """The 12 Llama 2 70B LoRA rows state no sequence length and no adapters: they get the
    MLPerf benchmark's (8,192 tokens; rank 16, alpha 32, QKV and projection); the rows
    without a layout stay skipped naming it; the Blackwell fit reads none of them."""
    lora_rows = [row for row in rows if row["kind"] == "lora-finetune"]
    assert len(lora_rows) == 12
    built, skipped = [], []
    for row in lora_rows:
        try:
            st = row_setup(row)
        except Skip as reason:
            skipped.append((row["row_id"], str(reason)))
            continue
        training = st.instance.training
        assert training.lora == MLPERF_LORA and training.seq_length == 8192
        assert training.framework.name == "nemo"
        built.append(row["row_id"])
    assert MLPERF_LORA.rank == 16 and MLPERF_LORA.target_modules == ("linear_qkv", "linear_proj")
    assert all(reason == "tp/pp/cp: layout not stated" for _, reason in skipped)
    assert {r for r, _ in skipped} == {"r0029", "r0031", "r0054"}
    pretrain = next(row for row in rows if row["kind"] == "pretrain" and row["tp"])
    assert row_setup(pretrain).instance.training.lora is None
    results, _ = run(row_ids={"r0039", "r0090", "r0095"})  # fit side, dense, B300, FP8
    assert {r.info.side for r in results} == {"fit"} and fit_rows(results) == ()


def test_nemotron_rows_silent_on_recompute_get_their_preset_only_when_the_layout_matches(
    rows: list[dict[str, str]],
) -> None:
    """Bridge's Nemotron 3 Nano H100 FP8 preset recomputes moe, layernorm, core_attn and
    moe_act at 16 GPUs, global batch 1024, micro-batch 1, ep 8 (the tables' layout)."""
    nano_h100 = [r for r in rows if model_key(r) == "nemotron3nano" and r["gpu_type"] == "H100"]
    assert nano_h100 and all(not r["recompute"] for r in nano_h100)
    for row in nano_h100:
        assert row_recompute(row) == ("selective", ("moe", "layernorm", "core_attn", "moe_act"))
        assert row_recompute({**row, "micro_batch": "2"}) == ("none", None)
    gb300 = next(r for r in rows if model_key(r) == "nemotron3nano" and r["gpu_type"] == "GB300")
    assert row_recompute(gb300) == ("none", None)


def test_layers_kept_in_bf16_as_stated_else_the_nemotron_provider_default(
    rows: list[dict[str, str]],
) -> None:
    from pipette_cp.experiments.models.modern_runs.build import bf16_end_layers

    nemotron = next(r for r in rows if model_key(r) == "nemotron3nano")
    assert not nemotron["bf16_first_last_layers"] and bf16_end_layers(nemotron) == (1, 1)
    assert bf16_end_layers({**nemotron, "bf16_first_last_layers": "0/0"}) == (0, 0)
    stated = next(r for r in rows if r["bf16_first_last_layers"] == "0/0")
    assert bf16_end_layers(stated) == (0, 0)
    llama = next(
        r for r in rows if model_key(r) == "llama31405b" and not r["bf16_first_last_layers"]
    )
    assert bf16_end_layers(llama) == (0, 0)
