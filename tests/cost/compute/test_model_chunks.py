"""Compute model: FLOP counts from the literature, timing structure, measured profiles."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipette_cp.cost.compute.gemm import gemm_time_s, wave_efficiency
from pipette_cp.cost.compute.model_chunks import (
    ChunkTimes,
    chunk_times,
    layer_times,
    tp_collective_time_s,
)
from pipette_cp.cost.compute.optimizer_step import optimizer_step_time_s
from pipette_cp.cost.stack.calibration import calibration_for
from pipette_cp.cost.workload.flops import (
    Gemm,
    hardware_flops_per_iteration,
    layer_forward_flops,
    layer_gemms,
    model_flops_per_iteration,
)
from pipette_cp.errors import SpecError
from pipette_cp.io.profile_file import load_layer_profile
from pipette_cp.specs import LayerProfile
from pipette_cp.specs.gpu import resolve_gpu
from pipette_cp.specs.layouts import make_plan
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.training import TrainingSpec
from tests.input_errors import refuses_missing_and_malformed
from tests.models import gpt_model, llama3_8b

A100 = resolve_gpu("a100-80gb")
NVLINK = 240e9


def gpt3(**over) -> ModelSpec:
    """GPT-3 175B (Brown et al. 2020): 96 layers, h 12288, 96 heads, V 51200."""
    return gpt_model("gpt3-175b", 96, 12288, 96, **over)


def small(**over) -> ModelSpec:
    return gpt_model("small", 8, 2048, 16, **over)


TRAIN = TrainingSpec(global_batch_size=1536, seq_length=2048, flash_attention_available=False)


def plan(model: ModelSpec, **knobs):
    knobs = {"dp": 1, "pp": 1, "tp": 1, "micro_batch_size": 1, "flash_attention": False} | knobs
    return make_plan(num_layers=model.num_layers, **knobs)


# ------------------------------------------------------------------ FLOP counts
def test_layer_flops_are_24bsh2_plus_4bs2h():
    # Narayanan et al. 2021 sec. 5.1: forward of one GPT layer.
    b, s, h = 4, 2048, 12288
    assert layer_forward_flops(gpt3(), s, b) == 24 * b * s * h**2 + 4 * b * s**2 * h
    assert layer_forward_flops(gpt3(), s, b, tp=8) == pytest.approx(
        (24 * b * s * h**2 + 4 * b * s**2 * h) / 8
    )


def test_model_and_hardware_flops_match_narayanan_equation_3():
    m, s, L, h, V = gpt3(), 2048, 96, 12288, 51200
    B = TRAIN.global_batch_size
    # Narayanan et al. 2021 eq. (3) with recomputation: 96 B s l h^2 (1 + s/6h + V/16lh)
    full = 96 * B * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))
    # ... and without recomputation (3 passes instead of 4 over the layers)
    model = 72 * B * s * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h))
    assert model_flops_per_iteration(m, TRAIN) == pytest.approx(model, rel=1e-12)
    p = plan(m, recompute="full")
    assert hardware_flops_per_iteration(m, TRAIN, p) == pytest.approx(full, rel=1e-12)
    assert hardware_flops_per_iteration(m, TRAIN, plan(m)) == pytest.approx(model)
    sel = hardware_flops_per_iteration(m, TRAIN, plan(m, recompute="selective"))
    assert sel == pytest.approx(model + L * 4 * s**2 * h * B)


def test_six_n_flops_per_token():
    # Kaplan et al. 2020 / Chinchilla: training costs ~6 N FLOPs per token; the
    # attention scores add ~s/(6h) on top (2.8% for GPT-3 at s = 2048).
    m = gpt3()
    tokens = TRAIN.global_batch_size * TRAIN.seq_length
    ratio = model_flops_per_iteration(m, TRAIN) / (6 * m.total_params * tokens)
    assert 1.0 <= ratio <= 1.0 + 2048 / (6 * 12288) + 0.005
    assert ratio == pytest.approx(1.0, abs=0.03)


def test_six_n_per_token_exact_for_gqa_swiglu_matmul_parameters():
    # Llama-style: every weight matrix is used once per token (2 FLOPs per weight
    # forward, 6 with backward), plus 12 L s h for the attention scores/context.
    m = llama3_8b("l")
    training = TrainingSpec(global_batch_size=8, seq_length=8192)
    matmul = m.num_layers * (m.attention_params + m.mlp_params) + m.vocab_size * m.hidden_size
    tokens = 8 * 8192
    expected = (6 * matmul + 12 * m.num_layers * 8192 * m.hidden_size) * tokens
    assert model_flops_per_iteration(m, training) == pytest.approx(expected, rel=1e-12)


def test_gqa_shrinks_the_qkv_gemm():
    mha, gqa = small(), small(num_kv_heads=4)
    qkv = {
        m.kv_heads: next(g for g in layer_gemms(m, 2048, 1, 2) if g.name == "qkv")
        for m in (mha, gqa)
    }
    assert qkv[16].n == 3 * 2048 // 2
    assert qkv[4].n == (2048 + 2 * 4 * 128) // 2


# ----------------------------------------------------------------------- timing
def test_wave_efficiency_and_gemm_time():
    cal = calibration_for(A100)
    g = Gemm("x", 8192, 8192, 8192)
    assert 0 < wave_efficiency(g, cal.num_sms) <= 1
    # A big GEMM runs below peak, at most at the fitted ceiling.
    achieved = g.flops / gemm_time_s(g, A100, cal)
    assert 0.3 * A100.peak_flops_per_s < achieved <= cal.gemm_efficiency_max * A100.peak_flops_per_s
    # A skinny GEMM is memory-bound: its time is at least its HBM traffic.
    thin = Gemm("thin", 65536, 16, 4096)
    traffic = 2 * (65536 * 4096 + 4096 * 16 + 65536 * 16)
    assert gemm_time_s(thin, A100, cal) >= traffic / A100.hbm_bandwidth_bytes_per_s
    times = [gemm_time_s(Gemm("m", m, 4096, 4096), A100, cal) for m in range(256, 20000, 256)]
    assert times == sorted(times)


def test_layer_time_grows_with_micro_batch_and_efficiency_improves():
    m = small()
    t = [layer_times(m, TRAIN, A100, plan(m, micro_batch_size=b), NVLINK) for b in (1, 2, 4, 8)]
    fwd = [x.forward_s for x in t]
    assert fwd == sorted(fwd)
    per_sequence = [f / b for f, b in zip(fwd, (1, 2, 4, 8), strict=True)]
    assert per_sequence[-1] < per_sequence[0]


@pytest.mark.parametrize("sp", [False, True])
def test_tp_collectives_per_layer(sp):
    m, b, t = small(), 2, 4
    p = plan(m, tp=t, micro_batch_size=b, sequence_parallel=sp)
    lt = layer_times(m, TRAIN, A100, p, NVLINK)
    # 2 all-reduces (or 2 all-gathers + 2 reduce-scatters with SP) of b s h x 2 B,
    # forward and backward: 4 ring halves of (t-1)/t x bytes / B each way.
    half = tp_collective_time_s(2 * b * 2048 * 2048, t, NVLINK)
    assert half == pytest.approx(1e-5 + 3 / 4 * 2 * b * 2048 * 2048 / NVLINK)
    assert lt.tp_comm_forward_s == pytest.approx(4 * half)
    assert lt.tp_comm_backward_s == pytest.approx(4 * half)
    one = layer_times(m, TRAIN, A100, plan(m, micro_batch_size=b), NVLINK)
    assert one.tp_comm_forward_s == one.tp_comm_backward_s == 0


def test_tp_comm_overlap_hides_communication():
    m = small()
    p = plan(m, tp=8, sequence_parallel=True)
    plain = layer_times(m, TRAIN, A100, p, NVLINK)
    overlapped = TRAIN.model_copy(update={"tp_comm_overlap": True})
    hidden = layer_times(m, overlapped, A100, p, NVLINK)
    assert hidden.forward_s < plain.forward_s
    assert hidden.tp_comm_forward_s < plain.tp_comm_forward_s


def test_model_chunks_structure_and_recompute():
    m = small(num_layers=16)
    p = plan(m, pp=4, vpp=2, tp=2)
    ct = chunk_times(m, TRAIN, A100, p, NVLINK)
    assert isinstance(ct, ChunkTimes) and ct.forward_s.shape == (8,) and not ct.measured
    with pytest.raises(ValueError):
        ct.forward_s[0] = 0.0  # read-only
    # every chunk has 2 layers: chunk 0 of stage 0 adds the embedding, the last
    # chunk of the last stage the LM head and the loss.
    middle = ct.forward_s[1]
    assert ct.forward_s[0] > middle and ct.forward_s[-1] > ct.forward_s[0]
    assert np.allclose(ct.forward_s[1:-1], middle)
    assert ct.per_stage("forward_s", 4).shape == (4,)
    assert not ct.recompute_s.any()
    full = chunk_times(m, TRAIN, A100, p.model_copy(update={"recompute": "full"}), NVLINK)
    assert np.allclose(full.backward_s - ct.backward_s, full.recompute_s)
    # full recompute re-runs each layer's forward once
    assert np.allclose(full.recompute_s[1:-1], middle)


def test_failed_tp_link_is_an_error():
    m = small()
    with pytest.raises(SpecError, match="tp_bandwidth"):
        chunk_times(m, TRAIN, A100, plan(m, tp=2), 0.0)
    chunk_times(m, TRAIN, A100, plan(m, tp=1), 0.0)  # no TP, no link needed


def test_optimizer_step_is_memory_bound_and_sharded():
    m = small()
    plain = optimizer_step_time_s(m, TRAIN, A100, plan(m, dp=8), 0)
    sharded = optimizer_step_time_s(m, TRAIN, A100, plan(m, dp=8, distributed_optimizer=True), 0)
    assert 0 < sharded < plain
    params = m.total_params  # pp = tp = 1, tied: every parameter on the GPU
    assert plain == pytest.approx(38 * params / (0.8 * A100.hbm_bandwidth_bytes_per_s), rel=0.01)


# ---------------------------------------------------------------------- profile
PROFILE = {
    "description": "test",
    "seq_length": 2048,
    "entries": [
        {"tp": 2, "micro_batch_size": 1, "forward_s": 0.01, "backward_s": 0.02},
        {"tp": 2, "micro_batch_size": 1, "recompute": "full", "forward_s": 0.01,
         "backward_s": 0.03},
    ],
}  # fmt: skip


def test_profile_replaces_the_layer_estimate(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(PROFILE))
    profile = load_layer_profile(path)
    m = small()
    p = plan(m, tp=2)
    measured = chunk_times(m, TRAIN, A100, p, NVLINK, profile=profile)
    analytic = chunk_times(m, TRAIN, A100, p, NVLINK)
    assert measured.measured
    boundary = analytic.forward_s[0] - 8 * layer_times(m, TRAIN, A100, p, NVLINK).forward_s
    assert measured.forward_s[0] == pytest.approx(8 * 0.01 + boundary)
    # the entry that pins the recompute setting wins for a full-recompute plan
    full = chunk_times(m, TRAIN, A100, p.model_copy(update={"recompute": "full"}), NVLINK,
                       profile=profile)  # fmt: skip
    assert full.backward_s[0] - measured.backward_s[0] == pytest.approx(8 * 0.01)


def test_profile_errors(tmp_path):
    profile = LayerProfile.model_validate(PROFILE)
    m = small()
    with pytest.raises(SpecError, match=r"tp=4, micro_batch_size=1"):
        chunk_times(m, TRAIN, A100, plan(m, tp=4), NVLINK, profile=profile)
    other = TRAIN.model_copy(update={"seq_length": 4096})
    with pytest.raises(SpecError, match="seq_length"):
        chunk_times(m, other, A100, plan(m, tp=2), NVLINK, profile=profile)
    bad = refuses_missing_and_malformed(
        load_layer_profile, tmp_path / "bad.json", "{not json", "not JSON"
    )
    bad.write_text(json.dumps({"entries": [{"tp": 1, "micro_batch_size": 1, "forward_s": -1,
                                            "backward_s": 1}]}))  # fmt: skip
    with pytest.raises(SpecError, match="forward_s"):
        load_layer_profile(bad)
