"""Training frameworks: by name, overridden field by field, fitted on published runs."""

from __future__ import annotations

import pytest

from pipette_cp.cost.compute.model_chunks import layer_times
from pipette_cp.cost.memory.peak import state_bytes_per_param
from pipette_cp.cost.stack.frameworks import FRAMEWORKS, resolve_framework
from pipette_cp.errors import SpecError
from pipette_cp.experiments.models.published_runs import run_baseline
from pipette_cp.experiments.models.published_runs_fit import fit_frameworks, fit_memory_margins
from pipette_cp.specs import ModelSpec, TrainingSpec, resolve_gpu
from pipette_cp.specs.layouts import make_plan
from pipette_cp.specs.training import FrameworkProfile

PLAN = make_plan(num_layers=4, dp=8, pp=1, tp=1, micro_batch_size=1, distributed_optimizer=True)


def _train(framework) -> TrainingSpec:
    return TrainingSpec(global_batch_size=64, seq_length=2048, framework=framework)


def test_megatron_default_is_18_bytes_per_parameter():
    assert state_bytes_per_param(_train("megatron-core"), PLAN.model_copy(
        update={"distributed_optimizer": False})) == (2.0, 4.0, 12.0)  # fmt: skip
    assert state_bytes_per_param(_train("megatron-core"), PLAN) == (2.0, 4.0, 12.0 / 8)


def test_a_name_or_a_mapping_with_overrides():
    fw = resolve_framework(_train({"name": "nemo", "gradient_bytes": 2}).framework)
    assert (fw.name, fw.gradient_bytes, fw.compute_efficiency) == (
        "nemo",
        2.0,
        FRAMEWORKS["nemo"].compute_efficiency,
    )
    assert state_bytes_per_param(_train({"name": "nemo", "gradient_bytes": 2}), PLAN)[1] == 2.0


def test_unknown_framework_needs_every_field():
    with pytest.raises(SpecError, match=r"training\.framework\.name='fsdp': unknown framework"):
        resolve_framework(FrameworkProfile(name="fsdp"))
    custom = FrameworkProfile(name="mine", compute_efficiency=0.8, weight_bytes=2,
                              gradient_bytes=2, master_weight_bytes=4, optimizer_state_bytes=8)  # fmt: skip
    assert resolve_framework(custom).compute_efficiency == 0.8


def test_compute_efficiency_scales_the_layer_time():
    model = ModelSpec(name="m", num_layers=4, hidden_size=2048, num_attention_heads=16,
                      ffn_hidden_size=8192, vocab_size=32000, max_seq_length=2048)  # fmt: skip
    gpu = resolve_gpu("a100")

    def total(framework) -> float:
        t = layer_times(model, _train(framework), gpu, PLAN, 150e9)
        return t.forward_s + t.backward_s

    slow = FrameworkProfile(name="megatron-core", compute_efficiency=0.5)
    assert total(slow) == pytest.approx(2 * total("megatron-core"))


@pytest.mark.slow
def test_catalogue_efficiencies_are_the_fit():
    """The fitted values in the catalogue are what the fit command gives (to 0.002)."""
    for (name, gpu), (compute, attention) in fit_frameworks().items():
        fw = FRAMEWORKS[name]
        assert fw.compute_scale(gpu) == pytest.approx(compute, abs=2e-3), (name, gpu)
        assert fw.attention_efficiency == attention, name


@pytest.mark.slow
def test_catalogue_memory_margins_are_the_fit():
    """The memory margins in the catalogue are what the fit rule gives on the fit side."""
    for name, margin in fit_memory_margins(run_baseline()).items():
        assert FRAMEWORKS[name].memory_margin == margin, name


def test_a_given_compute_efficiency_holds_on_every_gpu():
    fw = resolve_framework(FrameworkProfile(name="llm-foundry", compute_efficiency=0.9))
    assert fw.compute_scale("A100") == fw.compute_scale("H100") == 0.9
    assert FRAMEWORKS["llm-foundry"].compute_scale("H100") < FRAMEWORKS[
        "llm-foundry"
    ].compute_scale("A100")


def test_gradient_bytes_set_memory_and_the_wire():
    """A framework with bf16 gradients keeps 2 B per parameter and sends 2 B per element;
    the placement model reads the same bytes as the evaluator (its bound stays valid)."""
    from pipette_cp.cost.evaluator.evaluate import Evaluator
    from pipette_cp.cost.network.data_parallel import gradient_wire_bytes
    from pipette_cp.solvers.placement.build import build_placement_data
    from tests.conftest import small_instance

    assert gradient_wire_bytes(_train("megatron-core")) == 4.0
    assert gradient_wire_bytes(_train("aleph-alpha")) == 2.0
    plan = make_plan(num_layers=8, dp=4, pp=2, tp=1, micro_batch_size=1)
    base = small_instance(nodes=2, gpus_per_node=4)
    rings, syncs = [], []
    for name in ("megatron-core", "aleph-alpha"):
        training = base.training.model_copy(update={"framework": FrameworkProfile(name=name)})
        inst = base.model_copy(update={"training": training})
        rings.append(build_placement_data(inst, plan).ring_bytes)
        syncs.append(Evaluator(inst).evaluate(plan).breakdown_s.dp_comm)
    assert (rings[1] * 2 == rings[0]).all() and syncs[1] < syncs[0]
