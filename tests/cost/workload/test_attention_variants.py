"""Architecture features the model files describe are priced where the stack runs them:
sliding windows cost their share of the causal attention, attention sinks no GEMM work,
and what Megatron-Core / Transformer Engine do not run is refused by name (field, value,
rule).  The Megatron export carries QK norm."""

from __future__ import annotations

import pytest

from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.cost.workload.flops import model_flops_per_iteration
from pipette_cp.cost.workload.sliding_window import (
    causal_pairs,
    causal_tiles,
    window_flops_fraction,
    window_tile_fraction,
    windowed_layers,
)
from pipette_cp.errors import LayoutError
from pipette_cp.io.model_file import load_model
from pipette_cp.report.megatron.flags import model_args
from pipette_cp.specs.layouts import make_plan
from tests.conftest import small_instance


def _instance(seq: int = 1024, gpu: str = "h100", **model):
    instance = small_instance(gpu=gpu)
    base = instance.model.model_copy(update={"position_embedding": "rope", "max_seq_length": seq})
    training = instance.training.model_copy(update={"seq_length": seq})
    return instance.model_copy(
        update={"model": base.model_copy(update=model), "training": training}
    )


PLAN = make_plan(num_layers=8, dp=2, pp=2, tp=2, micro_batch_size=1)


def test_causal_pairs_and_tiles_by_hand() -> None:
    # s = 5, w = 2: keys per query 1, 2, 2, 2, 2
    assert causal_pairs(5, 2) == 9 and causal_pairs(5) == 15
    # 4 tiles of 128, window 128: query tile 0 sees tile 0, the others their own and the one before
    assert causal_tiles(512, 128) == 1 + 2 + 2 + 2 and causal_tiles(512) == 10
    assert causal_tiles(512, 4096) == causal_tiles(512)


def test_windowed_layers_follow_the_pattern() -> None:
    every = _instance(sliding_window=128).model
    alternate = _instance(sliding_window=128, sliding_window_pattern=2).model
    gemma3 = _instance(sliding_window=128, sliding_window_pattern=6).model
    assert (windowed_layers(every), windowed_layers(alternate), windowed_layers(gemma3)) == (
        8,
        4,
        7,
    )
    # half the layers at w/s of the work (s = 8192, w = 128: pairs 128*129/2 + 8064*128)
    m = _instance(seq=8192, sliding_window=128, sliding_window_pattern=2).model
    ratio = (128 * 129 // 2 + (8192 - 128) * 128) / (8192 * 8193 // 2)
    assert window_flops_fraction(m, 8192) == pytest.approx(0.5 + 0.5 * ratio, rel=1e-12)


def test_a_window_at_least_the_sequence_costs_the_same() -> None:
    full, wide = _instance(), _instance(sliding_window=4096)
    assert window_flops_fraction(wide.model, 1024) == window_tile_fraction(wide.model, 1024) == 1.0
    a, b = (Evaluator(i).evaluate(PLAN).iteration_time_s for i in (full, wide))
    assert a == b
    assert model_flops_per_iteration(full.model, full.training) == model_flops_per_iteration(
        wide.model, wide.training
    )


def test_a_short_window_costs_less_at_long_sequences() -> None:
    full, windowed = _instance(seq=16384), _instance(seq=16384, sliding_window=128)
    a, b = (Evaluator(i).evaluate(PLAN).iteration_time_s for i in (full, windowed))
    assert b < 0.8 * a
    fa, fb = (model_flops_per_iteration(i.model, i.training) for i in (full, windowed))
    assert fb < fa


def test_attention_sinks_cost_no_gemm_work_with_cudnn() -> None:
    plain, sinks = _instance(), _instance(attention_sinks=True)
    a, b = (Evaluator(i).evaluate(PLAN).iteration_time_s for i in (plain, sinks))
    # the same attention time; a sink logit per head is one more parameter to sync and step
    assert a < b == pytest.approx(a, rel=1e-6)


@pytest.mark.parametrize(
    ("model", "plan", "field", "rule"),
    [
        ({"sliding_window": 128}, {"cp": 2}, "plan.cp=2", "p2p context parallelism.*sliding"),
        ({"attention_sinks": True}, {"cp": 2}, "plan.cp=2", "no learnable softmax"),
        ({"sliding_window": 128}, {"flash_attention": False}, "kernel='fused-softmax'",
         "Transformer Engine's fused attention or FlashAttention >= 2.3"),
        ({"sliding_window": 128}, {"attention_kernel": "flash1"}, "plan.attention_kernel='flash1'",
         "not FlashAttention 1"),
        ({"attention_sinks": True}, {"attention_kernel": "flash2"}, "plan.attention_kernel='flash2'",
         "FlashAttention has no learnable softmax"),
        ({"mtp_layers": 1, "position_embedding": "learned"}, {}, "model.mtp_layers=1",
         "learned absolute position"),
    ],
)  # fmt: skip
def test_what_the_stack_does_not_run_is_refused(model, plan, field, rule) -> None:
    instance = _instance(**model)
    kw = {"num_layers": 8, "dp": 2, "pp": 2, "tp": 2, "micro_batch_size": 1, **plan}
    if kw.get("cp", 1) > 1:
        kw["dp"] = 1
    with pytest.raises(LayoutError, match=f"{field}.*{rule}"):
        Evaluator(instance).evaluate(make_plan(**kw))


def test_latent_attention_needs_unequal_head_widths_in_its_kernel() -> None:
    ds = load_model("deepseek-v3").model_copy(
        update={"num_layers": 8, "first_k_dense_layers": 0, "num_experts": 8, "moe_top_k": 2}
    )
    instance = small_instance(gpu="h100").model_copy(update={"model": ds})
    plan = make_plan(num_layers=8, dp=2, pp=2, tp=2, micro_batch_size=1, sequence_parallel=True,
                     attention_kernel="flash2")  # fmt: skip
    with pytest.raises(LayoutError, match=r"flash2 needs one head width.*192 .q/k. and 128"):
        Evaluator(instance).evaluate(plan)
    fine = plan.model_copy(update={"attention_kernel": "cudnn"})
    assert Evaluator(instance).evaluate(fine).iteration_time_s > 0


def test_qwen3_exports_its_qk_norm() -> None:
    instance = small_instance().model_copy(update={"model": load_model("qwen3-8b")})
    assert instance.model.qk_norm
    assert "--qk-layernorm" in model_args(instance)
