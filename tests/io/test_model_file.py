"""Model files: the bundled library, model files by path, Hugging Face config.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pipette_cp.errors import InputFileError, SpecError, UnsupportedError
from pipette_cp.io import paths
from pipette_cp.io.huggingface.config import (
    SUPPORTED_MODEL_TYPES,
    default_model_name,
    load_hf_config,
    model_from_hf_config,
    model_type_of,
)
from pipette_cp.io.model_file import list_models, load_model, model_from_mapping, resolve_model
from pipette_cp.specs import ModelSpec
from tests.conftest import FIXTURES
from tests.models import LLAMA_STYLE, gpt_model

FIXTURES = FIXTURES / "hf"

#: HF fixture -> the bundled model of the same architecture.
FIXTURE_TO_BUNDLED = {
    "meta-llama--Llama-2-7b-hf.json": "llama-2-7b",
    "meta-llama--Meta-Llama-3-8B.json": "llama-3-8b",
    "mistralai--Mistral-7B-v0.1.json": "mistral-7b",
    "Qwen--Qwen2-7B.json": "qwen2-7b",
    "openai-community--gpt2.json": "gpt2",
    "openai-community--gpt2-xl.json": "gpt2-xl",
    "EleutherAI--gpt-neox-20b.json": "gpt-neox-20b",
    "mistralai--Mixtral-8x7B-v0.1.json": "mixtral-8x7b",
}

REQUIRED_BUNDLED = {
    *(f"gpt-sc21-{s}" for s in ("1.7b", "3.6b", "7.5b", "18b", "39b", "76b", "145b", "310b")),
    "gpt-sc21-530b",
    "gpt-sc21-1t",
    "gpt3-1.3b",
    "gpt3-2.7b",
    "gpt3-6.7b",
    "gpt3-13b",
    "gpt3-175b",
    "llama-2-7b",
    "llama-2-13b",
    "llama-2-70b",
    "llama-3-8b",
    "llama-3-70b",
    "llama-3.1-405b",
    "mistral-7b",
    "bloom-176b",
    "gpt-neox-20b",
    "tiny-gpt",
    "qwen3-8b",
    "mixtral-8x7b",
    "qwen3-30b-a3b",
    "qwen3-235b-a22b",
    "deepseek-v3",
    "grok-1",
}
#: The bundled mixture-of-experts models.
MOE_BUNDLED = {
    "nemotron-3-nano",
    "nemotron-3-super",
    "mixtral-8x7b",
    "qwen3-30b-a3b",
    "qwen3-235b-a22b",
    "deepseek-v3",
    "grok-1",
}


def _fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


def _one_line(err: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(err.value)
    assert message and "\n" not in message
    return message


def _architecture(model: ModelSpec) -> dict[str, Any]:
    return model.model_dump(exclude={"name", "source"})


# ------------------------------------------------------------------ the library
def test_library_has_the_required_models() -> None:
    assert set(list_models()) >= REQUIRED_BUNDLED
    assert list_models() == sorted(list_models())


@pytest.mark.parametrize("name", list_models())
def test_every_bundled_model_loads(name: str) -> None:
    path = paths.MODELS_DIR / f"{name}.yaml"
    raw = yaml.safe_load(path.read_text())
    assert set(raw) <= set(ModelSpec.model_fields)  # ModelSpec's fields, nothing else
    model = load_model(name)
    assert model.name == name
    assert model.source.strip()
    assert model.is_moe == (name in MOE_BUNDLED)
    assert model.total_params >= model.active_params > 0


def test_models_readme_lists_every_model() -> None:
    readme = (paths.MODELS_DIR / "README.md").read_text()
    missing = [name for name in list_models() if f"`{name}`" not in readme]
    assert not missing


def test_load_by_path_and_case_insensitive_name() -> None:
    by_name = load_model("llama-2-7b")
    assert load_model("Llama-2-7B") == by_name
    assert load_model(paths.MODELS_DIR / "llama-2-7b.yaml") == by_name
    assert load_model(str(paths.MODELS_DIR / "llama-2-7b.yaml")) == by_name


def test_unknown_name_lists_close_matches() -> None:
    with pytest.raises(SpecError) as err:
        load_model("llama2-7b")
    message = _one_line(err)
    assert "'llama2-7b'" in message and "'llama-2-7b'" in message


def test_unknown_name_without_close_match() -> None:
    with pytest.raises(SpecError, match="none of the"):
        load_model("qqqqqqqqqqqq")


def test_missing_model_file() -> None:
    with pytest.raises(InputFileError) as err:
        load_model("no/such/model.yaml")
    assert "no such file" in _one_line(err)


def test_yaml_model_file_with_a_bad_field(tmp_path: Path) -> None:
    raw = yaml.safe_load((paths.MODELS_DIR / "tiny-gpt.yaml").read_text())
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**raw, "hidden_size": -1}))
    with pytest.raises(SpecError) as err:
        load_model(path)
    message = _one_line(err)
    assert "bad.yaml" in message and "hidden_size=-1" in message


def test_bundled_file_name_must_match(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = yaml.safe_load((paths.MODELS_DIR / "tiny-gpt.yaml").read_text())
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.setattr(paths, "MODELS_DIR", tmp_path)
    assert list_models() == ["other"]
    with pytest.raises(SpecError, match=r"model\.name='tiny-gpt'.*'other'"):
        load_model("other")


def test_model_from_mapping_prefixes_the_field() -> None:
    with pytest.raises(SpecError, match=r"^model\.vocab_size=0"):
        model_from_mapping({**load_model("tiny-gpt").model_dump(), "vocab_size": 0})


def test_resolve_model_accepts_every_form() -> None:
    tiny = load_model("tiny-gpt")
    assert resolve_model(tiny) is tiny
    assert resolve_model("tiny-gpt") == tiny
    assert resolve_model(tiny.model_dump()) == tiny
    with pytest.raises(SpecError, match="expected a model name"):
        resolve_model(3)  # type: ignore[arg-type]


# ------------------------------------------------------- Hugging Face configs
@pytest.mark.parametrize("fixture", sorted(FIXTURE_TO_BUNDLED))
def test_hf_fixture_matches_bundled_model(fixture: str) -> None:
    from_hf = load_model(FIXTURES / fixture)
    bundled = load_model(FIXTURE_TO_BUNDLED[fixture])
    assert from_hf.total_params == bundled.total_params
    assert _architecture(from_hf) == _architecture(bundled)
    assert from_hf.name == fixture.removesuffix(".json")
    assert fixture in from_hf.source


def test_load_hf_config_directory_and_cache_snapshot(tmp_path: Path) -> None:
    snapshot = tmp_path / "models--mistralai--Mistral-7B-v0.1" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(
        (FIXTURES / "mistralai--Mistral-7B-v0.1.json").read_text()
    )
    model = load_model(snapshot)
    assert model.name == "Mistral-7B-v0.1"
    assert model.total_params == 7_241_732_096
    assert load_hf_config(snapshot / "config.json", name="m").name == "m"
    assert default_model_name(tmp_path / "my-model" / "config.json") == "my-model"


def test_directory_without_config(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match=r"without a config\.json"):
        load_model(tmp_path)


def test_mixtral_is_read_with_its_experts() -> None:
    # mistralai/Mixtral-8x7B-v0.1: 46,702,792,704 parameters, 12.9B active per token.
    model = load_model(FIXTURES / "mistralai--Mixtral-8x7B-v0.1.json")
    assert (model.num_experts, model.moe_top_k, model.num_moe_layers) == (8, 2, 32)
    assert model.moe_router_aux_loss_coeff == 0.02
    assert model.total_params == 46_702_792_704
    assert round(model.active_params / 1e9, 1) == 12.9
    with pytest.raises(UnsupportedError, match="num_experts=8"):
        model.require_dense()  # the dense-only paths (profiler) still refuse it


def test_qwen2_has_qkv_biases_only() -> None:
    # Qwen/Qwen2-7B: 7,615,616,512 parameters, q/k/v biases included (Qwen2Attention).
    model = load_model(FIXTURES / "Qwen--Qwen2-7B.json")
    assert (model.linear_bias, model.qkv_bias) == (False, True)
    assert model.total_params == 7_615_616_512
    assert (model.rotary_base, model.norm_epsilon) == (1_000_000, 1e-6)


# -------------------------------------------- what Megatron needs to rebuild the model
@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        ("meta-llama--Llama-2-7b-hf.json", (10_000, None, 1e-5, 0.0, 0.0, 1.0)),
        ("meta-llama--Meta-Llama-3-8B.json", (500_000, None, 1e-5, 0.0, 0.0, 1.0)),
        ("mistralai--Mistral-7B-v0.1.json", (10_000, None, 1e-5, 0.0, 0.0, 1.0)),
        ("openai-community--gpt2.json", (10_000, None, 1e-5, 0.1, 0.1, 1.0)),
        ("EleutherAI--gpt-neox-20b.json", (10_000, None, 1e-5, 0.0, 0.0, 0.25)),
    ],
)
def test_rope_norm_and_dropout_are_read(fixture: str, expected: tuple) -> None:
    m = load_model(FIXTURES / fixture)
    got = (m.rotary_base, m.rope_scaling_factor, m.norm_epsilon, m.attention_dropout_fraction,
           m.hidden_dropout_fraction, m.rotary_fraction)  # fmt: skip
    assert got == expected


LLAMA_31_SCALING = {
    "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192, "rope_type": "llama3",
}  # fmt: skip


def test_llama_31_rope_scaling_and_the_bundled_405b() -> None:
    # meta-llama/Llama-3.1-405B config.json: the 8B fixture's layout with these two keys
    cfg = {**_fixture("meta-llama--Meta-Llama-3-8B.json"), "rope_scaling": LLAMA_31_SCALING}
    assert model_from_hf_config(cfg, "m").rope_scaling_factor == 8.0
    bundled = load_model("llama-3.1-405b")
    assert (bundled.rope_scaling_factor, bundled.rotary_base) == (8.0, 500_000)
    assert load_model("llama-3-8b").rotary_base == 500_000


@pytest.mark.parametrize(
    ("scaling", "message"),
    [
        ({"type": "linear", "factor": 2.0}, "rope_scaling.rope_type='linear'"),
        ({**LLAMA_31_SCALING, "high_freq_factor": 2.0}, "rope_scaling.high_freq_factor=2.0"),
        ({**LLAMA_31_SCALING, "factor": "8"}, "rope_scaling.factor='8'"),
        ({**LLAMA_31_SCALING, "factor": 8.5}, "rope_scaling.factor=8.5: expected a whole number"),
        ([8.0], "rope_scaling=[8.0]"),
    ],
)
def test_other_rope_scaling_is_refused(scaling: object, message: str) -> None:
    cfg = {**_fixture("meta-llama--Meta-Llama-3-8B.json"), "rope_scaling": scaling}
    with pytest.raises(SpecError) as err:
        model_from_hf_config(cfg, "m", path="config.json")
    assert message in _one_line(err)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("rope_theta", 10000.5, "rope_theta=10000.5: expected a whole number"),
        ("rms_norm_eps", 0, "rms_norm_eps=0: expected a positive number"),
        ("attention_dropout", 1.0, "attention_dropout=1.0: expected a number in [0, 1)"),
        ("attention_bias", True, "attention_bias=True: biases on only the attention"),
    ],
)
def test_bad_rope_norm_dropout_and_bias_values(key: str, value: object, message: str) -> None:
    cfg = {**_fixture("meta-llama--Meta-Llama-3-8B.json"), key: value}
    with pytest.raises(SpecError) as err:
        model_from_hf_config(cfg, "m", path="config.json")
    assert message in _one_line(err)


@pytest.mark.parametrize(
    ("fixture", "key", "value"),
    [
        ("meta-llama--Meta-Llama-3-8B.json", "num_local_experts", 8),
        ("mistralai--Mistral-7B-v0.1.json", "num_experts_per_tok", 2),
        ("Qwen--Qwen2-7B.json", "num_experts", 64),
        ("openai-community--gpt2.json", "n_routed_experts", 4),
        ("EleutherAI--gpt-neox-20b.json", "moe_num_experts", 16),
    ],
)
def test_moe_keys_in_a_dense_config_are_refused(fixture: str, key: str, value: int) -> None:
    cfg = {**_fixture(fixture), key: value}
    with pytest.raises(SpecError) as err:
        model_from_hf_config(cfg, "m", path="config.json")
    message = _one_line(err)
    assert message.startswith(f"config.json: {key}={value}: a mixture-of-experts key"), message
    # zero or null means no experts: accepted
    assert model_from_hf_config({**_fixture(fixture), key: 0}, "m").num_experts == 1


def test_model_type_from_architectures() -> None:
    cfg = _fixture("openai-community--gpt2.json")
    del cfg["model_type"]
    assert model_type_of(cfg) == "gpt2"
    assert model_from_hf_config(cfg, "gpt2").total_params == 124_439_808


def test_gpt2_explicit_n_inner() -> None:
    cfg = {**_fixture("openai-community--gpt2.json"), "n_inner": 1024}
    assert model_from_hf_config(cfg, "g").ffn_hidden_size == 1024


def test_consistent_head_dim_is_dropped_and_odd_one_kept() -> None:
    cfg = _fixture("meta-llama--Meta-Llama-3-8B.json")
    assert model_from_hf_config({**cfg, "head_dim": 128}, "a").head_dim is None
    assert model_from_hf_config({**cfg, "head_dim": 96}, "b").head_dim == 96


@pytest.mark.parametrize(
    ("fixture", "key"),
    [
        ("meta-llama--Llama-2-7b-hf.json", "hidden_size"),
        ("meta-llama--Llama-2-7b-hf.json", "intermediate_size"),
        ("openai-community--gpt2.json", "n_layer"),
        ("EleutherAI--gpt-neox-20b.json", "vocab_size"),
        ("mistralai--Mixtral-8x7B-v0.1.json", "num_local_experts"),
    ],
)
def test_missing_field_is_named(fixture: str, key: str) -> None:
    cfg = _fixture(fixture)
    del cfg[key]
    with pytest.raises(SpecError) as err:
        model_from_hf_config(cfg, "m", path="config.json")
    message = _one_line(err)
    assert message.startswith(f"config.json: {key}=")
    assert "missing" in message


def test_unknown_model_type() -> None:
    cfg = {**_fixture("meta-llama--Llama-2-7b-hf.json"), "model_type": "t5"}
    with pytest.raises(UnsupportedError) as err:
        model_from_hf_config(cfg, "m")
    message = _one_line(err)
    assert "model_type='t5'" in message
    assert all(t in message for t in SUPPORTED_MODEL_TYPES)


def test_no_model_type_at_all() -> None:
    cfg = _fixture("meta-llama--Llama-2-7b-hf.json")
    del cfg["model_type"], cfg["architectures"]
    with pytest.raises(SpecError, match="model_type=None: missing"):
        model_from_hf_config(cfg, "m")


def test_heads_not_divisible_by_kv_heads() -> None:
    cfg = {**_fixture("meta-llama--Meta-Llama-3-8B.json"), "num_key_value_heads": 5}
    with pytest.raises(SpecError) as err:
        model_from_hf_config(cfg, "m")
    message = _one_line(err)
    assert "num_key_value_heads=5" in message and "num_attention_heads=32" in message


def test_hidden_not_divisible_by_heads() -> None:
    cfg = {**_fixture("openai-community--gpt2.json"), "n_head": 7}
    with pytest.raises(SpecError, match=r"n_head=7: does not divide n_embd=768"):
        model_from_hf_config(cfg, "m")


@pytest.mark.parametrize("value", ["4096", 4096.0, True, 0, -8])
def test_non_integer_width(value: object) -> None:
    cfg = {**_fixture("meta-llama--Llama-2-7b-hf.json"), "hidden_size": value}
    with pytest.raises(SpecError, match=r"hidden_size=.*positive integer"):
        model_from_hf_config(cfg, "m")


def test_unmodelled_activation() -> None:
    cfg = {**_fixture("meta-llama--Llama-2-7b-hf.json"), "hidden_act": "gelu"}
    with pytest.raises(UnsupportedError, match="hidden_act='gelu'"):
        model_from_hf_config(cfg, "m")
    gpt2 = {**_fixture("openai-community--gpt2.json"), "activation_function": "relu"}
    with pytest.raises(UnsupportedError, match="activation_function='relu'"):
        model_from_hf_config(gpt2, "m")


def test_malformed_json(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama",\n "hidden_size": 4096,,}')
    with pytest.raises(InputFileError) as err:
        load_model(path)
    assert "malformed JSON at line 2" in _one_line(err)


def test_not_a_mapping() -> None:
    with pytest.raises(SpecError, match="expected a JSON object"):
        model_from_hf_config([1, 2], "m")  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(
    layers=st.integers(1, 128),
    head_size=st.sampled_from([32, 64, 80, 128]),
    kv=st.sampled_from([1, 2, 4, 8]),
    group=st.integers(1, 8),
    ffn=st.integers(1, 60_000),
    vocab=st.integers(1, 300_000),
    tied=st.booleans(),
)
def test_llama_config_round_trip(
    layers: int, head_size: int, kv: int, group: int, ffn: int, vocab: int, tied: bool
) -> None:
    # Any valid Llama config.json gives exactly the ModelSpec written by hand.
    heads = kv * group
    cfg = {
        "model_type": "llama",
        "num_hidden_layers": layers,
        "hidden_size": heads * head_size,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "intermediate_size": ffn,
        "vocab_size": vocab,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": tied,
    }
    expected = gpt_model(
        "m",
        layers,
        heads * head_size,
        heads,
        ffn_hidden_size=ffn,
        vocab_size=vocab,
        max_seq_length=4096,
        num_kv_heads=kv,
        tied_embeddings=tied,
        **LLAMA_STYLE,
        # transformers' LlamaConfig defaults for absent keys; Llama has no hidden dropout
        norm_epsilon=1e-6,
        attention_dropout_fraction=0.0,
        hidden_dropout_fraction=0.0,
    )
    got = model_from_hf_config(cfg, "m")
    assert _architecture(got) == _architecture(expected)
