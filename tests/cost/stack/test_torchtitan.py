"""torchtitan's profile: its fitted speeds (fit side only), its loss, its per-op selective
checkpointing, the benchmark's GPU and the context-parallel attention factor."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from pipette_cp.cost.memory.peak import activation_bytes_per_layer, logits_bytes
from pipette_cp.cost.memory.recompute import op_selective_layer_bytes
from pipette_cp.cost.stack.frameworks import FRAMEWORKS, attention_scale, resolve_framework
from pipette_cp.experiments.models.accuracy import read_rows
from pipette_cp.experiments.models.calibration_split import (
    FIT,
    HELD_OUT,
    assign_split,
    family,
    row_key,
)
from pipette_cp.experiments.models.moe_cp_setup import MOE_CP_CSV
from pipette_cp.experiments.models.published_runs_setup import TORCHTITAN_GPU, row_precision
from pipette_cp.experiments.models.torchtitan_rows import (
    compute_fit_rows,
    cp_attention_efficiency,
    fit_compute_efficiency,
    fit_cp_attention_efficiency,
)
from pipette_cp.specs import TrainingSpec
from pipette_cp.specs.layouts import make_plan
from pipette_cp.specs.training import FrameworkProfile
from tests.models import llama3_8b

LLAMA = llama3_8b("llama-8b-like", num_layers=4)


def _training(framework: str, **extra: object) -> TrainingSpec:
    return TrainingSpec(global_batch_size=8, seq_length=8192, dropout=False,
                        framework=FrameworkProfile(name=framework), **extra)  # type: ignore[arg-type]  # fmt: skip


def _plan(**extra: object):
    return make_plan(num_layers=4, dp=8, pp=1, tp=1, micro_batch_size=2, **extra)  # type: ignore[arg-type]


def test_cp_attention_factor_applies_only_with_context_parallelism() -> None:
    titan = _training("torchtitan")
    ring = resolve_framework(titan.framework).cp_attention_efficiency
    assert 0 < ring < 1
    assert attention_scale(titan, "H100", cp=4) == pytest.approx(
        ring * attention_scale(titan, "H100")
    )
    for name, fw in FRAMEWORKS.items():  # Transformer Engine's fused ring and the others: none
        if name != "torchtitan":
            assert fw.cp_attention_efficiency == 1.0


def test_torchtitan_eager_loss_keeps_twelve_bytes_per_logit() -> None:
    p = _plan()
    mcore, titan = _training("megatron-core"), _training("torchtitan")
    logits = 8192 * 2 * 128256  # s b V, tp 1
    assert logits_bytes(LLAMA, mcore, p) == pytest.approx(6.0 * logits)
    assert logits_bytes(LLAMA, titan, p) == pytest.approx(12.0 * logits)
    fused = titan.model_copy(update={"fused_cross_entropy": True})
    assert logits_bytes(LLAMA, fused, p) == pytest.approx(2.0 * logits)


def test_torchtitan_selective_is_per_op_checkpointing() -> None:
    """Input, Q, V, gate, down projection and the attention output (2 B each) and the
    log-sum-exp (4 B per head) per token; Megatron's selective keeps the whole layer."""
    p = _plan(recompute="selective")
    tokens = 8192 * 2
    per_token = 2 * (4096 + 4096 + 1024 + 14336 + 4096 + 4096) + 4 * 32
    titan = _training("torchtitan")
    assert op_selective_layer_bytes(LLAMA, titan, p) == pytest.approx(tokens * per_token)
    assert activation_bytes_per_layer(LLAMA, titan, p) == pytest.approx(tokens * per_token)
    mcore = activation_bytes_per_layer(LLAMA, _training("megatron-core"), p)
    assert mcore > 2 * tokens * per_token
    full = _plan(recompute="full")  # full checkpointing: the layer input alone, either way
    assert activation_bytes_per_layer(LLAMA, titan, full) == pytest.approx(tokens * 4096 * 2)


def test_torchtitan_gpu_has_the_benchmarks_hbm2e() -> None:
    assert TORCHTITAN_GPU.hbm_bandwidth_bytes_per_s == pytest.approx(2.4e12)
    assert TORCHTITAN_GPU.memory_bytes == pytest.approx(96 * 2**30)


def test_compute_efficiency_is_fitted_on_fit_side_bf16_rows_and_is_the_profiles() -> None:
    rows = compute_fit_rows()
    keys = {row_key(r) for r, side in zip(read_rows(MOE_CP_CSV), assign_split(read_rows(MOE_CP_CSV)), strict=True) if side == FIT}  # fmt: skip
    assert len(rows) == 4 and all(row_key(r) in keys for r in rows)
    assert all(family(r) == "torchtitan" and row_precision(r) == "bf16" for r in rows)
    value, count = fit_compute_efficiency()
    assert count == 4
    assert value == pytest.approx(FRAMEWORKS["torchtitan"].compute_scale("H100"), abs=0.002)


def _with_held_out_torchtitan_rows_doubled(tmp: Path) -> Path:
    """A copy of the CSV whose held-out torchtitan rows claim twice the throughput."""
    rows = read_rows(MOE_CP_CSV)
    out = []
    for row, side in zip(rows, assign_split(rows), strict=True):
        row = dict(row)
        if family(row) == "torchtitan" and side == HELD_OUT:
            row["notes"] = re.sub(r"tokens_per_s_per_gpu=(\d+)",
                                  lambda m: f"tokens_per_s_per_gpu={2 * int(m.group(1))}", row["notes"])  # fmt: skip
        out.append(row)
    path = tmp / "published_runs_moe_cp.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(out)
    assert assign_split(read_rows(path)) == assign_split(rows)  # the same split
    return path


def test_the_fits_never_read_held_out_rows(tmp_path: Path) -> None:
    changed = _with_held_out_torchtitan_rows_doubled(tmp_path)
    assert fit_compute_efficiency(changed) == fit_compute_efficiency()
    value, score, count = fit_cp_attention_efficiency(changed)
    assert (value, score, count) == fit_cp_attention_efficiency()
    assert count == 3 and value == FRAMEWORKS["torchtitan"].cp_attention_efficiency


def test_cp_attention_context_restores_the_profile() -> None:
    base = resolve_framework(FrameworkProfile(name="torchtitan")).cp_attention_efficiency
    with cp_attention_efficiency(0.5):
        assert resolve_framework(FrameworkProfile(name="torchtitan")).cp_attention_efficiency == 0.5
    assert resolve_framework(FrameworkProfile(name="torchtitan")).cp_attention_efficiency == base
