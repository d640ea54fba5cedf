"""Hugging Face config.json of the hybrid Mamba-Transformer family ``nemotron_h``.

The configs are written inline: the architecture keys of each released config.json
(bookkeeping keys such as token ids, ``auto_map`` and dtype left out, the loader ignores
them).  Nemotron-H 8B is dense (Mamba-2, attention and squared-ReLU MLP sublayers),
Nemotron 3 Nano has mixture-of-experts sublayers; both must equal their bundled files.
"""

from __future__ import annotations

from typing import Any

import pytest

from pipette_cp.errors import SpecError, UnsupportedError
from pipette_cp.io.huggingface.config import SUPPORTED_MODEL_TYPES, model_from_hf_config
from pipette_cp.io.model_file import load_model
from pipette_cp.specs import ModelSpec

NEMOTRON_H_8B = {  # nvidia/Nemotron-H-8B-Base-8K
    "architectures": ["NemotronHForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attention_head_dim": 128, "chunk_size": 128, "conv_kernel": 4, "expand": 2,
    "hidden_dropout": 0.0, "hidden_size": 4096,
    "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
    "initializer_range": 0.02, "intermediate_size": 21504, "layer_norm_epsilon": 1e-05,
    "mamba_head_dim": 64, "mamba_hidden_act": "silu", "mamba_num_heads": 128,
    "mamba_proj_bias": False, "max_position_embeddings": 8192, "mlp_bias": False,
    "mlp_hidden_act": "relu2", "model_type": "nemotron_h", "n_groups": 8,
    "num_attention_heads": 32, "num_hidden_layers": 52, "num_key_value_heads": 8,
    "num_logits_to_keep": 1, "rescale_prenorm_residual": True, "residual_in_fp32": False,
    "rms_norm_eps": 1e-05, "ssm_state_size": 128, "tie_word_embeddings": False,
    "use_bias": False, "use_cache": True, "use_conv_bias": True, "use_mamba_kernels": True,
    "vocab_size": 131072,
}  # fmt: skip
NEMOTRON_3_NANO = {  # nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16
    "architectures": ["NemotronHForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "chunk_size": 128, "conv_kernel": 4, "expand": 2, "head_dim": 128, "hidden_dropout": 0.0,
    "hidden_size": 2688,
    "hybrid_override_pattern": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
    "initializer_range": 0.02, "intermediate_size": 1856, "layer_norm_epsilon": 1e-05,
    "mamba_head_dim": 64, "mamba_hidden_act": "silu", "mamba_num_heads": 64,
    "mamba_proj_bias": False, "mamba_ssm_cache_dtype": "float32",
    "max_position_embeddings": 262144, "mlp_bias": False, "mlp_hidden_act": "relu2",
    "model_type": "nemotron_h", "moe_intermediate_size": 1856,
    "moe_shared_expert_intermediate_size": 3712, "n_group": 1, "n_groups": 8,
    "n_routed_experts": 128, "n_shared_experts": 1, "norm_eps": 1e-05, "norm_topk_prob": True,
    "num_attention_heads": 32, "num_experts_per_tok": 6, "num_hidden_layers": 52,
    "num_key_value_heads": 2, "num_logits_to_keep": 1, "partial_rotary_factor": 1.0,
    "rescale_prenorm_residual": True, "residual_in_fp32": False, "rope_theta": 10000,
    "routed_scaling_factor": 2.5, "sliding_window": None, "ssm_state_size": 128,
    "tie_word_embeddings": False, "time_step_floor": 0.0001, "time_step_max": 0.1,
    "time_step_min": 0.001, "topk_group": 1, "use_bias": False, "use_cache": True,
    "use_conv_bias": True, "use_mamba_kernels": True, "vocab_size": 131072,
}  # fmt: skip


def _architecture(model: ModelSpec) -> dict[str, Any]:
    return model.model_dump(exclude={"name", "source"})


def _message(err: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(err.value)
    assert text and "\n" not in text
    return text


def test_nemotron_h_is_supported() -> None:
    assert "nemotron_h" in SUPPORTED_MODEL_TYPES
    by_architecture = {k: v for k, v in NEMOTRON_H_8B.items() if k != "model_type"}
    assert _architecture(model_from_hf_config(by_architecture, "m")) == _architecture(
        model_from_hf_config(NEMOTRON_H_8B, "m")
    )


@pytest.mark.parametrize(
    ("bundled", "config"),
    [("nemotron-h-8b", NEMOTRON_H_8B), ("nemotron-3-nano", NEMOTRON_3_NANO)],
)
def test_bundled_file_equals_the_import_of_its_config(bundled: str, config: dict) -> None:
    assert _architecture(model_from_hf_config(config, bundled)) == _architecture(load_model(bundled))  # fmt: skip


def test_nemotron_h_8b_fields() -> None:
    m = model_from_hf_config(NEMOTRON_H_8B, "m")
    assert m.hybrid_pattern == NEMOTRON_H_8B["hybrid_override_pattern"]
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.vocab_size) == (52, 4096, 21504, 131072)  # fmt: skip
    assert (m.num_attention_heads, m.kv_heads, m.head_size, m.head_dim) == (32, 8, 128, None)
    assert (m.mamba_num_heads, m.mamba_head_dim, m.mamba_state_dim) == (128, 64, 128)
    assert (m.mamba_num_groups, m.mamba_conv_kernel) == (8, 4)
    assert (m.activation, m.norm, m.linear_bias, m.tied_embeddings) == ("squared_relu", "rmsnorm", False, False)  # fmt: skip
    assert (m.max_seq_length, m.norm_epsilon, m.is_moe) == (8192, 1e-5, False)
    assert (m.attention_dropout_fraction, m.hidden_dropout_fraction) == (0.0, 0.0)
    assert m.total_params == m.active_params == 8_100_852_736
    assert round(m.total_params / 1e9, 1) == 8.1  # the paper's "8B" model
    assert "NoPE" in m.source  # its attention has no position embedding


def test_nemotron_3_nano_fields_and_published_counts() -> None:
    m = model_from_hf_config(NEMOTRON_3_NANO, "m")
    assert m.hybrid_pattern == NEMOTRON_3_NANO["hybrid_override_pattern"]
    assert (m.num_layers, m.hidden_size, m.head_dim, m.kv_heads) == (52, 2688, 128, 2)
    assert (m.num_experts, m.moe_top_k, m.expert_width) == (128, 6, 1856)
    assert (m.num_shared_experts, m.shared_expert_width, m.moe_router_expert_bias) == (1, 3712, True)  # fmt: skip
    assert (m.mamba_num_heads, m.mamba_head_dim, m.mamba_inner) == (64, 64, 4096)
    assert (m.num_moe_layers, m.num_dense_layers) == (23, 0)
    # NVIDIA: 31.6B total, 3.6B active (embedding and LM head included)
    assert m.total_params == pytest.approx(31.6e9, rel=0.01)
    assert m.active_params == pytest.approx(3.6e9, rel=0.01)
    assert "routed_scaling_factor" in m.source


def test_layers_block_type_spelling_equals_the_pattern() -> None:
    names = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
    current = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
    base = {k: v for k, v in NEMOTRON_3_NANO.items() if k != "hybrid_override_pattern"}
    pattern = str(NEMOTRON_3_NANO["hybrid_override_pattern"])
    expected = _architecture(model_from_hf_config(NEMOTRON_3_NANO, "m"))
    for spelling in (names, current):
        types = [spelling[c] for c in pattern]
        assert _architecture(model_from_hf_config({**base, "layers_block_type": types}, "m")) == expected  # fmt: skip


def test_mamba_widths_only_with_mamba_layers() -> None:
    attention_only = {**NEMOTRON_H_8B, "hybrid_override_pattern": "*-*-", "num_hidden_layers": 4}
    m = model_from_hf_config(attention_only, "m")
    assert (m.hybrid_pattern, m.mamba_num_heads) == ("*-*-", None)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({**NEMOTRON_3_NANO, "moe_latent_size": 4096}, "config.json='{...}': moe_latent_size=4096 must be below hidden_size=2688"),
        ({**NEMOTRON_3_NANO, "num_nextn_predict_layers": 2}, "config.json: num_nextn_predict_layers=2: the config does not give the multi-token prediction block's layers"),
        ({**NEMOTRON_H_8B, "hybrid_override_pattern": "M-M*|M-M*", "num_hidden_layers": 9}, "config.json: hybrid_override_pattern='M-M*|M-M*': layer symbol '|' is not modelled"),
        ({**NEMOTRON_H_8B, "mlp_hidden_act": "silu"}, "config.json: mlp_hidden_act='silu': only squared-ReLU (relu2) MLPs are modelled"),
        ({**NEMOTRON_H_8B, "mamba_hidden_act": "gelu"}, "config.json: mamba_hidden_act='gelu': only SiLU Mamba-2 mixers are modelled"),
        ({**NEMOTRON_H_8B, "use_bias": True}, "config.json: use_bias=True: biases are not modelled in hybrid layers"),
        ({**NEMOTRON_H_8B, "use_conv_bias": False}, "config.json: use_conv_bias=False: a Mamba-2 convolution without bias"),
        ({**NEMOTRON_H_8B, "sliding_window": 4096}, "config.json: sliding_window=4096: sliding-window attention is not modelled"),
        ({**NEMOTRON_H_8B, "num_hidden_layers": 50}, "config.json: num_hidden_layers=50: the hybrid_override_pattern has 52 layers"),
        ({**NEMOTRON_H_8B, "hybrid_override_pattern": None}, "config.json: hybrid_override_pattern=None: missing or empty; required in a 'nemotron_h' config"),
        ({**NEMOTRON_H_8B, "mamba_num_heads": 0}, "config.json: mamba_num_heads=0: expected a positive integer"),
        ({**NEMOTRON_3_NANO, "num_experts_per_tok": 200}, "config.json: num_experts_per_tok=200: exceeds n_routed_experts=128"),
        ({**NEMOTRON_3_NANO, "n_shared_experts": 0}, "config.json: n_shared_experts=0: transformers' NemotronHMoE always builds its shared expert"),
        ({**NEMOTRON_H_8B, "hybrid_override_pattern": None, "layers_block_type": ["mamba", "gdn"], "num_hidden_layers": 2}, "config.json: layers_block_type=['mamba', 'gdn']: layer type 'gdn' is not modelled"),
    ],
)  # fmt: skip
def test_refused_configs(config: dict, message: str) -> None:
    with pytest.raises(SpecError) as err:
        model_from_hf_config(config, "m", path="config.json")
    assert _message(err).startswith(message), _message(err)


def test_mtp_is_unsupported_not_malformed() -> None:
    with pytest.raises(UnsupportedError, match="num_nextn_predict_layers"):
        model_from_hf_config({**NEMOTRON_3_NANO, "num_nextn_predict_layers": 1}, "m")


def test_latent_experts_are_read() -> None:
    """LatentMoE: the experts over the latent width, with the two projections."""
    plain = model_from_hf_config(NEMOTRON_3_NANO, "m")
    latent = model_from_hf_config({**NEMOTRON_3_NANO, "moe_latent_size": 1024}, "m")
    assert latent.moe_latent_size == 1024
    width, experts, h = plain.expert_width, plain.num_experts, plain.hidden_size
    per_layer = experts * 2 * width * (1024 - h) + 2 * h * 1024  # squared ReLU: 2 matrices
    assert latent.total_params - plain.total_params == plain.num_moe_layers * per_layer


@pytest.mark.parametrize("family", ["mamba", "mamba2", "jamba", "qwen3_next"])
def test_other_state_space_families_stay_refused(family: str) -> None:
    with pytest.raises(UnsupportedError) as err:
        model_from_hf_config({"model_type": family, "hidden_size": 2048}, "m")
    assert _message(err).startswith(f"config.json: model_type={family!r}: ")
