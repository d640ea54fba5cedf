"""Hugging Face config.json of the mixture-of-experts families (and Qwen3, Gemma).

The configs are written inline: the architecture keys of each released config.json
(bookkeeping keys such as token ids and dtype left out, the loader ignores them).
The bundled model files must equal the import of their config.json, and the
families without a bundled file are checked against their checkpoints' counts.
"""

from __future__ import annotations

from typing import Any

import pytest

from pipette_cp.errors import SpecError, UnsupportedError
from pipette_cp.io.huggingface.config import SUPPORTED_MODEL_TYPES, model_from_hf_config
from pipette_cp.io.model_file import load_model
from pipette_cp.specs import ModelSpec

QWEN3_8B = {  # Qwen/Qwen3-8B
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 12288,
    "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 151936,
}  # fmt: skip
QWEN3_30B_A3B = {  # Qwen/Qwen3-30B-A3B
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "decoder_sparse_step": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
    "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": False,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001, "sliding_window": None, "tie_word_embeddings": False,
    "use_sliding_window": False, "vocab_size": 151936,
}  # fmt: skip
QWEN3_235B_A22B = {  # Qwen/Qwen3-235B-A22B: the 30B's keys with these widths
    **QWEN3_30B_A3B, "hidden_size": 4096, "intermediate_size": 12288, "max_window_layers": 94,
    "moe_intermediate_size": 1536, "num_attention_heads": 64, "num_hidden_layers": 94,
}  # fmt: skip
QWEN15_MOE_A27B = {  # Qwen/Qwen1.5-MoE-A2.7B
    "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "decoder_sparse_step": 1,
    "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 5632,
    "max_position_embeddings": 8192, "max_window_layers": 21, "model_type": "qwen2_moe",
    "moe_intermediate_size": 1408, "norm_topk_prob": False, "num_attention_heads": 16,
    "num_experts": 60, "num_experts_per_tok": 4, "num_hidden_layers": 24,
    "num_key_value_heads": 16, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 5632,
    "sliding_window": 32768, "tie_word_embeddings": False, "use_sliding_window": False,
    "vocab_size": 151936,
}  # fmt: skip
YARN_40 = {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
           "original_max_position_embeddings": 4096, "type": "yarn"}  # fmt: skip
DEEPSEEK_V3 = {  # deepseek-ai/DeepSeek-V3 (quantization_config left out)
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
    "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
    "model_type": "deepseek_v3", "moe_intermediate_size": 2048, "moe_layer_freq": 1,
    "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
    "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": YARN_40, "rope_theta": 10000, "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid", "seq_aux": True, "tie_word_embeddings": False, "topk_group": 4,
    "topk_method": "noaux_tc", "v_head_dim": 128, "vocab_size": 129280,
}  # fmt: skip
DEEPSEEK_V2 = {  # deepseek-ai/DeepSeek-V2
    "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001, "first_k_dense_replace": 1, "hidden_act": "silu",
    "hidden_size": 5120, "intermediate_size": 12288, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "model_type": "deepseek_v2", "moe_intermediate_size": 1536,
    "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 160, "n_shared_experts": 2,
    "norm_topk_prob": False, "num_attention_heads": 128, "num_experts_per_tok": 6,
    "num_hidden_layers": 60, "num_key_value_heads": 128, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": YARN_40, "rope_theta": 10000, "routed_scaling_factor": 16.0,
    "scoring_func": "softmax", "seq_aux": True, "tie_word_embeddings": False, "topk_group": 3,
    "topk_method": "group_limited_greedy", "v_head_dim": 128, "vocab_size": 102400,
}  # fmt: skip
DEEPSEEK_V2_LITE = {  # deepseek-ai/DeepSeek-V2-Lite: no query compression
    **DEEPSEEK_V2, "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408,
    "n_routed_experts": 64, "num_attention_heads": 16, "num_key_value_heads": 16,
    "num_hidden_layers": 27, "q_lora_rank": None, "topk_method": "greedy", "n_group": 1,
    "topk_group": 1, "routed_scaling_factor": 1.0,
}  # fmt: skip
LLAMA4_MAVERICK = {  # meta-llama/Llama-4-Maverick-17B-128E (vision_config left out)
    "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
    "tie_word_embeddings": False,
    "text_config": {
        "attention_bias": False, "attention_chunk_size": 8192, "attention_dropout": 0.0,
        "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
        "interleave_moe_layer_step": 2, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
        "max_position_embeddings": 1048576, "model_type": "llama4_text", "num_attention_heads": 40,
        "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8,
        "num_local_experts": 128, "rms_norm_eps": 1e-05, "rope_scaling": None,
        "rope_theta": 500000.0, "router_aux_loss_coef": 0.001, "use_qk_norm": False,
        "vocab_size": 202048,
    },
}  # fmt: skip
GPT_OSS_120B = {  # openai/gpt-oss-120b (quantization_config left out)
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
    "initial_context_length": 4096, "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 18, "max_position_embeddings": 131072,
    "model_type": "gpt_oss", "num_attention_heads": 64, "num_experts_per_tok": 4,
    "num_hidden_layers": 36, "num_key_value_heads": 8, "num_local_experts": 128,
    "rms_norm_eps": 1e-05, "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
    "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000, "sliding_window": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": False, "vocab_size": 201088,
}  # fmt: skip
GPT_OSS_20B = {**GPT_OSS_120B, "num_hidden_layers": 24, "num_local_experts": 32,
               "layer_types": ["sliding_attention", "full_attention"] * 12}  # fmt: skip


def _architecture(model: ModelSpec) -> dict[str, Any]:
    return model.model_dump(exclude={"name", "source"})


def _message(err: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(err.value)
    assert text and "\n" not in text
    return text


@pytest.mark.parametrize(
    ("bundled", "config"),
    [("qwen3-8b", QWEN3_8B), ("qwen3-30b-a3b", QWEN3_30B_A3B),
     ("qwen3-235b-a22b", QWEN3_235B_A22B), ("deepseek-v3", DEEPSEEK_V3)],
)  # fmt: skip
def test_bundled_file_equals_the_import_of_its_config(bundled: str, config: dict) -> None:
    assert _architecture(model_from_hf_config(config, bundled)) == _architecture(load_model(bundled))  # fmt: skip


def test_every_family_is_supported() -> None:
    for family in ("qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3",
                   "llama4", "llama4_text", "gpt_oss"):  # fmt: skip
        assert family in SUPPORTED_MODEL_TYPES


#: config -> (checkpoint's parameters, source)
CHECKPOINTS = [
    (QWEN15_MOE_A27B, 14_315_784_192, "Qwen/Qwen1.5-MoE-A2.7B safetensors metadata"),
    (DEEPSEEK_V2, 235_741_434_880, "deepseek-ai/DeepSeek-V2 safetensors metadata"),
    (DEEPSEEK_V2_LITE, 15_706_484_224, "deepseek-ai/DeepSeek-V2-Lite safetensors metadata"),
    (GPT_OSS_20B, 20_914_757_184, "openai/gpt-oss-20b safetensors metadata"),
    (GPT_OSS_120B, 116_829_156_672, "openai/gpt-oss-120b safetensors metadata"),
]


@pytest.mark.parametrize(("config", "published", "source"), CHECKPOINTS, ids=lambda c: str(c)[:12])
def test_checkpoint_counts_exactly(config: dict, published: int, source: str) -> None:
    assert model_from_hf_config(config, "m").total_params == published


def test_published_active_counts() -> None:
    # Qwen1.5-MoE-A2.7B: 2.7B activated (embedding and head included, as Qwen counts);
    # DeepSeek-V2 (DeepSeek-AI 2024): 21B activated; gpt-oss model card: 5.1B and 3.6B
    # active for 120b and 20b, without the input embedding.
    assert round(model_from_hf_config(QWEN15_MOE_A27B, "m").active_params / 1e9, 1) == 2.7
    assert round(model_from_hf_config(DEEPSEEK_V2, "m").active_params / 1e9) == 21
    for config, active in ((GPT_OSS_120B, 5.1), (GPT_OSS_20B, 3.6)):
        m = model_from_hf_config(config, "m")
        assert round((m.active_params - m.vocab_size * m.hidden_size) / 1e9, 1) == active


def test_qwen2_moe_has_a_gated_shared_expert_and_qkv_biases() -> None:
    m = model_from_hf_config(QWEN15_MOE_A27B, "m")
    assert (m.qkv_bias, m.num_shared_experts, m.shared_expert_width, m.shared_expert_gate) == (True, 1, 5632, True)  # fmt: skip
    assert m.shared_expert_params == 3 * 2048 * 5632 + 2048
    assert (m.num_experts, m.moe_top_k, m.expert_width) == (60, 4, 1408)


def test_decoder_sparse_step_puts_experts_on_every_kth_layer() -> None:
    m = model_from_hf_config({**QWEN3_30B_A3B, "decoder_sparse_step": 2}, "m")
    assert [i for i in range(6) if m.is_moe_layer(i)] == [1, 3, 5]  # (i + 1) % 2 == 0
    assert (m.num_moe_layers, m.num_dense_layers, m.ffn_hidden_size) == (24, 24, 6144)


def test_deepseek_v2_lite_has_no_query_compression() -> None:
    m = model_from_hf_config(DEEPSEEK_V2_LITE, "m")
    assert m.q_lora_rank is None and m.kv_lora_rank == 512
    assert m.attention_params == 2048 * 16 * 192 + 2048 * 576 + 512 + 512 * 16 * 256 + 16 * 128 * 2048  # fmt: skip
    v3 = model_from_hf_config(DEEPSEEK_V3, "m")
    assert (v3.moe_router_expert_bias, v3.mtp_layers, v3.yarn_scaling_factor) == (True, 1, 40)
    v2 = model_from_hf_config(DEEPSEEK_V2, "m")
    assert (v2.moe_router_expert_bias, v2.mtp_layers, v2.moe_router_aux_loss_coeff) == (False, 0, 0.001)  # fmt: skip
    assert "n_group" in v3.source  # the routing details it does not record


def test_deepseek_moe_layer_freq_in_hugging_face_terms() -> None:
    # DeepseekV3MoE on layer i when i >= first_k_dense_replace and i % moe_layer_freq == 0
    m = model_from_hf_config({**DEEPSEEK_V3, "first_k_dense_replace": 3, "moe_layer_freq": 2}, "m")
    assert (m.first_k_dense_layers, m.moe_layer_freq) == (4, 2)
    assert [i for i in range(9) if m.is_moe_layer(i)] == [4, 6, 8]


def test_llama4_maverick_text_model() -> None:
    # Meta: 17B active, 400B total (the text model here: the vision encoder is not read)
    m = model_from_hf_config(LLAMA4_MAVERICK, "m")
    assert [i for i in range(4) if m.is_moe_layer(i)] == [1, 3]  # interleave_moe_layer_step 2
    assert (m.num_shared_experts, m.expert_width, m.ffn_hidden_size) == (1, 8192, 16384)
    assert round(m.active_params / 1e9) == 17
    assert m.total_params == pytest.approx(400e9, rel=0.002)
    assert "attention_chunk_size" in m.source
    text_only = {**LLAMA4_MAVERICK["text_config"], "model_type": "llama4_text"}  # type: ignore[dict-item]
    assert _architecture(model_from_hf_config(text_only, "m")) == _architecture(m)


def test_gpt_oss_sinks_biases_and_sliding_window() -> None:
    m = model_from_hf_config(GPT_OSS_20B, "m")
    assert (m.attention_sinks, m.linear_bias, m.head_dim) == (True, True, 64)
    assert (m.sliding_window, m.sliding_window_pattern) == (128, 2)
    assert (m.yarn_scaling_factor, m.yarn_original_max_seq_length) == (32, 4096)
    assert m.router_params == 32 * 2880 + 32  # the router's bias
    assert m.expert_params == 3 * 2880 * 2880 + 2 * 2880 + 2880  # gate_up and down biases


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"model_type": "gemma2", "hidden_size": 3584}, "config.json: model_type='gemma2': Gemma 2's GeGLU MLP, its logit soft-capping"),
        ({"model_type": "gemma3", "text_config": {}}, "config.json: model_type='gemma3': Gemma 3's GeGLU MLP and its sliding-window layers"),
        ({**QWEN3_30B_A3B, "mlp_only_layers": [0, 1]}, "config.json: mlp_only_layers=[0, 1]: dense layers listed by index are not modelled"),
        ({**QWEN3_8B, "use_sliding_window": True}, "config.json: use_sliding_window=True: Qwen's sliding-window layers are not modelled"),
        ({**DEEPSEEK_V3, "attention_bias": True}, "config.json: attention_bias=True: biases in multi-head latent attention"),
        ({**DEEPSEEK_V3, "num_key_value_heads": 16}, "config.json: num_key_value_heads=16: multi-head latent attention: expected num_attention_heads=128"),
        ({**DEEPSEEK_V3, "first_k_dense_replace": 61}, "config.json: first_k_dense_replace=61: leaves no mixture-of-experts layer"),
        ({**DEEPSEEK_V3, "rope_scaling": {**YARN_40, "beta_fast": 16}}, "config.json: rope_scaling.beta_fast=16: only YaRN with beta_fast 32 is modelled"),
        ({**QWEN3_8B, "rope_scaling": {**YARN_40}}, "config.json: rope_scaling.rope_type='yarn': only Llama 3.1's 'llama3' RoPE scaling"),
        ({**LLAMA4_MAVERICK, "text_config": {**LLAMA4_MAVERICK["text_config"], "moe_layers": [0, 2]}}, "config.json: text_config.moe_layers=[0, 2]: only every interleave_moe_layer_step=2-th layer"),  # type: ignore[dict-item]
        ({**GPT_OSS_20B, "layer_types": ["full_attention", "sliding_attention"] * 12}, "config.json: layer_types=['full_attention', 'sliding_attention',"),
        ({**GPT_OSS_20B, "experts_per_token": 2}, "config.json: experts_per_token=2: differs from num_experts_per_tok"),
        ({key: v for key, v in DEEPSEEK_V3.items() if key != "kv_lora_rank"}, "config.json: kv_lora_rank=None: missing; required in a 'deepseek_v3' config"),
        ({**QWEN3_30B_A3B, "num_experts_per_tok": 200}, "config.json: num_experts_per_tok=200: exceeds num_experts=128"),
    ],
)  # fmt: skip
def test_refused_configs(config: dict, message: str) -> None:
    with pytest.raises(SpecError) as err:
        model_from_hf_config(config, "m", path="config.json")
    assert _message(err).startswith(message), _message(err)


def test_gemma_refusal_is_unsupported() -> None:
    with pytest.raises(UnsupportedError):
        model_from_hf_config({"architectures": ["Gemma2ForCausalLM"]}, "m")
