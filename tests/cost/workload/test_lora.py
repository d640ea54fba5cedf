"""LoRA's adapters on one GPU: parameters, GEMMs, FLOPs and kept intermediates, worked by
hand on a tiny model.

The model: 2 GPT layers of h = 64 (4 heads of 16, MHA), an MLP of f = 256 (GeLU).  The
adapted linears (in-width a, out-width b): QKV (64, 192), projection (64, 64), FC1
(64, 256), FC2 (256, 64); their a + b sum to 256 + 128 + 320 + 320 = 1024.  Rank 8: an
adapter layer holds 8 x 1024 = 8192 parameters.  Sequences of 64 tokens, micro-batches of
2: T = 128 tokens a GPU (cp = 1).
"""

from __future__ import annotations

import pytest

from pipette_cp.cost.workload.flops import ATTENTION_CORE, Gemm, layer_gemms
from pipette_cp.cost.workload.lora import (
    adapter_activation_bytes,
    adapter_gemms,
    adapter_params_per_layer,
    adapter_widths,
    stage_adapter_params,
    trained_param_split,
)
from pipette_cp.cost.workload.parameters import stage_param_split
from pipette_cp.specs.layouts import make_plan
from pipette_cp.specs.lora import LoraSpec
from pipette_cp.specs.training import TrainingSpec
from tests.models import gpt_model

MODEL = gpt_model("tiny", 2, 64, 4, ffn_hidden_size=256, vocab_size=1000, max_seq_length=128)
LORA = LoraSpec(rank=8)
FULL = TrainingSpec(global_batch_size=8, seq_length=64)
TRAIN = FULL.model_copy(update={"lora": LORA})


def plan(**knobs: object):
    return make_plan(num_layers=2, **({"dp": 1, "pp": 1, "tp": 1, "micro_batch_size": 2} | knobs))


def test_adapter_widths_and_parameters() -> None:
    assert adapter_widths(MODEL, LORA) == (
        ("linear_qkv", 64, 192), ("linear_proj", 64, 64), ("linear_fc1", 64, 256),
        ("linear_fc2", 256, 64),
    )  # fmt: skip
    assert adapter_params_per_layer(MODEL, LORA, 1) == 8192
    assert adapter_params_per_layer(MODEL, LORA, 2) == 4096  # A or B split over tp
    attention = LoraSpec(rank=8, target_modules=("linear_qkv", "linear_proj"))
    assert adapter_params_per_layer(MODEL, attention, 1) == 8 * (256 + 128)  # 3072


def test_swiglu_and_gqa_widths() -> None:
    """Llama-style: 8 heads of 16, 2 of them for keys and values, SwiGLU of f = 256: QKV
    out (8 + 2 x 2) x 16 = 192, FC1 out 2 x 256 = 512."""
    llama = gpt_model("l", 2, 128, 8, num_kv_heads=2, ffn_hidden_size=256,
                      activation="swiglu")  # fmt: skip
    widths = dict((n, (a, b)) for n, a, b in adapter_widths(llama, LORA))
    assert widths["linear_qkv"] == (128, 192) and widths["linear_fc1"] == (128, 512)


def test_stage_parameters_and_what_is_trained() -> None:
    """Two layers on the one stage: 2 x 8192 adapters; pp = 2 puts one layer on each."""
    assert stage_adapter_params(MODEL, TRAIN, plan(), 0) == 16384
    assert [stage_adapter_params(MODEL, TRAIN, plan(pp=2), s) for s in (0, 1)] == [8192, 8192]
    assert trained_param_split(MODEL, TRAIN, plan(), 0) == (16384, 0.0)
    assert stage_adapter_params(MODEL, FULL, plan(), 0) == 0.0
    assert trained_param_split(MODEL, FULL, plan(), 0) == stage_param_split(MODEL, plan(), 0)


def test_adapter_gemms_and_their_flops() -> None:
    """Forward FLOPs 2 T r (a + b) summed: 2 x 128 x 8 x 1024 = 2,097,152; half a rank's
    with tp = 2 (A's rank split for column-parallel linears, its input for row-parallel
    ones; B's output split)."""
    gemms = adapter_gemms(MODEL, TRAIN, plan())
    assert gemms[:2] == (
        Gemm("linear_qkv.lora_a", 128, 8, 64),
        Gemm("linear_qkv.lora_b", 128, 192, 8),
    )
    assert gemms[6] == Gemm("linear_fc2.lora_a", 128, 8, 256)
    assert sum(g.flops for g in gemms) == 2_097_152
    split = adapter_gemms(MODEL, TRAIN, plan(tp=2))
    assert split[0] == Gemm("linear_qkv.lora_a", 128, 4, 64)  # column-parallel: r / t
    assert split[2] == Gemm("linear_proj.lora_a", 128, 8, 32)  # row-parallel: a / t
    assert sum(g.flops for g in split) == 1_048_576
    assert adapter_gemms(MODEL, FULL, plan()) == ()


def test_frozen_backward_is_the_data_gradient_alone() -> None:
    """Base layer GEMMs (QKV, projection, FC1, FC2) forward: 2 T (64 x 192 + 64 x 64 + 64 x
    256 + 256 x 64) = 2 x 128 x 49152 = 12,582,912 FLOPs; frozen, their backward is the
    same (dgrad), trained twice that; the adapters' backward is twice their forward."""
    base = [g for g in layer_gemms(MODEL, 64, 2, 1) if g.name not in ATTENTION_CORE]
    forward = sum(g.flops for g in base)
    assert forward == 12_582_912
    assert sum(x.flops for g in base for x in g.backward(frozen=True)) == forward
    assert sum(x.flops for g in base for x in g.backward()) == 2 * forward
    assert [x.name for x in base[0].backward(frozen=True)] == ["qkv.dgrad"]
    adapters = adapter_gemms(MODEL, TRAIN, plan())
    assert sum(x.flops for g in adapters for x in g.backward()) == 2 * 2_097_152


def test_kept_intermediates() -> None:
    """Each adapter keeps its rank-r intermediate, 2 B: 4 x 128 x 8 x 2 = 8192 B; cp = 2
    halves the tokens; two targets half the bytes."""
    assert adapter_activation_bytes(MODEL, TRAIN, plan()) == 8192
    assert adapter_activation_bytes(MODEL, TRAIN, plan(dp=1, cp=2)) == 4096
    two = TRAIN.model_copy(
        update={"lora": LoraSpec(rank=8, target_modules=("linear_qkv", "linear_fc2"))}
    )
    assert adapter_activation_bytes(MODEL, two, plan()) == 4096
    assert adapter_activation_bytes(MODEL, FULL, plan()) == 0.0


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_adapter_flops_never_exceed_the_weight_gradients_they_replace_at_low_rank(tp: int) -> None:
    """r <= min(a, b) / 4 gives r (a + b) <= a b / 2: the adapters' forward and backward
    (3 x 2 T r (a + b) / t) stay below the skipped weight gradients (2 T a b / t)."""
    lora = LoraSpec(rank=16)  # min width 64: 16 = 64 / 4
    train = FULL.model_copy(update={"lora": lora})
    base = [g for g in layer_gemms(MODEL, 64, 2, tp) if g.name not in ATTENTION_CORE]
    wgrad = sum(g.flops for g in base)
    adapters = sum(3 * g.flops for g in adapter_gemms(MODEL, train, plan(tp=tp)))
    assert adapters <= wgrad
