"""NVFP4 training (``precision: fp4``): where it runs, the GEMM and cast times, the memory
of its kept tensors and weight copies, and the Megatron export."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipette_cp.cost.compute.gemm import fp4_gemm_time_s, hbm_time_s, wave_efficiency
from pipette_cp.cost.compute.model_chunks import layer_times
from pipette_cp.cost.memory.peak import activation_bytes_per_layer, memory_by_stage
from pipette_cp.cost.stack.calibration import calibration_for
from pipette_cp.cost.stack.kernels import (
    FP8_CAST_BYTES,
    NVFP4_BYTES,
    NVFP4_CAST_BYTES,
    check_precision,
    quantization_cast_bytes,
)
from pipette_cp.cost.workload.flops import Gemm
from pipette_cp.cost.workload.parameters import layer_gemm_params_per_gpu
from pipette_cp.errors import SpecError
from pipette_cp.report.megatron.check import check_megatron_argv
from pipette_cp.report.megatron.flags import megatron_argv, megatron_environment
from pipette_cp.specs import TrainingSpec, resolve_gpu
from pipette_cp.specs.gpu import GPU_CATALOG
from pipette_cp.specs.layouts import make_plan
from tests.conftest import small_instance
from tests.cost.stack.test_fp8 import MODEL, plan, training

BLACKWELL = [name for name, gpu in GPU_CATALOG.items() if gpu.architecture == "blackwell"]
OTHERS = [name for name, gpu in GPU_CATALOG.items() if gpu.architecture != "blackwell"]


def fp4_instance(gpu: str = "b200"):
    inst = small_instance(gpu=gpu)
    return inst.model_copy(update={"training": inst.training.model_copy(update={"precision": "fp4"})})  # fmt: skip


# ----------------------------------------------------------------------------- where
@pytest.mark.parametrize("name", BLACKWELL)
def test_nvfp4_runs_on_every_blackwell_part(name: str) -> None:
    check_precision(training("fp4"), GPU_CATALOG[name])


@pytest.mark.parametrize("name", OTHERS)
def test_nvfp4_refused_elsewhere_naming_the_field(name: str) -> None:
    with pytest.raises(SpecError) as refused:
        check_precision(training("fp4"), GPU_CATALOG[name])
    text = str(refused.value)
    assert text.startswith("training.precision='fp4': NVFP4 needs Blackwell GPUs")
    assert f"{name}'s architecture is '{GPU_CATALOG[name].architecture}'" in text


def test_a_user_gpu_without_architecture_but_with_an_fp4_peak_runs_nvfp4() -> None:
    custom = GPU_CATALOG["B200-SXM-180GB"].model_copy(update={"name": "X1", "architecture": "unknown"})  # fmt: skip
    check_precision(training("fp4"), custom)
    bare = custom.model_copy(update={"peak_fp4_flops_per_s": None})
    with pytest.raises(SpecError, match="NVFP4 needs Blackwell GPUs"):
        check_precision(training("fp4"), bare)


def test_nvfp4_is_transformer_engine_s_recipe() -> None:
    """torchtitan's torchao keeps no quantised tensors: NVFP4 is refused there."""
    titan = training("fp4", framework={"name": "torchtitan"})
    with pytest.raises(
        SpecError, match="Transformer Engine's NVFP4 recipe, which framework torchtitan"
    ):
        check_precision(titan, GPU_CATALOG["B200-SXM-180GB"])


def test_the_fp8_fields_stay_refused_with_fp4() -> None:
    with pytest.raises(Exception, match="only with precision fp8"):
        TrainingSpec(global_batch_size=8, seq_length=256, precision="fp4", fp8_recipe="mxfp8")


# ------------------------------------------------------------------------------ time
def test_fp4_gemm_time_by_hand() -> None:
    """A large GEMM: 2mnk / wave efficiency at eta_fp4 x the FP4 peak, plus the fixed
    per-GEMM time W_half / (eta_max x bf16 peak)."""
    gpu = resolve_gpu("gb300")
    cal = calibration_for(gpu)
    g = Gemm("x", 16384, 16384, 8192)
    expected = (g.flops / wave_efficiency(g, cal.num_sms)
                / (cal.fp4_gemm_efficiency_max * gpu.peak_fp4_flops_per_s)
                + cal.gemm_half_saturation_flops / (cal.gemm_efficiency_max * gpu.peak_flops_per_s))  # fmt: skip
    assert fp4_gemm_time_s(g, gpu, cal) == pytest.approx(expected)
    # a skinny GEMM is bound by its traffic: NVFP4 operands, bf16 result
    thin = Gemm("t", 8, 65536, 65536)
    traffic = NVFP4_BYTES * (8 * 65536 + 65536 * 65536) + 2.0 * 8 * 65536
    assert fp4_gemm_time_s(thin, gpu, cal) == pytest.approx(hbm_time_s(traffic, gpu, cal))


def test_nvfp4_casts_cost_more_per_element_than_delayed_fp8() -> None:
    """Amax pass (2 B), read (2 B), write both NVFP4 layouts (2 x 0.5625 B) = 5.125 B."""
    assert pytest.approx(5.125) == NVFP4_CAST_BYTES
    p = plan(tp=2, sequence_parallel=True)
    fp4 = quantization_cast_bytes(MODEL, training("fp4"), p)
    fp8 = quantization_cast_bytes(MODEL, training("fp8"), p)
    ratio = NVFP4_CAST_BYTES / FP8_CAST_BYTES["delayed"]
    assert fp4 == pytest.approx((fp8[0] * ratio, fp8[1] * ratio))


def test_an_nvfp4_layer_is_faster_than_fp8_on_blackwell_for_a_large_model() -> None:
    gpu = resolve_gpu("gb300")
    p = plan(tp=1)
    fp4 = layer_times(MODEL, training("fp4"), gpu, p, 900e9)
    fp8 = layer_times(MODEL, training("fp8", fp8_recipe="mxfp8"), gpu, p, 900e9)
    bf16 = layer_times(MODEL, training("bf16"), gpu, p, 900e9)
    assert fp4.forward_s < fp8.forward_s < bf16.forward_s
    assert fp4.backward_s < fp8.backward_s < bf16.backward_s


# ---------------------------------------------------------------------------- memory
@pytest.mark.parametrize("tp", [1, 4])
def test_nvfp4_weight_copies_are_two_nvfp4_layouts(tp: int) -> None:
    """Row- and column-wise NVFP4 copies of every GEMM weight: 2 x 0.5625 B a parameter
    beside the bf16 weight; gradients and optimizer state unchanged."""
    p = plan(tp=tp, distributed_optimizer=True)
    (bf16,), (fp4,) = (memory_by_stage(MODEL, training(x), p) for x in ("bf16", "fp4"))
    extra = MODEL.num_layers * layer_gemm_params_per_gpu(MODEL, tp) * 2 * 0.5625
    assert fp4.weights - bf16.weights == pytest.approx(extra)
    assert (fp4.gradients, fp4.optimizer_state) == (bf16.gradients, bf16.optimizer_state)


@settings(max_examples=25, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), sp=st.booleans(), mb=st.integers(1, 4))
def test_nvfp4_keeps_less_activation_memory_than_fp8_than_bf16(tp: int, sp: bool, mb: int) -> None:
    """The GEMM inputs kept for the weight gradients: 0.5625 B under NVFP4, 1 B under FP8,
    2 B in bf16: NVFP4 saves 0.4375 B on each of the E elements FP8 keeps at 1 B."""
    p = make_plan(num_layers=8, dp=8, pp=1, tp=tp, micro_batch_size=mb,
                  sequence_parallel=sp and tp > 1)  # fmt: skip
    fp4, fp8, bf16 = (activation_bytes_per_layer(MODEL, training(x), p) for x in ("fp4", "fp8", "bf16"))  # fmt: skip
    assert fp4 < fp8 < bf16
    quantized = (fp8 - fp4) / (1.0 - NVFP4_BYTES)
    assert quantized == pytest.approx(round(quantized))  # a whole number of elements


# ---------------------------------------------------------------------------- export
def test_export_nvfp4_flags_pass_the_megatron_check() -> None:
    inst = fp4_instance("gb300")
    p = make_plan(num_layers=8, dp=8, pp=1, tp=1, micro_batch_size=1)
    argv = megatron_argv(inst, p)
    text = " ".join(argv)
    assert "--bf16" in argv and "--fp4-format e2m1" in text and "--fp4-recipe nvfp4" in text
    assert not any(token.startswith("--fp8") for token in argv)
    parsed = check_megatron_argv(argv, megatron_environment(inst, p), before_blackwell=False)
    assert parsed["fp4"][1] == "e2m1" and parsed["fp4_recipe"][1] == "nvfp4"
