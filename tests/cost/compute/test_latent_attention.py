"""Multi-head latent attention and multi-token prediction are priced (DeepSeek-V3).

FLOP counts are checked against a hand count from the published config (DeepSeek-V3's
config.json widths, written out here, not read from the cost model), the GEMM shapes
against Megatron-Core's ``MLASelfAttention`` (duplicated down-projections), and the
multi-token prediction module's time and memory against the last stage alone.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipette_cp.cost.compute.model_chunks import chunk_times
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.cost.memory.peak import memory_by_stage
from pipette_cp.cost.workload.flops import layer_gemms, model_flops_per_iteration
from pipette_cp.solvers.split import solve_split
from pipette_cp.solvers.split.cost import split_cost
from pipette_cp.solvers.split.oracle import brute_force_split
from pipette_cp.specs.layouts import make_plan
from pipette_cp.specs.training import TrainingSpec
from tests.conftest import small_instance
from tests.cost.deepseek_v3 import (
    DENSE_FFN,
    DENSE_LAYERS,
    DS,
    EXPERT_FFN,
    EXPERTS,
    KVL,
    LAYERS,
    NOPE,
    QL,
    ROPE,
    SHARED,
    TOP_K,
    VOCAB,
    A,
    H,
    V,
)
from tests.solvers.split.test_split import (
    BACKENDS,
    noisy_instance,
    plan_for,
    stage_bytes,
    with_split,
)


def _hand_forward_flops_per_token(seq: int, mtp: int) -> float:
    """Forward FLOPs per token: 2 per GEMM weight a token passes, plus the attention core
    over the full s x s scores (Megatron's convention), q/k width 192 and v width 128."""
    mla = H * QL + QL * A * (NOPE + ROPE) + H * (KVL + ROPE) + KVL * A * (NOPE + V) + A * V * H
    core = 2 * seq * A * (NOPE + ROPE) + 2 * seq * A * V
    dense_mlp = 3 * H * DENSE_FFN
    moe_mlp = H * EXPERTS + (TOP_K + SHARED) * 3 * H * EXPERT_FFN
    dense_layer = 2 * (mla + dense_mlp) + core
    moe_layer = 2 * (mla + moe_mlp) + core
    logits = 2 * H * VOCAB
    main = DENSE_LAYERS * dense_layer + (LAYERS - DENSE_LAYERS) * moe_layer + logits
    return main + mtp * (moe_layer + 2 * 2 * H * H + logits)


@pytest.mark.parametrize("mtp", [0, 1])
def test_deepseek_v3_flops_match_a_hand_count(mtp: int) -> None:
    model = DS.model_copy(update={"mtp_layers": mtp})
    training = TrainingSpec(global_batch_size=8, seq_length=4096)
    per_token = model_flops_per_iteration(model, training) / (3 * 8 * 4096)
    assert per_token == pytest.approx(_hand_forward_flops_per_token(4096, mtp), rel=1e-12)


def test_deepseek_v3_flops_are_twice_its_37b_active_parameters_plus_attention() -> None:
    model = DS.model_copy(update={"mtp_layers": 0})
    training = TrainingSpec(global_batch_size=1, seq_length=4096)
    per_token = model_flops_per_iteration(model, training) / (3 * 4096)
    core = LAYERS * (2 * 4096 * A * (NOPE + ROPE) + 2 * 4096 * A * V)
    # the published 37B activated per token (the report) less the embedding table, which
    # is no GEMM (norms: < 0.01 %): 2 FLOPs per weight
    assert (per_token - core) / 2 == pytest.approx(37e9 - VOCAB * H, rel=0.02)


def test_mla_gemms_are_megatrons_split_and_duplicated_ones() -> None:
    tokens, t = 4096, 8
    with_sp = {g.name: g for g in layer_gemms(DS, tokens, 1, t, 1, True)}
    without = {g.name: g for g in layer_gemms(DS, tokens, 1, t, 1, False)}
    # duplicated TELinear down-projections: unsplit, over the rank's s/t rows with SP
    assert (with_sp["q_down"].m, with_sp["q_down"].n, with_sp["q_down"].k) == (512, QL, H)
    assert (with_sp["kv_down"].m, with_sp["kv_down"].n) == (512, KVL + ROPE)
    assert (without["q_down"].m, without["kv_down"].m) == (tokens, tokens)
    # column-parallel up-projections, row-parallel output
    assert (with_sp["q_up"].n, with_sp["q_up"].k) == (A * (NOPE + ROPE) // t, QL)
    assert (with_sp["kv_up"].n, with_sp["kv_up"].k) == (A * (NOPE + V) // t, KVL)
    assert (with_sp["proj"].n, with_sp["proj"].k) == (H, A * V // t)
    # the core: scores over the q/k width, context over the v width
    assert (with_sp["scores"].k, with_sp["context"].n) == (NOPE + ROPE, V)
    assert "qkv" not in with_sp


def _deepseek_like(mtp: int, layers: int = 4):
    model = DS.model_copy(
        update={"num_layers": layers, "first_k_dense_layers": 1, "num_experts": 16,
                "moe_top_k": 2, "mtp_layers": mtp, "name": "ds-small"}
    )  # fmt: skip
    instance = small_instance(gpu="h100", layers=layers)
    return instance.model_copy(update={"model": model})


def test_small_deepseek_evaluates_and_mtp_weighs_on_the_last_stage_only() -> None:
    plan = make_plan(num_layers=4, dp=4, pp=2, tp=1, micro_batch_size=1)
    without, with_mtp = (_deepseek_like(m) for m in (0, 1))
    a, b = (Evaluator(i).evaluate(plan) for i in (without, with_mtp))
    assert 0 < a.iteration_time_s < b.iteration_time_s
    mem_a, mem_b = (memory_by_stage(i.model, i.training, plan) for i in (without, with_mtp))
    assert mem_a[0].total_bytes == mem_b[0].total_bytes
    for part in ("weights", "activations", "logits"):
        assert getattr(mem_b[1], part) > getattr(mem_a[1], part), part
    assert mem_b[1].logits == pytest.approx(2 * mem_a[1].logits)  # main head + one depth
    two = _deepseek_like(2)
    assert memory_by_stage(two.model, two.training, plan)[1].total_bytes > mem_b[1].total_bytes


def test_mtp_time_is_a_constant_of_the_last_chunk() -> None:
    instance = _deepseek_like(1)
    plan = make_plan(num_layers=4, dp=4, pp=2, tp=1, micro_batch_size=1)
    base = _deepseek_like(0)
    gpu = instance.cluster.gpu_types[next(iter(instance.cluster.gpu_types))]
    args = (instance.training, gpu, plan, 0.0)
    on, off = chunk_times(instance.model, *args), chunk_times(base.model, *args)
    assert on.forward_s[0] == off.forward_s[0]
    assert on.forward_s[-1] > off.forward_s[-1] and on.backward_s[-1] > off.backward_s[-1]


def _mtp_instance(nodes: int, layers: int, seed: int):
    instance = noisy_instance(nodes, layers, seed=seed)
    model = instance.model.model_copy(update={"mtp_layers": 1, "position_embedding": "rope"})
    return instance.model_copy(update={"model": model})


def test_split_models_stay_exact_with_mtp() -> None:
    instance = _mtp_instance(4, 12, seed=3)
    plan = plan_for(instance, dp=1, pp=4)
    cost = split_cost(instance, plan)
    evaluator = Evaluator(instance, validate=False)
    rng = np.random.default_rng(0)
    for _ in range(4):
        split = tuple(int(n) for n in rng.multinomial(8, np.ones(4) / 4) + 1)
        expected = evaluator.evaluate(with_split(plan, split)).iteration_time_s
        assert cost.iteration_time_s(np.array(split)) == pytest.approx(expected, rel=1e-12)
        np.testing.assert_allclose(
            cost.memory.stage_bytes(np.array(split), plan.pp),
            stage_bytes(instance, plan, split),
            rtol=1e-12,
        )
    best, best_s = brute_force_split(instance, plan)
    for backend in BACKENDS:
        result = solve_split(instance, plan, backend=backend)
        assert result.objective_s == pytest.approx(best_s, rel=1e-6), (backend, result, best)
    # the last stage carries the module: the optimum gives it fewer layers than stage 0
    assert best[-1] <= best[0]
