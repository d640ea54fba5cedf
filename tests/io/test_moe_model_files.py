"""Mixture-of-experts and latent-attention models: counts against published numbers,
the ModelSpec rules for the new fields, and ``pipette-cp show`` of a MoE instance.

Published counts are of two kinds, as in ``tests/specs/test_model.py``: a checkpoint's
exact parameter count (safetensors metadata), matched to the parameter, and figures
printed with a few digits (model cards, papers), matched to the rounding of the
printed figure; where a publisher cuts instead of rounding, the test says so.
"""

from __future__ import annotations

import math

import pytest
import yaml
from typer.testing import CliRunner

from pipette_cp.cli import app
from pipette_cp.errors import SpecError, UnsupportedError
from pipette_cp.io.model_file import load_model
from pipette_cp.specs import ModelSpec, validate_spec

#: name -> (parameters of the released checkpoint, where the number comes from)
EXACT = {
    "mixtral-8x7b": (46_702_792_704, "mistralai/Mixtral-8x7B-v0.1 safetensors metadata"),
    "qwen3-30b-a3b": (30_532_122_624, "Qwen/Qwen3-30B-A3B safetensors metadata"),
    "qwen3-235b-a22b": (235_093_634_560, "Qwen/Qwen3-235B-A22B safetensors metadata"),
    "grok-1": (315_684_820_992, "xai-org/grok-1 checkpoint, the sum of its 770 tensors"),
}
#: name -> (printed total, printed active, unit, source); active as the publisher counts it
PRINTED = {
    "mixtral-8x7b": ("46.7", "12.9", 1e9, "Mistral AI 2023, Mixtral of experts"),
    "qwen3-235b-a22b": ("235", "22", 1e9, "Qwen/Qwen3-235B-A22B model card"),
    "qwen3-30b-a3b": ("30.5", None, 1e9, "Qwen/Qwen3-30B-A3B model card (3.3B: see below)"),
}


def _half_unit(printed: str) -> float:
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return 0.5 * 10.0**-decimals


def _cut(value: float, printed: str) -> float:
    """``value`` cut (not rounded) to the digits of ``printed``."""
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return math.floor(value * 10**decimals) / 10**decimals


@pytest.mark.parametrize("name", sorted(EXACT))
def test_exact_published_count(name: str) -> None:
    assert load_model(name).total_params == EXACT[name][0]


@pytest.mark.parametrize("name", sorted(PRINTED))
def test_rounds_to_published_total_and_active(name: str) -> None:
    total, active, unit, _source = PRINTED[name]
    m = load_model(name)
    assert abs(m.total_params / unit - float(total)) <= _half_unit(total)
    if active is not None:
        assert abs(m.active_params / unit - float(active)) <= _half_unit(active)


def test_qwen3_30b_a3b_active_and_non_embedding() -> None:
    # Model card: 3.3B activated, 29.9B non-embedding.  Ours is 3.353B (embedding and LM
    # head included, as Qwen counts them: Qwen3-235B-A22B's 22B and the 29.9B agree),
    # which the card cuts to 3.3 rather than rounding to 3.4.
    m = load_model("qwen3-30b-a3b")
    assert m.active_params == 3_353_032_704
    assert _cut(m.active_params / 1e9, "3.3") == 3.3
    non_embedding = m.total_params - m.embedding_params - m.output_params
    assert round(non_embedding / 1e9, 1) == 29.9


def test_qwen3_235b_non_embedding() -> None:
    m = load_model("qwen3-235b-a22b")  # model card: 234B non-embedding
    assert round((m.total_params - m.embedding_params - m.output_params) / 1e9) == 234


def test_qwen3_8b_is_dense_with_qk_norm() -> None:
    # Qwen/Qwen3-8B safetensors metadata: 8,190,735,360; q_norm + k_norm of 128 per layer.
    m = load_model("qwen3-8b")
    assert not m.is_moe and m.total_params == m.active_params == 8_190_735_360
    without = m.model_copy(update={"qk_norm": False})
    assert m.total_params - without.total_params == 36 * 2 * 128


# ------------------------------------------------------------------ DeepSeek-V3
def test_deepseek_v3_main_model_is_671b_with_37b_active() -> None:
    # DeepSeek-V3 Technical Report: 671B total, 37B activated per token (the main model;
    # the MTP module comes on top).  DeepSeek's README_WEIGHTS.md: 36.6B activated
    # "including 0.9B for the output head", i.e. without the input embedding.
    m = load_model("deepseek-v3")
    main = m.model_copy(update={"mtp_layers": 0})
    assert main.total_params == 671_026_419_200
    assert round(main.total_params / 1e9) == 671
    assert main.active_params == 37_552_297_472
    assert round((main.active_params - m.embedding_params) / 1e9, 1) == 36.6
    assert _cut(main.active_params / 1e9, "37") == 37  # the report's 37B
    assert m.mtp_params == m.total_params - main.total_params == 11_610_068_224


def _fp8_block_scales(m: ModelSpec) -> int:
    """One float32 per 128 x 128 block of every FP8 matrix of the checkpoint: the
    attention and MLP projections of every layer and of the MTP block (DeepSeek-V3's
    quantization_config weight_block_size [128, 128]; embedding, head, routers, norms
    and eh_proj are BF16)."""

    def blocks(rows: int, cols: int) -> int:
        return -(-rows // 128) * -(-cols // 128)

    h, heads = m.hidden_size, m.num_attention_heads
    assert m.q_lora_rank and m.kv_lora_rank and m.qk_rope_head_dim and m.qk_nope_head_dim and m.v_head_dim  # fmt: skip
    qk = m.qk_nope_head_dim + m.qk_rope_head_dim
    attention = (blocks(m.q_lora_rank, h) + blocks(heads * qk, m.q_lora_rank)
                 + blocks(m.kv_lora_rank + m.qk_rope_head_dim, h)
                 + blocks(heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank)
                 + blocks(h, heads * m.v_head_dim))  # fmt: skip

    def mlp(width: int) -> int:
        return 2 * blocks(width, h) + blocks(h, width)

    experts = (m.num_experts + m.num_shared_experts) * mlp(m.expert_width)
    moe_blocks = m.num_moe_layers + m.mtp_layers
    return m.num_dense_layers * (attention + mlp(m.ffn_hidden_size)) + moe_blocks * (attention + experts)  # fmt: skip


def test_deepseek_v3_hugging_face_checkpoint_exactly() -> None:
    # deepseek-ai/DeepSeek-V3 safetensors metadata: 684,531,386,000 parameters
    # (BF16 3,918,786,560, F8_E4M3 680,571,043,840, F32 41,555,600).  The checkpoint's
    # MTP module (model.layers.61) stores its own copy of the embedding and the output
    # head, and every FP8 matrix a float32 scale per 128 x 128 block.
    m = load_model("deepseek-v3")
    copies = 2 * m.vocab_size * m.hidden_size
    scales = _fp8_block_scales(m)
    assert m.total_params + copies + scales == 684_531_386_000
    expert_bias = (m.num_moe_layers + m.mtp_layers) * m.num_experts
    assert scales + expert_bias == 41_555_600  # the F32 tensors
    routers = (m.num_moe_layers + m.mtp_layers) * m.num_experts * m.hidden_size
    per_block_norms = 2 * m.hidden_size + m.q_lora_rank + m.kv_lora_rank  # type: ignore[operator]
    bf16 = (4 * m.vocab_size * m.hidden_size + routers + 2 * m.hidden_size**2
            + (m.num_layers + m.mtp_layers) * per_block_norms + 4 * m.hidden_size)  # fmt: skip
    assert bf16 == 3_918_786_560


def test_deepseek_v3_parts() -> None:
    m = load_model("deepseek-v3")
    # q_a 7168x1536 + norm 1536 + q_b 1536x128x192 + kv_a 7168x576 + norm 512
    # + kv_b 512x128x256 + o 16384x7168
    assert m.attention_params == 187_107_328
    assert m.head_size == 192 and m.kv_heads == 128
    assert [m.is_moe_layer(i) for i in range(5)] == [False, False, False, True, True]
    assert (m.num_dense_layers, m.num_moe_layers) == (3, 58)
    assert m.router_params == 256 * 7168 + 256  # the expert bias
    assert m.shared_expert_params == m.expert_params == 3 * 7168 * 2048


# ------------------------------------------------------------------ Grok-1
def test_grok_1() -> None:
    # xai-org/grok-1 README: 314B parameters; the checkpoint holds 315,684,820,992.
    # 314B is the count without the (tied) embedding cut to whole billions.
    m = load_model("grok-1")
    assert m.total_params == 315_684_820_992
    assert math.floor((m.total_params - m.embedding_params) / 1e9) == 314
    without = m.model_copy(update={"post_sublayer_norm": False})
    assert m.total_params - without.total_params == 64 * 2 * 6144


# ------------------------------------------------------------------ spec rules
BASE = {"name": "m", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
        "ffn_hidden_size": 1024, "vocab_size": 1000, "max_seq_length": 256,
        "activation": "swiglu", "norm": "rmsnorm", "position_embedding": "rope",
        "linear_bias": False}  # fmt: skip
MLA = {"qk_rope_head_dim": 16, "qk_nope_head_dim": 32, "v_head_dim": 32, "kv_lora_rank": 64}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"num_experts": 8, "moe_top_k": 9}, "model.moe_top_k=9: exceeds num_experts=8"),
        ({"moe_ffn_hidden_size": 512}, "model.moe_ffn_hidden_size=512: an expert setting on a dense model (num_experts=1)"),
        ({"first_k_dense_layers": 1}, "model.first_k_dense_layers=1: an expert setting on a dense model"),
        ({"moe_capacity_factor": 1.25}, "model.moe_capacity_factor=1.25: an expert setting on a dense model"),
        ({"num_experts": 8, "first_k_dense_layers": 4}, "model.first_k_dense_layers=4: must be below num_layers=4"),
        ({"num_experts": 8, "moe_layer_freq": 0}, "model.moe_layer_freq=0: Input should be greater than 0"),
        ({"num_experts": 8, "shared_expert_ffn_hidden_size": 512}, "model.shared_expert_ffn_hidden_size=512: needs num_shared_experts > 0"),
        ({"kv_lora_rank": 64, "qk_rope_head_dim": 16}, "model.kv_lora_rank=64: multi-head latent attention also needs qk_nope_head_dim, v_head_dim"),
        ({"qk_rope_head_dim": 16}, "model='{...}': qk_rope_head_dim=16: a multi-head latent attention width without kv_lora_rank"),
        ({**MLA, "num_kv_heads": 2}, "model.kv_lora_rank=64: latent attention has no key/value heads of its own"),
        ({**MLA, "qk_norm": True}, "model.kv_lora_rank=64: biases and q/k norms are not modelled"),
        ({"yarn_scaling_factor": 4}, "model='{...}': yarn_scaling_factor=4: needs yarn_original_max_seq_length"),
        ({"sliding_window_pattern": 2}, "model.sliding_window_pattern=2: needs sliding_window"),
    ],
)  # fmt: skip
def test_bad_expert_and_latent_fields(fields: dict, message: str) -> None:
    with pytest.raises(SpecError) as err:
        validate_spec(ModelSpec, {**BASE, **fields}, "model")
    text = str(err.value)
    assert "\n" not in text and text.startswith(message), text


def test_neutral_expert_values_are_fine_on_a_dense_model() -> None:
    dense = validate_spec(ModelSpec, {**BASE, "moe_layer_freq": 1, "moe_z_loss_coeff": 0.0}, "m")
    assert not dense.is_moe and dense.num_moe_layers == 0 and dense.router_params == 0
    assert dense.total_params == dense.active_params


def test_layer_pattern_and_counts_of_a_small_moe() -> None:
    m = validate_spec(ModelSpec, {**BASE, "num_layers": 7, "num_experts": 4, "moe_top_k": 2,
                                  "moe_ffn_hidden_size": 128, "first_k_dense_layers": 1,
                                  "moe_layer_freq": 2, "num_shared_experts": 2}, "m")  # fmt: skip
    assert [i for i in range(7) if m.is_moe_layer(i)] == [1, 3, 5]
    assert (m.num_moe_layers, m.num_dense_layers) == (3, 4)
    expert = 3 * 256 * 128
    assert m.shared_expert_params == 2 * expert  # two shared experts, one MLP of 256
    per_moe = m.attention_params + 4 * expert + 2 * expert + 256 * 4 + 2 * 256
    assert m.moe_layer_params == per_moe
    assert m.total_params - m.active_params == 3 * 2 * expert  # 2 routed experts unused
    with pytest.raises(
        UnsupportedError, match=r"model\.num_experts=4: mixture-of-experts models are not modelled"
    ):
        _ = m.params_per_layer


def test_latent_attention_without_query_compression() -> None:
    m = validate_spec(ModelSpec, {**BASE, **MLA}, "m")
    queries = 256 * 8 * 48
    latent = 256 * (64 + 16) + 64 + 64 * 8 * (32 + 32)
    assert m.attention_params == queries + latent + 8 * 32 * 256
    with_q = validate_spec(ModelSpec, {**BASE, **MLA, "q_lora_rank": 96}, "m")
    assert with_q.attention_params - m.attention_params == 256 * 96 + 96 + 96 * 8 * 48 - queries


# ------------------------------------------------------------------ show
def test_show_prints_a_moe_model_with_total_and_active(tmp_path) -> None:  # type: ignore[no-untyped-def]
    inst = tmp_path / "moe.yaml"
    inst.write_text(yaml.safe_dump({
        "model": "deepseek-v3",
        "cluster": {"generator": {"kind": "g1", "nodes": 2, "seed": 0}},
        "training": {"global_batch_size": 8, "seq_length": 256},
    }))  # fmt: skip
    result = CliRunner().invoke(app, ["show", str(inst)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    out = result.output
    for needle in ("Model deepseek-v3", "682.64B", "38.24B", "256 x 2048", "latent", "MTP"):
        assert needle in out, (needle, out)
