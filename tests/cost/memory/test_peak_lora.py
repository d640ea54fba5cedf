"""LoRA's memory: the frozen base keeps its weights alone, the adapters the full
mixed-precision state, and each adapter its rank-r intermediate.

The tiny model of ``tests/cost/workload/test_lora.py``: 2 layers, 8192 adapter parameters
a layer at rank 8 (16,384 on one stage), 8192 B of intermediates a layer and
micro-batch.  Megatron-Core's bytes: bf16 weight 2 B, fp32 gradient 4 B, master weight and
two Adam moments 12 B.
"""

from __future__ import annotations

import pytest

from pipette_cp.cost.memory.activations import frozen_weight_copy_bytes
from pipette_cp.cost.memory.limits import in_flight_microbatches, num_microbatches
from pipette_cp.cost.memory.peak import activation_bytes_per_layer, stage_memory
from pipette_cp.cost.workload.parameters import layer_gemm_params_per_gpu
from pipette_cp.specs.layouts import make_plan
from pipette_cp.specs.lora import LoraSpec
from pipette_cp.specs.training import TrainingSpec
from tests.models import gpt_model

MODEL = gpt_model("tiny", 2, 64, 4, ffn_hidden_size=256, vocab_size=1000, max_seq_length=128)
FULL = TrainingSpec(global_batch_size=8, seq_length=64)
LORA = FULL.model_copy(update={"lora": LoraSpec(rank=8)})
ADAPTERS = 16384


def plan(**knobs: object):
    knobs = {
        "dp": 1,
        "pp": 1,
        "tp": 1,
        "micro_batch_size": 2,
        "distributed_optimizer": False,
    } | knobs
    return make_plan(num_layers=2, **knobs)


def test_state_bytes_of_a_frozen_base_and_trained_adapters() -> None:
    """Weights: the base's as before plus 16,384 x 2 = 32,768 B of adapters; gradients
    16,384 x 4 = 65,536 B; optimizer state 16,384 x 12 = 196,608 B (nothing of the base)."""
    full, lora = (stage_memory(MODEL, t, plan(), 0) for t in (FULL, LORA))
    assert lora.weights - full.weights == ADAPTERS * 2 == 32768
    assert lora.gradients == ADAPTERS * 4 == 65536
    assert lora.optimizer_state == ADAPTERS * 12 == 196608


def test_the_distributed_optimizer_shards_the_adapters_state() -> None:
    """dp = 2: 12 B / 2 per adapter parameter, 98,304 B; the gradients stay whole."""
    lora = stage_memory(MODEL, LORA, plan(dp=2, distributed_optimizer=True), 0)
    assert lora.optimizer_state == ADAPTERS * 6 == 98304
    assert lora.gradients == ADAPTERS * 4


def test_the_adapters_intermediates_are_kept_per_layer_and_micro_batch() -> None:
    """Each layer keeps 8192 B more per micro-batch; the stage's 2 layers times the
    micro-batches in flight."""
    p = plan()
    per_layer = (activation_bytes_per_layer(MODEL, t, p) for t in (LORA, FULL))
    assert next(per_layer) - next(per_layer) == 8192
    units = in_flight_microbatches(p, 0, num_microbatches(FULL, p))
    full, lora = (stage_memory(MODEL, t, p, 0) for t in (FULL, LORA))
    assert lora.activations - full.activations == pytest.approx(2 * units * 8192, rel=1e-12)


def test_full_recompute_keeps_the_layer_input_alone() -> None:
    """Full recomputation keeps 2 s b h per layer whatever the adapters: 2 x 128 x 64."""
    p = plan(recompute="full")
    assert activation_bytes_per_layer(MODEL, LORA, p) == activation_bytes_per_layer(MODEL, FULL, p)
    assert activation_bytes_per_layer(MODEL, LORA, p) == 2 * 128 * 64


def test_frozen_linears_without_an_adapter_keep_no_input() -> None:
    """Adapters on the attention alone: FC1 and FC2 are frozen and adapter-free, so neither
    keeps its input (128 tokens x 2 B x (h = 64 + f = 256) = 81,920 B less), and two
    adapters' intermediates instead of four (2 x 128 x 8 x 2 = 4,096 B less)."""
    attention = LORA.model_copy(
        update={"lora": LoraSpec(rank=8, target_modules=("linear_qkv", "linear_proj"))}
    )
    p = plan()
    every, attention_only = (activation_bytes_per_layer(MODEL, t, p) for t in (LORA, attention))
    assert every - attention_only == 128 * 2 * (64 + 256) + 2 * 128 * 8 * 2 == 86016


def test_fp8_lora_casts_the_frozen_weights_every_micro_batch() -> None:
    """Under FP8 the LoRA recipes keep no FP8 weight cache: no FP8 copies among the
    weights (full FP8 training keeps 2 x 1 B per GEMM weight), and each micro-batch keeps
    the column-wise FP8 copy (1 B per GEMM weight) for the data gradient instead of the
    FP8 inputs of the frozen linears' weight gradients."""
    fp8_full = FULL.model_copy(update={"precision": "fp8"})
    fp8_lora = LORA.model_copy(update={"precision": "fp8"})
    p = plan()
    gemm = layer_gemm_params_per_gpu(MODEL, 1)
    full, lora = (stage_memory(MODEL, t, p, 0) for t in (fp8_full, fp8_lora))
    bf16_full = stage_memory(MODEL, FULL, p, 0)
    assert full.weights - bf16_full.weights == 2 * 2 * gemm  # two layers, two 1-B copies
    assert lora.weights - bf16_full.weights == ADAPTERS * 2  # the adapters' bf16 weights only
    assert frozen_weight_copy_bytes(MODEL, fp8_lora, p) == gemm
    assert frozen_weight_copy_bytes(MODEL, LORA, p) == 0.0  # bf16: nothing cast
