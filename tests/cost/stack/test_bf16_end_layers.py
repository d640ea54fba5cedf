"""Layers kept in bf16 under a quantised precision (``training.bf16_first_layers`` and
``bf16_last_layers``: Megatron ``--first-last-layers-bf16``): which layers, their time,
memory and weight copies, the split models' claim, the export."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pipette_cp.cost.compute.model_chunks import chunk_times, layer_times
from pipette_cp.cost.memory.peak import memory_by_stage
from pipette_cp.cost.memory.state import stage_fp8_weight_bytes
from pipette_cp.cost.workload.bf16_layers import bf16_layers_by_chunk, bf16_training
from pipette_cp.cost.workload.parameters import layer_gemm_params_per_gpu
from pipette_cp.report.megatron.check import check_megatron_argv
from pipette_cp.report.megatron.flags import megatron_argv
from pipette_cp.solvers.split.cost import uniform_layers
from pipette_cp.specs import TrainingSpec
from tests.cost.stack.test_fp8 import H100, MODEL, fp8_instance, plan, training

ENDS = {"bf16_first_layers": 1, "bf16_last_layers": 2}


def test_the_first_and_last_layers_by_chunk() -> None:
    t = training("fp8", **ENDS)
    p = plan().model_copy(update={"pp": 2, "dp": 4, "layer_split": (3, 5)})
    counts = bf16_layers_by_chunk(MODEL, t, p)
    assert list(counts) == ["dense"] and counts["dense"].tolist() == [1.0, 2.0]
    assert bf16_layers_by_chunk(MODEL, training("fp8"), p) == {}


def test_only_under_a_quantised_precision() -> None:
    with pytest.raises(ValidationError, match="bf16_first_layers"):
        TrainingSpec(global_batch_size=8, seq_length=1024, bf16_first_layers=1)
    with pytest.raises(ValidationError, match="exceed the model's 8 layers"):
        fp8_instance().model_validate(
            fp8_instance().model_dump() | {"training": training("fp8", bf16_first_layers=5,
                                                                bf16_last_layers=4).model_dump()}
        )  # fmt: skip


def test_a_bf16_layer_costs_its_bf16_time() -> None:
    t = training("fp8", **ENDS)
    p = plan()
    fp8_layer = layer_times(MODEL, t, H100, p, 300e9).forward_s
    bf16_layer = layer_times(MODEL, bf16_training(t), H100, p, 300e9).forward_s
    assert bf16_layer > fp8_layer
    quantised = chunk_times(MODEL, training("fp8"), H100, p, 300e9).forward_s
    mixed = chunk_times(MODEL, t, H100, p, 300e9).forward_s
    assert mixed[0] - quantised[0] == pytest.approx(3 * (bf16_layer - fp8_layer))


def test_bf16_layers_keep_bf16_inputs_and_no_quantised_weights() -> None:
    t = training("fp8", **ENDS)
    p = plan()
    (mixed,), (quantised,) = (
        memory_by_stage(MODEL, t, p),
        memory_by_stage(MODEL, training("fp8"), p),
    )
    assert mixed.activations > quantised.activations  # 2 B GEMM inputs instead of 1 B
    copies = stage_fp8_weight_bytes(MODEL, training("fp8"), p, 0)
    fewer = stage_fp8_weight_bytes(MODEL, t, p, 0)
    per_layer = copies / 8
    assert per_layer == pytest.approx(layer_gemm_params_per_gpu(MODEL, 1) * 2.0)  # both layouts
    assert fewer == pytest.approx(copies - 3 * per_layer)


def test_the_split_models_claim_no_optimum() -> None:
    assert uniform_layers(MODEL, training("fp8"))
    assert not uniform_layers(MODEL, training("fp8", **ENDS))
    assert uniform_layers(MODEL, training("bf16"))


def test_megatron_export() -> None:
    inst = fp8_instance(**ENDS)
    argv = megatron_argv(inst, plan())
    i = argv.index("--first-last-layers-bf16")
    assert argv[i + 1 : i + 5] == ["--num-layers-at-start-in-bf16", "1",
                                   "--num-layers-at-end-in-bf16", "2"]  # fmt: skip
    check_megatron_argv(argv)  # Megatron's own parser table takes them
