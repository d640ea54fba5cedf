"""FP8 attention (``training.fp8_attention``): where it runs, its core's time and the bytes
it keeps, and the Megatron-LM export's refusal."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pipette_cp.cost.compute.model_chunks import layer_times
from pipette_cp.cost.evaluator.layout_rules import check_knobs
from pipette_cp.cost.memory.activations import full_layer_activation_bytes
from pipette_cp.cost.stack.attention_variants import FP8_ATTENTION_SPEEDUP
from pipette_cp.errors import LayoutError, UnsupportedError
from pipette_cp.report.megatron.flags import megatron_argv
from pipette_cp.specs import TrainingSpec
from pipette_cp.specs.training import FrameworkProfile
from tests.cost.stack.test_fp8 import H100, MODEL, fp8_instance, plan, training


def test_needs_a_quantised_precision() -> None:
    with pytest.raises(ValidationError, match="fp8_attention"):
        TrainingSpec(global_batch_size=8, seq_length=1024, fp8_attention=True)
    assert TrainingSpec(global_batch_size=8, seq_length=1024, precision="fp4",
                        fp8_attention=True).fp8_attention  # fmt: skip


def test_only_cudnn_runs_it() -> None:
    inst = fp8_instance(fp8_attention=True, attention_kernel="flash3")
    with pytest.raises(LayoutError) as error:
        check_knobs(inst, plan())
    assert error.value.field == "training.attention_kernel"
    check_knobs(fp8_instance(fp8_attention=True, attention_kernel="cudnn"), plan())


def test_torchao_does_not_run_it() -> None:
    torchtitan = FrameworkProfile(name="torchtitan")
    inst = fp8_instance(fp8_attention=True, attention_kernel="cudnn", framework=torchtitan)
    with pytest.raises(LayoutError) as error:
        check_knobs(inst, plan())
    assert error.value.field == "training.fp8_attention"


def test_the_core_runs_faster_by_the_cited_factor() -> None:
    bf16_core = training("fp8", attention_kernel="cudnn")
    fp8_core = bf16_core.model_copy(update={"fp8_attention": True})
    # selective recomputation redoes exactly the attention core's forward
    p = plan(recompute="selective")
    slow = layer_times(MODEL, bf16_core, H100, p, 300e9).recompute_s
    fast = layer_times(MODEL, fp8_core, H100, p, 300e9).recompute_s
    assert fast == pytest.approx(slow / FP8_ATTENTION_SPEEDUP)
    assert abs(FP8_ATTENTION_SPEEDUP - 1.62) < 0.01  # 1.2 PF / 740 TF


def test_queries_keys_values_and_output_are_kept_in_fp8() -> None:
    bf16_core = training("fp8", attention_kernel="cudnn")
    fp8_core = bf16_core.model_copy(update={"fp8_attention": True})
    p = plan()
    saved = full_layer_activation_bytes(MODEL, bf16_core, p)
    saved -= full_layer_activation_bytes(MODEL, fp8_core, p)
    tokens, h, kv = 4096, 8192, 8 * 128
    # Q, K and V at 1 B instead of 2 B, and no bf16 copy of the fused output
    assert saved == pytest.approx(tokens * (h + 2 * kv) * 1.0 + tokens * h * 2.0)


def test_megatron_lm_export_is_refused() -> None:
    inst = fp8_instance(fp8_attention=True, attention_kernel="cudnn")
    with pytest.raises(UnsupportedError) as error:
        megatron_argv(inst, plan())
    assert error.value.field == "training.fp8_attention"
