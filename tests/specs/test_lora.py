"""``training.lora``: the LoRA sub-spec, its defaults, its refusals and its YAML form."""

from __future__ import annotations

import pytest
import yaml

from pipette_cp.cost.stack.frameworks import FRAMEWORKS
from pipette_cp.errors import SpecError
from pipette_cp.io.instance_file import load_instance
from pipette_cp.specs import Instance, TrainingSpec, validate_spec
from pipette_cp.specs.lora import LORA_TARGETS, NO_LORA_FRAMEWORKS, LoraSpec
from tests.conftest import small_instance
from tests.models import gpt_model

BASE = {"global_batch_size": 8, "seq_length": 256}


def training(**fields: object) -> TrainingSpec:
    return validate_spec(TrainingSpec, BASE | fields, "training")


def test_full_training_by_default_and_megatron_bridge_defaults() -> None:
    """No ``lora``: None (full training, the dump unchanged but for the new key);
    ``lora: {}``: Megatron-Bridge's LoRA defaults (dim 32, alpha 32, all four linears)."""
    assert training().lora is None
    lora = training(lora={}).lora
    assert lora == LoraSpec(rank=32, alpha=32.0, target_modules=LORA_TARGETS)
    assert LORA_TARGETS == ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("linear_proj,linear_qkv", ("linear_qkv", "linear_proj")),
        ("linear_fc2+linear_fc1+linear_fc2", ("linear_fc1", "linear_fc2")),
        (["linear_fc1", "linear_qkv"], ("linear_qkv", "linear_fc1")),
    ],
)
def test_target_modules_read_from_text_or_lists_in_megatron_order(
    given: object, expected: tuple[str, ...]
) -> None:
    assert training(lora={"target_modules": given}).lora.target_modules == expected


@pytest.mark.parametrize(
    ("lora", "message"),
    [
        ({"rank": 0}, "training.lora.rank=0: Input should be greater than 0"),
        ({"rank": -4}, "training.lora.rank=-4: Input should be greater than 0"),
        ({"alpha": 0}, "training.lora.alpha=0: Input should be greater than 0"),
        (
            {"target_modules": ["q_proj"]},
            "training.lora.target_modules=['q_proj']: unknown module 'q_proj'; allowed: "
            "linear_qkv, linear_proj, linear_fc1, linear_fc2",
        ),
        (
            {"target_modules": []},
            "training.lora.target_modules=[]: must name at least one of linear_qkv, "
            "linear_proj, linear_fc1, linear_fc2",
        ),
        (
            {"dim": 16},
            "training.lora.dim=16: unknown field (check its spelling and its unit suffix)",
        ),
    ],
)
def test_bad_values_name_the_field_the_value_and_the_allowed_values(
    lora: dict, message: str
) -> None:
    with pytest.raises(SpecError) as err:
        training(lora=lora)
    assert str(err.value) == message and err.value.exit_code == 2


@pytest.mark.parametrize("framework", NO_LORA_FRAMEWORKS)
def test_frameworks_without_lora_refuse_it(framework: str) -> None:
    with pytest.raises(SpecError) as err:
        training(framework=framework, lora={"rank": 8})
    assert str(err.value) == (
        f"training.lora='{{...}}': framework {framework!r} has no LoRA fine-tuning; use "
        "megatron-bridge, nemo or megatron-core (or drop training.lora)"
    )
    assert training(framework=framework).lora is None  # full training stays allowed


def test_the_refused_frameworks_are_catalogue_names_and_the_rest_accept_lora() -> None:
    assert set(NO_LORA_FRAMEWORKS) < set(FRAMEWORKS)
    for name in set(FRAMEWORKS) - set(NO_LORA_FRAMEWORKS):
        assert training(framework=name, lora={"rank": 8}).lora is not None
    assert training(framework={"name": "mine", "compute_efficiency": 1.0, "weight_bytes": 2,
                               "gradient_bytes": 4, "master_weight_bytes": 4,
                               "optimizer_state_bytes": 8}, lora={}).lora  # fmt: skip


def test_lora_on_a_mixture_of_experts_or_latent_attention_model_is_refused() -> None:
    inst = small_instance()
    moe = gpt_model("moe", 2, 256, 8, num_experts=8)
    lora = inst.training.model_copy(update={"lora": LoraSpec(rank=8)})
    with pytest.raises(ValueError, match=r"training.lora: LoRA on a mixture-of-experts model"):
        Instance(name="x", model=moe, cluster=inst.cluster, training=lora)
    Instance(name="x", model=inst.model, cluster=inst.cluster, training=lora)  # dense: fine


def test_an_instance_yaml_loads_the_field(tmp_path) -> None:
    data = {
        "model": "llama-2-7b",
        "cluster": {"generator": {"kind": "healthy-a100", "nodes": 2, "seed": 0}},
        "training": {"global_batch_size": 16, "seq_length": 2048, "framework": "nemo",
                     "lora": {"rank": 16, "alpha": 32, "target_modules": "linear_qkv,linear_proj"}},
    }  # fmt: skip
    path = tmp_path / "inst.yaml"
    path.write_text(yaml.safe_dump(data))
    lora = load_instance(path).training.lora
    assert lora == LoraSpec(rank=16, alpha=32.0, target_modules=("linear_qkv", "linear_proj"))


def test_the_search_offers_no_gradient_sharding_under_lora() -> None:
    """ZeRO-2/3 are refused (a layout rule) and not enumerated; ZeRO-1 stays."""
    from types import SimpleNamespace

    from pipette_cp.specs.knobs.base import Job
    from pipette_cp.specs.knobs.memory import SHARDING
    from pipette_cp.specs.search_space import SearchSpace

    inst = small_instance()
    space = SearchSpace(dp_sharding=("none", "optim", "optim_grads", "optim_grads_params"))
    layout = SimpleNamespace(dp=4, pp=1, tp=1, cp=1, ep=1, etp=None)
    lora = inst.training.model_copy(update={"lora": LoraSpec(rank=8)})
    levels = {c[1] for c in SHARDING.choices(Job(inst.model, lora, space), layout)}
    assert levels == {"none", "optim"}
    full = {c[1] for c in SHARDING.choices(Job(inst.model, inst.training, space), layout)}
    assert full == {"none", "optim", "optim_grads", "optim_grads_params"}
