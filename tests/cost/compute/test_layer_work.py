"""Compute model of mixture-of-experts layers and context parallelism, against hand counts.

Every expected value below is written out from the formulas of the docstrings (token
volumes, GEMM shapes, bytes), timed with the public primitives (``gemm_time_s``,
``tp_collective_time_s``, HBM bytes / bandwidth), not read back from the model.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipette_cp.cost.compute.gemm import fp8_gemm_time_s, gemm_time_s
from pipette_cp.cost.compute.layer_work import expert_gemms, layer_work
from pipette_cp.cost.compute.model_chunks import (
    _boundary_times,
    chunk_times,
    layer_times,
    tp_collective_time_s,
)
from pipette_cp.cost.stack.calibration import calibration_for
from pipette_cp.cost.workload.flops import (
    Gemm,
    hardware_flops_per_iteration,
    layer_gemms,
    model_flops_per_iteration,
    moe_mlp_active_flops,
)
from pipette_cp.errors import InfeasibleError, SpecError, UnsupportedError
from pipette_cp.io.model_file import load_model
from pipette_cp.specs import LayerProfile
from pipette_cp.specs.gpu import resolve_gpu
from pipette_cp.specs.layouts import make_plan
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.training import TrainingSpec

H100 = resolve_gpu("h100-sxm")
CAL = calibration_for(H100)
NVLINK = 300e9
S = 2048  # tokens per sequence
TRAIN = TrainingSpec(global_batch_size=64, seq_length=S)
HUGE, TINY = 1e30, 1e3  # bytes/s


def tiny_moe(**over) -> ModelSpec:
    """8 experts of width 1536, top-2, SwiGLU, GQA 8 heads / 4 kv heads, h = 1024."""
    fields = dict(
        name="tiny-moe", num_layers=4, hidden_size=1024, num_attention_heads=8,
        num_kv_heads=4, ffn_hidden_size=4096, vocab_size=32000, max_seq_length=S,
        activation="swiglu", norm="rmsnorm", position_embedding="rope", linear_bias=False,
        num_experts=8, moe_top_k=2, moe_ffn_hidden_size=1536, moe_router_aux_loss_coeff=0.01,
    )  # fmt: skip
    return ModelSpec(**(fields | over))


def dense_twin(m: ModelSpec) -> ModelSpec:
    """The same model without experts."""
    experts = ("num_experts", "moe_top_k", "moe_ffn_hidden_size", "moe_router_aux_loss_coeff")
    return ModelSpec(**m.model_dump(exclude=set(experts)))


def plan(m: ModelSpec, **knobs):
    knobs = {"dp": 1, "pp": 1, "tp": 1, "micro_batch_size": 1} | knobs
    return make_plan(num_layers=m.num_layers, **knobs)


def hbm_s(num_bytes: float) -> float:
    return num_bytes / (H100.hbm_bandwidth_bytes_per_s * CAL.hbm_efficiency)


# ------------------------------------------------------------------ MoE layer
def test_grouped_expert_gemms_are_the_per_expert_shapes():
    # ep = etp = 1: all 8 experts local, each gets the even share s b top_k / E of rows.
    m, p = tiny_moe(), plan(tiny_moe(), micro_batch_size=2)
    rows = S * 2 * 2 // 8
    fc1, fc2 = expert_gemms(m, TRAIN, p)
    assert fc1 == Gemm("expert_fc1", rows, 2 * 1536, 1024, 8)
    assert fc2 == Gemm("expert_fc2", rows, 1024, 1536, 8)
    # ep = 4, etp = 2: 2 local experts, each taking the copies of the ep x etp = 8 GPUs
    # of its group (the etp ranks gather their tokens) at half the width
    fc1, fc2 = expert_gemms(m, TRAIN, plan(m, micro_batch_size=2, dp=8, ep=4, etp=2))
    assert (fc1.m, fc1.n, fc1.batch, fc2.k) == (8 * rows, 1536, 2, 768)
    ungrouped = expert_gemms(m, TRAIN.model_copy(update={"moe_grouped_gemm": False}), p)
    one = (Gemm("expert_fc1", rows, 3072, 1024), Gemm("expert_fc2", rows, 1024, 1536))
    assert ungrouped == one * 8


def test_moe_layer_time_is_dense_attention_plus_router_experts_and_traffic():
    # The MoE layer minus its dense twin's layer (same attention, norms, RoPE): the
    # router, the grouped expert GEMMs instead of FC1/FC2, and the memory-bound
    # traffic of router, permutation and the experts' activation.
    m, b = tiny_moe(), 2
    p = plan(m, micro_batch_size=b)
    moe = layer_times(m, TRAIN, H100, p, NVLINK, CAL, moe=True)
    dense = layer_times(dense_twin(m), TRAIN, H100, p, NVLINK, CAL)
    T, h, E, k, W, f = S * b, 1024, 8, 2, 1536, 4096
    rows = T * k // E
    router = Gemm("router", T, E, h)
    grouped = [Gemm("e1", rows, 2 * W, h, E), Gemm("e2", rows, h, W, E)]
    mlp = [Gemm("fc1", T, 2 * f, h), Gemm("fc2", T, h, f)]
    # SwiGLU fused 6 B per input element; softmax + top-k 12 B and aux loss 4 B per
    # fp32 logit; permute + unpermute read and write every routed copy (2 B).
    traffic = 6.0 * (T * k * W - T * f) + T * E * (12.0 + 4.0) + 4 * T * k * h * 2
    gemm_fwd = sum(gemm_time_s(g, H100, CAL) for g in [router, *grouped])
    gemm_fwd -= sum(gemm_time_s(g, H100, CAL) for g in mlp)
    assert moe.forward_s - dense.forward_s == pytest.approx(gemm_fwd + hbm_s(traffic), rel=1e-9)
    backward = [x for g in [router, *grouped] for x in g.backward()]
    gemm_bwd = sum(gemm_time_s(x, H100, CAL) for x in backward)
    gemm_bwd -= sum(gemm_time_s(x, H100, CAL) for g in mlp for x in g.backward())
    assert moe.backward_s - dense.backward_s == pytest.approx(
        gemm_bwd + 2 * hbm_s(traffic), rel=1e-9
    )


def test_one_gemm_per_expert_pays_every_launch():
    m = tiny_moe()
    p = plan(m)
    grouped = layer_times(m, TRAIN, H100, p, NVLINK, CAL, moe=True)
    loop = TRAIN.model_copy(update={"moe_grouped_gemm": False})
    each = layer_times(m, loop, H100, p, NVLINK, CAL, moe=True)
    rows = S * 2 // 8
    one = [Gemm("e1", rows, 3072, 1024), Gemm("e2", rows, 1024, 1536)]
    batched = [Gemm("e1", rows, 3072, 1024, 8), Gemm("e2", rows, 1024, 1536, 8)]
    expected = sum(8 * gemm_time_s(g, H100, CAL) for g in one)
    expected -= sum(gemm_time_s(g, H100, CAL) for g in batched)
    assert each.forward_s - grouped.forward_s == pytest.approx(expected, rel=1e-6)
    assert each.forward_s > grouped.forward_s  # 7 more per-call fixed costs per GEMM


def test_shared_experts_gate_and_expert_tensor_collectives():
    # tp = etp = 2 with SP: attention's and the shared MLP's 4 collectives of the s b h
    # activation, plus the routed tokens' all-gather + reduce-scatter inside the
    # expert-tensor group (X h 2 B, X = s b / tp x top_k x etp), never overlapped.
    m = tiny_moe(num_shared_experts=1, shared_expert_gate=True)
    p = plan(m, tp=2, sequence_parallel=True)
    lt = layer_times(m, TRAIN, H100, p, NVLINK, CAL, moe=True)
    act = tp_collective_time_s(2.0 * S * 1024, 2, NVLINK)
    gathered = S // 2 * 2 * 2 * 1024 * 2.0
    expert = tp_collective_time_s(gathered, 2, NVLINK)
    assert lt.tp_comm_forward_s == pytest.approx(4 * act + 2 * expert)
    assert lt.tp_comm_backward_s == lt.tp_comm_forward_s
    names = [g.name for g in layer_work(m, TRAIN, p, moe=True).gemms]
    assert names == ["qkv", "proj", "expert_fc1", "expert_fc2", "shared_fc1", "shared_fc2"]
    shared = layer_work(m, TRAIN, p, moe=True).gemms[-2]
    assert (shared.m, shared.n, shared.k) == (S, 2 * 1536 // 2, 1024)
    # etp = 1 (tp = 2): no expert collectives, no shared experts: attention's 2 only
    p = plan(m, tp=2, dp=2, etp=1, sequence_parallel=True)
    lone = layer_times(tiny_moe(), TRAIN, H100, p, NVLINK, CAL, moe=True)
    assert lone.tp_comm_forward_s == pytest.approx(2 * act)


def test_fp8_runs_the_expert_gemms_in_fp8_and_the_router_in_bf16():
    m, p = tiny_moe(), plan(tiny_moe())
    fp8 = TRAIN.model_copy(update={"precision": "fp8"})
    lo = layer_times(m, fp8, H100, p, NVLINK, CAL, moe=True)
    hi = layer_times(m, TRAIN, H100, p, NVLINK, CAL, moe=True)
    T, h, W, k, q, kv = S, 1024, 1536, 2, 1024, 512
    rows = T * k // 8
    fp8_gemms = [Gemm("qkv", T, q + 2 * kv, h), Gemm("proj", T, h, q),
                 Gemm("e1", rows, 2 * W, h, 8), Gemm("e2", rows, h, W, 8)]  # fmt: skip
    gain = sum(gemm_time_s(g, H100, CAL) - fp8_gemm_time_s(g, H100, CAL) for g in fp8_gemms)
    # delayed scaling: 4 B per cast element; the inputs of QKV, proj, FC1 and FC2
    casts = 4.0 * (T * (h + q) + T * k * (h + W))
    assert hi.forward_s - lo.forward_s == pytest.approx(gain - hbm_s(casts), rel=1e-9)


def test_capacity_padding_sets_the_expert_rows():
    m = tiny_moe(moe_capacity_factor=1.5)
    padded = TRAIN.model_copy(update={"moe_pad_to_capacity": True, "moe_load_imbalance": 3.0})
    fc1, _ = expert_gemms(m, padded, plan(m))
    assert fc1.m == math.ceil(S * 2 * 1.5 / 8)
    skewed = TRAIN.model_copy(update={"moe_load_imbalance": 1.2})
    fc1, _ = expert_gemms(tiny_moe(), skewed, plan(m))  # dropless: the busiest rank's share
    assert fc1.m == math.ceil(S * 2 * 1.2 / 8)


# ------------------------------------------------------------------ FLOPs
def test_top2_of_8_experts_costs_two_expert_mlps_per_token():
    m = tiny_moe()
    expert_mlp = 2 * 3 * 1024 * 1536  # forward FLOPs per token of one SwiGLU expert
    router = 2 * 1024 * 8
    assert moe_mlp_active_flops(m, S) == S * (2 * expert_mlp + router)
    gemms = expert_gemms(m, TRAIN, plan(m))
    assert sum(g.flops for g in gemms) == S * 2 * expert_mlp  # ep = 1: every routed copy


def test_mixtral_model_flops_count_the_active_parameters():
    m, training = load_model("mixtral-8x7b"), TrainingSpec(global_batch_size=8, seq_length=4096)
    s, tokens = 4096, 8 * 4096
    attention = 12 * m.num_layers * s * m.num_attention_heads * m.head_size  # fwd + bwd
    per_token = model_flops_per_iteration(m, training) / tokens
    # Mistral AI's 12.9B active parameters, 6 FLOPs each, plus the attention scores
    # (the embedding lookup, 1 % of them, does no GEMM)
    assert per_token == pytest.approx(6 * 12.9e9 + attention, rel=0.015)
    # exactly: every active weight matrix (all but the embedding table and the norms)
    norms = (2 * m.num_layers + 1) * m.hidden_size
    matrices = m.active_params - m.embedding_params - norms
    assert per_token == pytest.approx(6 * matrices + attention, rel=1e-12)
    full = hardware_flops_per_iteration(m, training, plan(m, recompute="full"))
    logits = 6 * m.vocab_size * m.hidden_size * tokens
    layers = model_flops_per_iteration(m, training) - logits
    assert full == pytest.approx(model_flops_per_iteration(m, training) + layers / 3, rel=1e-12)


def test_hfu_counts_what_the_named_recompute_modules_redo():
    """Megatron-Core's modules: mlp redoes FC1 and FC2 of every dense layer, core_attn the
    scores and context GEMMs (plain selective), moe the active expert MLP of every MoE
    layer; layernorm and moe_act redo no GEMM."""
    dense = load_model("llama-3-8b")
    s, tokens = TRAIN.seq_length, TRAIN.global_batch_size
    base = model_flops_per_iteration(dense, TRAIN)
    gemms = {g.name: g.flops for g in layer_gemms(dense, s, 1, 1)}
    fc = (gemms["fc1"] + gemms["fc2"]) * dense.num_layers * tokens
    core = (gemms["scores"] + gemms["context"]) * dense.num_layers * tokens

    def hfu(**knobs):
        return hardware_flops_per_iteration(
            dense, TRAIN, plan(dense, recompute="selective", **knobs)
        )

    assert hfu(recompute_modules=("mlp",)) == pytest.approx(base + fc)
    assert hfu(recompute_modules=("core_attn", "mlp")) == pytest.approx(base + fc + core)
    assert hfu() == pytest.approx(base + core) == hfu(recompute_modules=("core_attn",))
    m = tiny_moe()
    moe = hardware_flops_per_iteration(
        m, TRAIN, plan(m, recompute="selective", recompute_modules=("moe",))
    )
    act = hardware_flops_per_iteration(
        m, TRAIN, plan(m, recompute="selective", recompute_modules=("moe_act",))
    )
    mlp = moe_mlp_active_flops(m, s) * m.num_moe_layers * tokens
    assert moe == pytest.approx(model_flops_per_iteration(m, TRAIN) + mlp)
    assert act == model_flops_per_iteration(m, TRAIN)


def test_context_parallelism_keeps_the_model_flops():
    m = tiny_moe()
    assert hardware_flops_per_iteration(m, TRAIN, plan(m, cp=2)) == model_flops_per_iteration(
        m, TRAIN
    )


# ------------------------------------------------------------------ context parallelism
def test_cp2_halves_gemm_rows_and_attention_flops():
    m, b = dense_twin(tiny_moe()), 2
    one, two = (layer_gemms(m, S, b, 1, cp) for cp in (1, 2))
    for g1, g2 in zip(one, two, strict=True):
        assert g2.flops == g1.flops / 2
        if g1.name in ("scores", "context"):
            assert (g2.m, g2.batch) == (S // 2, g1.batch)  # queries: half; keys: all
        else:
            assert g2.m == g1.m // 2 and (g2.n, g2.k) == (g1.n, g1.k)
    # the MoE layer's experts get half the rows too
    moe = tiny_moe()
    e1, e2 = (expert_gemms(moe, TRAIN, plan(moe, dp=2, cp=cp))[0] for cp in (1, 2))
    assert e2.m == e1.m // 2


def test_cp_ring_hidden_with_a_huge_bandwidth_and_exposed_with_a_tiny_one():
    m = dense_twin(tiny_moe())
    p = plan(m, cp=2, recompute="selective")
    fast = layer_times(m, TRAIN, H100, p, NVLINK, CAL, cp_bandwidth_bytes_per_s=HUGE)
    assert fast.cp_comm_forward_s == fast.cp_comm_backward_s == 0.0
    core = fast.recompute_s  # selective recompute: the attention core's forward
    # K and V of the rank's s / cp tokens, 4 kv heads of 128, 2 B
    chunk = 2 * (S // 2) * 4 * 128 * 2
    slow = layer_times(m, TRAIN, H100, p, NVLINK, CAL, cp_bandwidth_bytes_per_s=TINY)
    assert slow.cp_comm_forward_s == pytest.approx(chunk / TINY - core / 2, rel=1e-12)
    assert slow.cp_comm_forward_s == pytest.approx(chunk / TINY, rel=1e-6)
    # the backward passes K, V and their gradients; the selective recompute redoes the
    # forward's ring
    assert slow.recompute_s == pytest.approx(core + slow.cp_comm_forward_s)
    assert slow.cp_comm_backward_s == pytest.approx(3 * chunk / TINY, rel=1e-6)
    # cp - 1 = 3 steps of 1/4 of the attention each: with a transfer as long as the
    # whole attention, each step exposes 3/4 of it
    p4 = plan(m, cp=4)
    core4 = layer_times(m, TRAIN, H100, plan(m, cp=4, recompute="selective"), NVLINK, CAL,
                        cp_bandwidth_bytes_per_s=HUGE).recompute_s  # fmt: skip
    chunk4 = 2 * (S // 4) * 4 * 128 * 2
    mid = layer_times(m, TRAIN, H100, p4, NVLINK, CAL, cp_bandwidth_bytes_per_s=chunk4 / core4)
    assert mid.cp_comm_forward_s == pytest.approx(3 * 0.75 * core4, rel=1e-9)
    assert mid.forward_s == pytest.approx(
        layer_times(m, TRAIN, H100, p4, NVLINK, CAL, cp_bandwidth_bytes_per_s=HUGE).forward_s
        + mid.cp_comm_forward_s
    )


def test_cp_needs_a_ring_bandwidth():
    m = dense_twin(tiny_moe())
    with pytest.raises(InfeasibleError, match="cp_bandwidth_bytes_per_s"):
        chunk_times(m, TRAIN, H100, plan(m, cp=2), NVLINK)
    with pytest.raises(InfeasibleError):
        layer_times(m, TRAIN, H100, plan(m, cp=2), NVLINK, cp_bandwidth_bytes_per_s=0.0)
    chunk_times(m, TRAIN, H100, plan(m), NVLINK)  # cp = 1: none needed


def test_cp_comm_reported_per_chunk_and_in_the_totals():
    m = dense_twin(tiny_moe())
    p = plan(m, cp=2, pp=2, recompute="full")
    ct = chunk_times(m, TRAIN, H100, p, NVLINK, cp_bandwidth_bytes_per_s=TINY)
    lt = layer_times(m, TRAIN, H100, p, NVLINK, cp_bandwidth_bytes_per_s=TINY)
    assert np.allclose(ct.cp_comm_forward_s, 2 * lt.cp_comm_forward_s)
    # full recompute: the backward holds the recomputed forward's ring too
    assert lt.cp_comm_backward_s == pytest.approx(3 * lt.cp_comm_forward_s, rel=1e-6)
    assert np.allclose(ct.cp_comm_backward_s, 2 * lt.cp_comm_backward_s)
    dense = chunk_times(m, TRAIN, H100, plan(m, pp=2), NVLINK)
    assert not dense.cp_comm_forward_s.any() and dense.cp_comm_forward_s.shape == (2,)


# ------------------------------------------------------------------ chunks
def test_chunks_count_dense_and_moe_layers_apart():
    # 8 layers, the first dense, then every second one MoE: 0 D, 1 M, 2 D, 3 M, ...
    m = tiny_moe(num_layers=8, first_k_dense_layers=1, moe_layer_freq=2)
    p = plan(m, pp=4)  # 2 layers per stage: one dense and one MoE each
    moe_layers = [i for i in range(8) if m.is_moe_layer(i)]
    assert moe_layers == [1, 3, 5, 7]
    ct = chunk_times(m, TRAIN, H100, p, NVLINK, calibration=CAL)
    d = layer_times(m, TRAIN, H100, p, NVLINK, CAL)
    x = layer_times(m, TRAIN, H100, p, NVLINK, CAL, moe=True)
    emb, head = _boundary_times(m, TRAIN, H100, p, NVLINK, CAL)
    expected = np.full(4, d.forward_s + x.forward_s)
    expected[0] += emb[0]
    expected[-1] += head[0]
    assert np.allclose(ct.forward_s, expected, rtol=1e-12)
    assert x.forward_s != d.forward_s  # the MoE layer is not the dense one
    # all MoE but the first layer (pp = 2, vpp = 2: chunks of 2 layers, v = c pp + s)
    m = tiny_moe(num_layers=8, first_k_dense_layers=1)
    p = plan(m, pp=2, vpp=2)
    ct = chunk_times(m, TRAIN, H100, p, NVLINK, calibration=CAL)
    expected = np.array([d.backward_s + x.backward_s] + [2 * x.backward_s] * 3)
    expected[0] += emb[1]
    expected[-1] += head[1]
    assert np.allclose(ct.backward_s, expected, rtol=1e-12)


def test_profiles_refuse_moe_models_and_cp():
    profile = LayerProfile(entries=[{"tp": 1, "micro_batch_size": 1, "forward_s": 1e-3,
                                     "backward_s": 2e-3}])  # fmt: skip
    m = tiny_moe()
    with pytest.raises(UnsupportedError, match=r"model\.num_experts"):
        chunk_times(m, TRAIN, H100, plan(m), NVLINK, profile=profile)
    d = dense_twin(m)
    with pytest.raises(UnsupportedError, match=r"plan\.cp"):
        chunk_times(d, TRAIN, H100, plan(d, cp=2), NVLINK, profile=profile,
                    cp_bandwidth_bytes_per_s=NVLINK)  # fmt: skip
    with pytest.raises(SpecError, match="moe=True"):
        layer_times(d, TRAIN, H100, plan(d), NVLINK, moe=True)
