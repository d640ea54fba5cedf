"""Latent attention's and multi-token prediction's parameters and ring bytes per GPU,
against hand counts from DeepSeek-V3's published config (written out here, not read from
the cost model): the duplicated down-projections (Megatron-Core ``TELinear(parallel_mode=
'duplicated')``) and the latent norms stay whole on every tensor-parallel rank."""

from __future__ import annotations

import pytest

from pipette_cp.cost.compute.gemm import hbm_time_s
from pipette_cp.cost.compute.optimizer_step import optimizer_step_time_s
from pipette_cp.cost.memory import fsdp2 as memory_fsdp2
from pipette_cp.cost.memory.peak import memory_by_stage
from pipette_cp.cost.stack.calibration import calibration_for
from pipette_cp.cost.workload.latent_attention import attention_cast_elements, duplicated_params
from pipette_cp.cost.workload.parameters import (
    expert_shard_group,
    layer_gemm_params_per_gpu,
    moe_layer_gemm_params_per_gpu,
    moe_layer_param_split,
    mtp_param_split,
    stage_param_split,
)
from pipette_cp.cost.workload.tokens import cp_chunk_bytes
from pipette_cp.specs.layouts import make_plan
from pipette_cp.specs.training import FrameworkProfile, TrainingSpec
from tests.conftest import small_instance
from tests.cost.deepseek_v3 import DENSE_FFN, DS, EXPERT_FFN, EXPERTS, KVL, NOPE, QL, ROPE, A, H, V

TP = 8
#: the vocabulary padded to a multiple of 128 x tp (Megatron)
PADDED = 130048
#: duplicated per layer: q_down (h x 1536) and kv_down (h x (512 + 64)), 15.1M, and the
#: two latent RMSNorms (1536 + 512)
DOWN = H * QL + H * (KVL + ROPE)
DUPLICATED = DOWN + QL + KVL
#: split over tp per layer: q_up, kv_up and the output projection
UP = QL * A * (NOPE + ROPE) + KVL * A * (NOPE + V) + A * V * H


def _plan(**over):
    fields = dict(num_layers=DS.num_layers, dp=4, pp=1, tp=TP, micro_batch_size=1,
                  sequence_parallel=True, ep=8, etp=1)  # fmt: skip
    return make_plan(**{**fields, **over})


def test_down_projections_are_15_1m_duplicated_parameters_per_layer() -> None:
    assert DOWN == 15_138_816
    assert duplicated_params(DS) == DUPLICATED


def test_moe_layer_dense_part_matches_a_hand_count_at_tp8() -> None:
    plan = _plan()
    shared = 3 * H * EXPERT_FFN  # one shared expert, split like a dense MLP
    router = H * EXPERTS + EXPERTS  # the router and its expert bias, replicated
    hand = (UP + shared) / TP + DUPLICATED + 2 * H + router
    dense, experts = moe_layer_param_split(DS, plan)
    assert dense == pytest.approx(hand, rel=1e-12)
    assert experts == pytest.approx(EXPERTS // 8 * 3 * H * EXPERT_FFN)


def test_dense_layers_keep_the_down_projections_whole() -> None:
    plan = _plan()
    mtp_off = DS.model_copy(update={"mtp_layers": 0})
    dense_block = (UP + 3 * H * DENSE_FFN) / TP + DUPLICATED + 2 * H
    dense, _ = stage_param_split(mtp_off, plan, 0)
    moe_dense, _ = moe_layer_param_split(DS, plan)
    head = PADDED * H / TP * 2 + H  # embedding, output layer, final norm
    assert dense == pytest.approx(3 * dense_block + 58 * moe_dense + head, rel=1e-12)


def test_fp8_weight_copies_count_the_down_projections_whole() -> None:
    mlp = 3 * H * DENSE_FFN
    assert layer_gemm_params_per_gpu(DS, TP) == pytest.approx(DOWN + (UP + mlp) / TP)
    plan = _plan()
    tokens = 4096
    assert attention_cast_elements(DS, tokens, plan)[2] == pytest.approx(DOWN + UP / TP)
    experts = EXPERTS // 8 * 3 * H * EXPERT_FFN
    hand = DOWN + (UP + 3 * H * EXPERT_FFN) / TP + experts
    assert moe_layer_gemm_params_per_gpu(DS, plan) == pytest.approx(hand)


def test_mtp_parameters_are_in_the_last_stage_split_once() -> None:
    plan = _plan(pp=4, dp=1)
    off = DS.model_copy(update={"mtp_layers": 0})
    mtp = mtp_param_split(DS, plan, plan.pp - 1)
    moe_dense, moe_experts = moe_layer_param_split(DS, plan)
    # block, eh_proj (2h x h over tp), enorm/hnorm/final norm, the untied embedding copy
    assert mtp[0] == pytest.approx(moe_dense + 2 * H * H / TP + 3 * H + PADDED * H / TP)
    assert mtp[1] == pytest.approx(moe_experts)
    for stage in range(plan.pp):
        with_mtp, without = stage_param_split(DS, plan, stage), stage_param_split(off, plan, stage)
        extra = mtp if stage == plan.pp - 1 else (0.0, 0.0)
        assert with_mtp[0] - without[0] == pytest.approx(extra[0])
        assert with_mtp[1] - without[1] == pytest.approx(extra[1])


def test_memory_and_optimizer_step_count_the_mtp_weights_once() -> None:
    instance = small_instance(gpu="h100", layers=4)
    model = DS.model_copy(update={"num_layers": 4, "first_k_dense_layers": 1,
                                  "num_experts": 16, "moe_top_k": 2, "mtp_layers": 1})  # fmt: skip
    off = model.model_copy(update={"mtp_layers": 0})
    plan = make_plan(num_layers=4, dp=4, pp=2, tp=1, micro_batch_size=1, ep=4,
                     distributed_optimizer=True)  # fmt: skip
    training = instance.training
    last = plan.pp - 1
    mtp_dense, mtp_experts = mtp_param_split(model, plan, last)
    weights = [memory_by_stage(m, training, plan)[last].weights for m in (model, off)]
    # 2 B per bf16 weight, dense and expert alike (no FP8 copies here)
    assert weights[0] - weights[1] == pytest.approx(2.0 * (mtp_dense + mtp_experts))
    # the optimizer step: Adam's 34 B per local shard parameter and 4 B per parameter
    gpu = instance.cluster.gpu_types[next(iter(instance.cluster.gpu_types))]
    dense, experts = stage_param_split(model, plan, last)  # the MTP module included
    shard = dense / plan.shard_group + experts / expert_shard_group(plan)
    expected = hbm_time_s(34.0 * shard + 4.0 * (dense + experts), gpu, calibration_for(gpu))
    assert optimizer_step_time_s(model, training, gpu, plan, last) == pytest.approx(expected)


def test_context_parallel_chunk_has_the_value_width() -> None:
    training = TrainingSpec(global_batch_size=8, seq_length=8192)
    plan = _plan(cp=2, dp=2)
    tokens = 8192 / 2
    # K at qk_nope + qk_rope = 192, V at v_head_dim = 128, 128 / 8 heads, bf16
    assert cp_chunk_bytes(DS, training, plan) == pytest.approx(tokens * A / TP * (192 + 128) * 2)


def test_torchtitan_ring_gathers_k_and_v_at_their_widths() -> None:
    training = TrainingSpec(global_batch_size=8, seq_length=8192,
                            framework=FrameworkProfile(name="torchtitan"))  # fmt: skip
    plan = _plan(cp=2, dp=2)
    heads = A / TP
    gathered = 2.0 * 8192 * heads * (192 + 128)
    accumulators = 4.0 * 8192 / 2 * heads * (2 * 192 + 128)
    expected = gathered + accumulators - 4 * cp_chunk_bytes(DS, training, plan)
    assert memory_fsdp2.ring_attention_bytes(DS, training, plan) == pytest.approx(expected)
