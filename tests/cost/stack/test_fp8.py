"""FP8 training: the spec, the GEMM and cast times, the memory, the Megatron export and the
calibration rows."""

from __future__ import annotations

import re

import pytest

from pipette_cp.cost.compute.model_chunks import _boundary_times, chunk_times, layer_times
from pipette_cp.cost.evaluator.evaluate import evaluate
from pipette_cp.cost.memory.peak import activation_bytes_per_layer, memory_by_stage
from pipette_cp.cost.network.data_parallel import gradient_wire_bytes
from pipette_cp.cost.stack.calibration import GPU_CALIBRATION, calibration_for, peak_fp8_flops
from pipette_cp.cost.stack.frameworks import framework_calibration
from pipette_cp.cost.stack.kernels import (
    check_precision,
    fp8_format,
    is_blackwell,
    quantization_cast_bytes,
)
from pipette_cp.cost.workload.parameters import layer_gemm_params_per_gpu
from pipette_cp.errors import SpecError
from pipette_cp.experiments.models.fp8_accuracy import FP8_GPU_FAMILY, fit_fp8, fp8_rows, run_fp8
from pipette_cp.experiments.models.published_runs_setup import fp8_family_setup
from pipette_cp.report.megatron.check import check_megatron_argv
from pipette_cp.report.megatron.flags import before_blackwell, megatron_argv, megatron_environment
from pipette_cp.specs import Instance, TrainingSpec, resolve_gpu, validate_spec
from pipette_cp.specs.layouts import make_plan
from pipette_cp.units import BYTES_PER_ELEMENT
from tests.conftest import small_instance
from tests.models import LLAMA_STYLE, gpt_model

MODEL = gpt_model("llama-like", 8, 8192, 64, num_kv_heads=8, ffn_hidden_size=28672,
                  vocab_size=32000, max_seq_length=4096, tied_embeddings=False,
                  **LLAMA_STYLE)  # fmt: skip
H100 = resolve_gpu("h100")


def training(precision: str = "bf16", **extra: object) -> TrainingSpec:
    return TrainingSpec(global_batch_size=64, seq_length=4096, precision=precision, **extra)  # type: ignore[arg-type]


def plan(tp: int = 1, **extra: object):
    return make_plan(num_layers=8, dp=8, pp=1, tp=tp, micro_batch_size=1, **extra)  # type: ignore[arg-type]


def fp8_instance(gpu: str = "h100", **extra: object) -> Instance:
    inst = small_instance(gpu=gpu)
    return inst.model_copy(update={"training": inst.training.model_copy(update={"precision": "fp8", **extra})})  # fmt: skip


# ------------------------------------------------------------------------------ spec
def test_fp8_fields_only_with_fp8_precision() -> None:
    spec = {"global_batch_size": 8, "seq_length": 256}
    assert validate_spec(TrainingSpec, {**spec, "precision": "fp8"}, "training").fp8_recipe is None
    with pytest.raises(SpecError, match=r"training\.fp8_recipe='mxfp8': only with precision fp8"):
        validate_spec(TrainingSpec, {**spec, "fp8_recipe": "mxfp8"}, "training")
    with pytest.raises(SpecError, match=r"training\.fp8_format='e4m3': only with precision fp8"):
        validate_spec(TrainingSpec, {**spec, "precision": "bf16", "fp8_format": "e4m3"}, "training")


def test_fp8_format_defaults_to_transformer_engine_recipe_default() -> None:
    assert fp8_format(training("fp8")) == "hybrid"  # delayed
    assert fp8_format(training("fp8", fp8_recipe="tensorwise")) == "hybrid"
    assert fp8_format(training("fp8", fp8_recipe="blockwise")) == "e4m3"
    assert fp8_format(training("fp8", fp8_recipe="mxfp8")) == "e4m3"
    assert fp8_format(training("fp8", fp8_recipe="mxfp8", fp8_format="hybrid")) == "hybrid"


def test_fp8_keeps_bf16_tensors_between_layers_and_fp32_gradients_on_the_wire() -> None:
    assert BYTES_PER_ELEMENT["fp8"] == BYTES_PER_ELEMENT["bf16"] == 2
    assert gradient_wire_bytes(training("fp8")) == gradient_wire_bytes(training("bf16")) == 4.0


# ------------------------------------------------------------------------ GPU rules
@pytest.mark.parametrize("gpu", ["a100", "a100-40gb", "v100", "v100-16gb"])
def test_fp8_refused_on_gpus_without_fp8_tensor_cores(gpu: str) -> None:
    spec = resolve_gpu(gpu)
    with pytest.raises(SpecError, match=r"^training\.precision='fp8': FP8 needs FP8 tensor cores"):
        check_precision(training("fp8"), spec)
    with pytest.raises(SpecError, match=re.escape(spec.name)):
        layer_times(MODEL, training("fp8"), spec, plan(), 100e9)
    with pytest.raises(SpecError, match=r"training\.precision"):
        evaluate(fp8_instance(gpu), make_plan(num_layers=8, dp=8, pp=1, tp=1, micro_batch_size=1))


@pytest.mark.parametrize("gpu", ["h100", "h200", "b200", "gb200", "mi300x"])
def test_fp8_accepted_on_gpus_with_fp8_tensor_cores(gpu: str) -> None:
    check_precision(training("fp8"), resolve_gpu(gpu))
    check_precision(training("fp8", fp8_recipe="tensorwise"), resolve_gpu(gpu))


def test_mxfp8_only_on_blackwell_and_blockwise_on_hopper_or_blackwell() -> None:
    mx, block = training("fp8", fp8_recipe="mxfp8"), training("fp8", fp8_recipe="blockwise")
    for name in ("h100", "h200", "mi300x"):
        with pytest.raises(SpecError, match=r"^training\.fp8_recipe='mxfp8': runs on Blackwell"):
            check_precision(mx, resolve_gpu(name))
    for name in ("b200", "gb200"):
        assert is_blackwell(resolve_gpu(name))
        check_precision(mx, resolve_gpu(name))
        check_precision(block, resolve_gpu(name))
    check_precision(block, H100)
    with pytest.raises(SpecError, match=r"blockwise.*Hopper or Blackwell.*MI300X"):
        check_precision(block, resolve_gpu("mi300x"))


def test_bf16_ignores_the_gpu_rules() -> None:
    check_precision(training("bf16"), resolve_gpu("v100"))


# --------------------------------------------------------------------------- compute
def test_fp8_layer_faster_than_bf16_on_h100_by_less_than_the_peak_ratio() -> None:
    """A GEMM-bound layer (70B-like widths, 4k tokens): FP8 speeds the layer GEMMs up,
    but attention, element-wise work and the casts do not follow, nor does the ceiling."""
    bf16 = layer_times(MODEL, training("bf16"), H100, plan(), 100e9)
    fp8 = layer_times(MODEL, training("fp8"), H100, plan(), 100e9)
    peak_ratio = H100.peak_fp8_flops_per_s / H100.peak_flops_per_s
    for one, other in ((bf16.forward_s, fp8.forward_s), (bf16.backward_s, fp8.backward_s)):
        assert 1.3 < one / other < peak_ratio


def test_tensorwise_costs_more_than_delayed_and_blockwise_gemms_are_slower() -> None:
    times = {
        recipe: layer_times(MODEL, training("fp8", fp8_recipe=recipe), H100, plan(), 100e9)
        for recipe in ("delayed", "tensorwise", "blockwise")
    }
    assert times["delayed"].forward_s < times["tensorwise"].forward_s
    assert times["delayed"].forward_s < times["blockwise"].forward_s
    delayed, tensorwise = (quantization_cast_bytes(MODEL, training("fp8", fp8_recipe=r), plan()) for r in ("delayed", "tensorwise"))  # fmt: skip
    assert tensorwise[0] == pytest.approx(1.5 * delayed[0])  # one more bf16 read for the amax


def test_lm_head_and_embedding_stay_bf16() -> None:
    cal = framework_calibration(calibration_for(H100), training())
    p = make_plan(num_layers=8, dp=8, pp=2, tp=2, micro_batch_size=1)
    assert _boundary_times(MODEL, training("fp8"), H100, p, 100e9, cal) == _boundary_times(
        MODEL, training("bf16"), H100, p, 100e9, cal
    )
    fp8, bf16 = (chunk_times(MODEL, training(x), H100, p, 100e9) for x in ("fp8", "bf16"))
    assert (fp8.forward_s < bf16.forward_s).all()


def test_fp8_ceiling_is_fitted_and_physical() -> None:
    cal = GPU_CALIBRATION[FP8_GPU_FAMILY]
    assert 0.4 < cal.fp8_gemm_efficiency_max < 0.9
    assert peak_fp8_flops(H100) == H100.peak_fp8_flops_per_s
    assert calibration_for(resolve_gpu("h200")).fp8_gemm_efficiency_max == cal.fp8_gemm_efficiency_max  # fmt: skip


# ---------------------------------------------------------------------------- memory
@pytest.mark.parametrize("tp", [1, 4])
def test_fp8_adds_the_fp8_weight_copies(tp: int) -> None:
    p = plan(tp=tp, distributed_optimizer=True)
    (bf16,), (fp8,) = (memory_by_stage(MODEL, training(x), p) for x in ("bf16", "fp8"))
    extra = MODEL.num_layers * layer_gemm_params_per_gpu(MODEL, tp) * 2.0  # two 1 B layouts
    assert fp8.weights >= bf16.weights
    assert fp8.weights - bf16.weights == pytest.approx(extra)
    assert (fp8.gradients, fp8.optimizer_state) == (bf16.gradients, bf16.optimizer_state)


def test_transformer_engine_keeps_fp8_gemm_inputs_torchao_keeps_bf16() -> None:
    p = plan(tp=2, sequence_parallel=True)
    bf16 = activation_bytes_per_layer(MODEL, training("bf16"), p)
    te = activation_bytes_per_layer(MODEL, training("fp8"), p)
    tokens, h, f, q = 4096, MODEL.hidden_size, MODEL.ffn_hidden_size, 64 * 128
    # QKV and FC1 inputs 1 B instead of 2 (sequence parallel: / tp), FC2 input 1 B instead
    # of 2, the FP8 projection input beside FlashAttention's bf16 output (+1 B)
    assert bf16 - te == pytest.approx(tokens * (2 * h / 2 + f / 2 - q / 2))
    titan = training("fp8", framework="torchtitan")
    assert activation_bytes_per_layer(MODEL, titan, p) == bf16
    assert memory_by_stage(MODEL, titan, p)[0].weights == memory_by_stage(MODEL, training(), p)[0].weights  # fmt: skip


def test_bf16_memory_unchanged_by_the_fp8_fields() -> None:
    p = plan(tp=2, sequence_parallel=True)
    assert memory_by_stage(MODEL, training("bf16"), p) == memory_by_stage(MODEL, training(), p)


# ---------------------------------------------------------------------------- export
def _flags(argv: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for i, token in enumerate(argv):
        if token.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out[token] = None if nxt is None or nxt.startswith("--") else nxt
    return out


def test_export_fp8_flags_pass_the_megatron_check() -> None:
    inst = fp8_instance("h100")
    p = make_plan(num_layers=8, dp=4, pp=1, tp=2, micro_batch_size=1, sequence_parallel=True)
    argv = megatron_argv(inst, p)
    flags = _flags(argv)
    assert "--bf16" in flags and "--fp8" not in flags
    assert flags["--fp8-format"] == "hybrid" and flags["--fp8-recipe"] == "delayed"
    assert flags["--fp8-amax-history-len"] == "1024" and flags["--fp8-amax-compute-algo"] == "max"
    parsed = check_megatron_argv(argv, megatron_environment(inst, p), before_blackwell=before_blackwell(inst))  # fmt: skip
    assert parsed["fp8"][1] == "hybrid" and parsed["fp8_recipe"][1] == "delayed"


def test_export_tensorwise_has_no_amax_history_and_bf16_no_fp8_flags() -> None:
    p = make_plan(num_layers=8, dp=8, pp=1, tp=1, micro_batch_size=1)
    flags = _flags(megatron_argv(fp8_instance("h100", fp8_recipe="tensorwise", fp8_format="e4m3"), p))  # fmt: skip
    assert (flags["--fp8-recipe"], flags["--fp8-format"]) == ("tensorwise", "e4m3")
    assert "--fp8-amax-history-len" not in flags
    bf16 = _flags(megatron_argv(small_instance(gpu="h100"), p))
    assert "--bf16" in bf16 and not any(f.startswith("--fp8") for f in bf16)


def test_export_mxfp8_on_blackwell() -> None:
    inst = fp8_instance("b200", fp8_recipe="mxfp8")
    p = make_plan(num_layers=8, dp=8, pp=1, tp=1, micro_batch_size=1)
    argv = megatron_argv(inst, p)
    assert _flags(argv)["--fp8-recipe"] == "mxfp8" and _flags(argv)["--fp8-format"] == "e4m3"
    check_megatron_argv(argv, megatron_environment(inst, p), before_blackwell=False)


# ----------------------------------------------------------------------- calibration
def test_fp8_calibration_rows_load() -> None:
    rows = fp8_rows()
    families = sorted({(r["source"].split("/")[1].split()[0], s) for r, s in rows})
    assert len(rows) == 22 and families  # 10 NeMo FP8, 8 torchtitan FP8, 4 torchtitan BF16
    for row, _ in rows:
        setup = fp8_family_setup(row)
        expected = "fp8" if "precision=fp8" in row["notes"] else "bf16"
        assert setup.instance.training.precision == expected
    results = run_fp8()
    assert sum(r.precision == "fp8" for r in results) == 18
    assert all(r.predicted > 0 and r.measured > 0 for r in results)
    nemo = [abs(r.time_error) for r in results if r.family == "nemo"]
    assert max(nemo) < 0.15


@pytest.mark.slow
def test_catalogue_fp8_ceiling_is_the_fit() -> None:
    eta, _ = fit_fp8()
    assert GPU_CALIBRATION[FP8_GPU_FAMILY].fp8_gemm_efficiency_max == pytest.approx(eta)
