"""LoRA's time: no weight gradient of the frozen GEMMs (layers and LM head), no embedding
gradient, the adapters' bf16 GEMMs forward and backward, an optimizer step over the
adapters alone; the data-parallel rings reduce the adapters alone.

Each difference is recomputed here from the primitives (the GEMM model
:func:`~pipette_cp.cost.compute.gemm.gemm_time_s` for the frozen GEMMs, the HBM rate for
the adapters' traffic) on the GEMMs the test lists itself.
"""

from __future__ import annotations

import pytest

from pipette_cp.cost.compute.gemm import gemm_time_s
from pipette_cp.cost.compute.model_chunks import layer_times
from pipette_cp.cost.compute.optimizer_step import optimizer_step_time_s
from pipette_cp.cost.compute.stage_extras import boundary_times
from pipette_cp.cost.evaluator.evaluate import Evaluator, evaluate
from pipette_cp.cost.stack.calibration import calibration_for
from pipette_cp.cost.stack.frameworks import framework_calibration
from pipette_cp.cost.workload.flops import ATTENTION_CORE, Gemm, layer_gemms
from pipette_cp.cost.workload.lora import adapter_gemms
from pipette_cp.cost.workload.parameters import padded_vocab_size
from pipette_cp.errors import UnsupportedError
from pipette_cp.specs.gpu import resolve_gpu
from pipette_cp.specs.layouts import make_plan
from pipette_cp.specs.lora import LoraSpec
from pipette_cp.specs.profile import LayerProfile, LayerProfileEntry
from pipette_cp.specs.training import TrainingSpec
from tests.conftest import small_instance
from tests.models import llama3_8b
from tests.placement_checks import assert_master_prices_as_evaluator

MODEL = llama3_8b()
GPU = resolve_gpu("h100")
FULL = TrainingSpec(global_batch_size=64, seq_length=4096, framework="nemo")
LORA = FULL.model_copy(update={"lora": LoraSpec(rank=16)})
PLAN = make_plan(num_layers=32, dp=8, pp=1, tp=1, micro_batch_size=1)
CAL = framework_calibration(calibration_for(GPU), FULL)


def times(gemms: list[Gemm]) -> float:
    return sum(gemm_time_s(g, GPU, CAL) for g in gemms)


def test_a_layer_skips_its_weight_gradients_and_adds_its_adapters() -> None:
    """Forward: + the adapters' 8 GEMMs.  Backward: - the 4 weight gradients of QKV,
    projection, FC1 and FC2, + the adapters' data and weight gradients (16 GEMMs).  An
    adapter GEMM moves its operands and result once, 2 B each: A of QKV (4096 tokens,
    h = 4096, r = 16) 2 x (4096 x 4096 + 4096 x 16 + 4096 x 16) B."""
    full, lora = (layer_times(MODEL, t, GPU, PLAN, 0.0) for t in (FULL, LORA))
    base = [g for g in layer_gemms(MODEL, 4096, 1, 1) if g.name not in ATTENTION_CORE]
    adapters = adapter_gemms(MODEL, LORA, PLAN)
    assert len(adapters) == 8 and adapters[0] == Gemm("linear_qkv.lora_a", 4096, 16, 4096)
    rate = GPU.hbm_bandwidth_bytes_per_s * CAL.hbm_efficiency

    def hbm(gemms: list[Gemm]) -> float:
        return sum(2.0 * (g.m * g.k + g.k * g.n + g.m * g.n) for g in gemms) / rate

    assert hbm([adapters[0]]) == 2.0 * (4096 * 4096 + 2 * 4096 * 16) / rate
    wgrads = [g.backward()[1] for g in base]
    assert lora.forward_s - full.forward_s == pytest.approx(hbm(list(adapters)), rel=1e-9)
    added = hbm([x for g in adapters for x in g.backward()])
    assert full.backward_s - lora.backward_s == pytest.approx(times(wgrads) - added, rel=1e-9)
    assert lora.backward_s < full.backward_s


def test_the_lm_head_and_the_embedding_are_frozen() -> None:
    """The LM head's backward loses its weight gradient (``h x V`` over the tokens); the
    embedding's backward (the scatter-add into the table) is gone."""
    (emb_full, head_full), (emb_lora, head_lora) = (
        boundary_times(MODEL, t, GPU, PLAN, 0.0, CAL) for t in (FULL, LORA)
    )
    head = Gemm("lm_head", 4096, padded_vocab_size(MODEL, 1), 4096)
    assert emb_lora[1] == 0.0 < emb_full[1]
    assert head_full[1] - head_lora[1] == pytest.approx(times([head.backward()[1]]), rel=1e-9)
    assert emb_lora[0] == emb_full[0] and head_lora[0] == head_full[0]


def test_the_optimizer_step_touches_the_adapters_alone() -> None:
    """32 layers of r (a + b) = 16 x (4096 + 6144 + 4096 + 4096 + 4096 + 28672 + 14336 +
    4096) = 16 x 69632 = 1,114,112 adapter parameters: 35,651,584 on the GPU.  Without the
    distributed optimizer Adam moves 30 B of each, the norm pass reads the fp32 gradient
    (4 B) and the zeroing writes it (4 B): 38 B at the calibrated HBM rate."""
    adapters = 32 * 16 * 69632
    assert adapters == 35_651_584
    plan = make_plan(num_layers=32, dp=8, pp=1, tp=1, micro_batch_size=1,
                     distributed_optimizer=False)  # fmt: skip
    rate = GPU.hbm_bandwidth_bytes_per_s * calibration_for(GPU).hbm_efficiency
    step = optimizer_step_time_s(MODEL, LORA, GPU, plan, 0)
    assert step == pytest.approx(adapters * 38 / rate, rel=1e-12)
    assert step < optimizer_step_time_s(MODEL, FULL, GPU, plan, 0) / 100


def test_a_measured_profile_is_refused_under_lora() -> None:
    profile = LayerProfile(
        gpu="H100", entries=(LayerProfileEntry(tp=1, micro_batch_size=1, forward_s=1.0,
                                               backward_s=2.0),),
    )  # fmt: skip
    from pipette_cp.cost.compute.model_chunks import measured_layer_times

    with pytest.raises(UnsupportedError, match=r"^training.lora="):
        measured_layer_times(profile, MODEL, LORA, PLAN, 0.0)


def test_the_gradient_sync_and_the_step_shrink_and_compute_drops() -> None:
    """On the shared 8-layer A100 instance: the DP gradient sync, the optimizer step,
    the compute and the peak all drop."""
    inst = small_instance()
    lora = inst.model_copy(
        update={"training": inst.training.model_copy(update={"lora": LoraSpec(rank=16)})}
    )
    plan = make_plan(num_layers=8, dp=4, pp=2, tp=1, micro_batch_size=1)
    full, tuned = evaluate(inst, plan), evaluate(lora, plan)
    assert tuned.breakdown_s.dp_comm < full.breakdown_s.dp_comm
    assert tuned.breakdown_s.optimizer < full.breakdown_s.optimizer
    assert tuned.breakdown_s.compute < full.breakdown_s.compute
    assert tuned.memory_bytes_max < full.memory_bytes_max


@pytest.mark.parametrize("knobs", [{}, {"dp_sharding": "optim"}])
def test_the_placement_master_prices_lora_as_the_evaluator(knobs: dict[str, object]) -> None:
    inst = small_instance()
    lora = inst.model_copy(
        update={"training": inst.training.model_copy(update={"lora": LoraSpec(rank=16)})}
    )
    plan = make_plan(num_layers=8, dp=4, pp=2, tp=1, micro_batch_size=1, **knobs)
    evaluator = Evaluator(lora, dp_algorithm="ring", validate=False)
    assert_master_prices_as_evaluator(lora, plan, evaluator, seed=3, draws=3)
