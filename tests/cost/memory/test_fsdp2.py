"""torchtitan's peak memory: the PyTorch-native terms (pipette_cp.cost.memory.fsdp2) and
the per-row predictions against the benchmark's reserved peaks (the predicted peak less
the runtime constant, which the GPU holds outside the caching allocator)."""

from __future__ import annotations

import pytest

from pipette_cp.cost.memory import fsdp2 as memory_fsdp2
from pipette_cp.cost.memory.peak import memory_by_stage
from pipette_cp.cost.stack.frameworks import _FSDP_RUNTIME_BYTES
from pipette_cp.experiments.models.accuracy import read_rows
from pipette_cp.experiments.models.calibration_split import family
from pipette_cp.experiments.models.moe_cp_setup import MOE_CP_CSV, moe_cp_setup, row_cp
from pipette_cp.experiments.models.published_runs_setup import fp8_family_setup
from pipette_cp.experiments.models.torchtitan_rows import (
    MEMORY_TARGET,
    MEMORY_UNDER,
    reserved_peak_gib,
)
from pipette_cp.units import GiB

#: row index: (measured GiB, predicted GiB) of every torchtitan row (pinned).
PINNED = {
    30: (82.4, 82.85), 31: (77.0, 81.82), 32: (76.8, 82.27), 33: (67.0, 68.83),
    34: (62.0, 67.79), 35: (61.8, 68.24), 36: (83.9, 90.06), 37: (84.2, 92.82),
    38: (84.0, 93.93), 39: (84.5, 96.14), 40: (71.9, 69.85), 41: (67.6, 69.85),
    42: (82.5, 72.01), 43: (72.7, 70.05), 44: (75.3, 72.01), 45: (75.9, 73.39),
    46: (77.1, 73.94), 47: (84.9, 75.04),
}  # fmt: skip
#: Rows still below the measurement by more than MEMORY_UNDER, with the reason.
UNDER = {
    42: "405B 1F1B seq 8192 mb4: -12.7 %; 7 GiB above the mb1 seq 32768 twin (row 44) "
    "with the same tokens per micro-batch: not explained by a modelled term",
    43: "405B interleaved, 16 micro-batches of 2 (torchtitan's default, one per stage): -3.6 %",
    44: "405B 1F1B seq 32768: -4.4 %",
    45: "405B cp2: -3.3 %",
    46: "405B cp4: -4.1 %",
    47: "405B cp8: -11.6 %; the measured growth with cp (+9 GiB from cp2) exceeds the "
    "ring all-gather's (+1.5 GiB)",
}
#: Rows more than MEMORY_TARGET above the measurement, with the reason.
OVER = {
    35: "8B dp128 compiled Float8: +10.4 %",
    37: "8B cp2: +10.2 %; the ring's working set summed with the loss's logits, which the "
    "loss's backward frees first (see row 39)",
    38: "8B cp4: +11.8 %; as row 37",
    39: "8B cp8: +13.8 %; as row 37 (the larger of the two alone: -6.1 %, and the 70B rows "
    "-20 to -25 %: the reserved peaks hold both)",
}


def _predicted_gib(index: int) -> float:
    row = read_rows(MOE_CP_CSV)[index]
    assert family(row) == "torchtitan"
    setup = moe_cp_setup(row) if row_cp(row) > 1 else fp8_family_setup(row)
    return reserved_peak_gib(setup.instance, setup.plan)


@pytest.mark.parametrize("index", sorted(PINNED))
def test_pinned_prediction(index: int) -> None:
    measured, predicted = PINNED[index]
    assert float(read_rows(MOE_CP_CSV)[index]["measured_mem_gb_per_gpu"]) == measured
    assert _predicted_gib(index) == pytest.approx(predicted, abs=0.05)


def _marks(index: int, table: dict[int, str]) -> list[pytest.MarkDecorator]:
    return [pytest.mark.xfail(reason=table[index], strict=True)] if index in table else []


@pytest.mark.parametrize("index", [pytest.param(i, marks=_marks(i, UNDER)) for i in sorted(PINNED)])
def test_never_below_by_more_than_3_percent(index: int) -> None:
    measured, _ = PINNED[index]
    assert _predicted_gib(index) / measured - 1 >= -MEMORY_UNDER


@pytest.mark.parametrize("index", [pytest.param(i, marks=_marks(i, OVER)) for i in sorted(PINNED)])
def test_within_target_above(index: int) -> None:
    measured, _ = PINNED[index]
    assert _predicted_gib(index) / measured - 1 <= MEMORY_TARGET


def test_reserved_peak_leaves_out_the_runtime_constant() -> None:
    """The fit decision counts FSDP's runtime constant (CUDA context, NCCL buffers); the
    rows' reserved peak has none of it, but the allocator's reserve."""
    row = read_rows(MOE_CP_CSV)[36]
    setup = fp8_family_setup(row)
    inst = setup.instance
    stages = memory_by_stage(inst.model, inst.training, setup.plan)
    assert stages[0].runtime == pytest.approx(_FSDP_RUNTIME_BYTES)
    assert stages[0].allocator > 0.0
    assert stages[0].reserved_bytes == pytest.approx(stages[0].total_bytes - _FSDP_RUNTIME_BYTES)
    assert reserved_peak_gib(inst, setup.plan) == pytest.approx(stages[0].reserved_bytes / GiB)


def _setup(index: int):
    row = read_rows(MOE_CP_CSV)[index]
    setup = moe_cp_setup(row) if row_cp(row) > 1 else fp8_family_setup(row)
    return setup.instance.model, setup.instance.training, setup.plan


def test_root_group_gathered_at_pp1() -> None:
    model, training, plan = _setup(36)  # 8B, FSDP 8, pp 1
    root = 2.0 * (2 * model.vocab_size * model.hidden_size + model.norm_params)
    assert memory_fsdp2.fsdp2_bytes(model, training, plan) == pytest.approx(root)
    assert memory_fsdp2.pipeline_buffer_bytes(model, training, plan, 0, 8) == 0.0


def test_pipeline_buffers_first_and_last_stage() -> None:
    model, training, plan = _setup(44)  # 405B, pp 8, 8 micro-batches of 1 x 32768
    edge = memory_fsdp2.boundary_bytes(model, training, plan)
    assert edge == pytest.approx(2.0 * 32768 * model.hidden_size / 8)
    first = memory_fsdp2.pipeline_buffer_bytes(model, training, plan, 0, 8)
    assert first == pytest.approx(2 * 8 * edge)  # outputs and output-gradient buffers
    logits = 2.0 * 32768 * model.vocab_size / 8
    last = memory_fsdp2.pipeline_buffer_bytes(model, training, plan, 7, 8)
    assert last == pytest.approx(8 * logits + 7 * edge)  # every logits; idle input buffers


def test_ring_attention_grows_with_cp() -> None:
    terms = [memory_fsdp2.ring_attention_bytes(*_setup(i)) for i in (44, 45, 46, 47)]
    assert terms[0] == 0.0
    assert terms[1] < terms[2] < terms[3]


def test_other_frameworks_unchanged() -> None:
    model, training, plan = _setup(44)
    nemo = training.model_copy(update={"framework": training.framework.model_copy(
        update={"name": "nemo"})})  # fmt: skip
    assert memory_fsdp2.stage_extra_bytes(model, nemo, plan, 0, 8) == 0.0
    assert memory_fsdp2.stage_extra_bytes(model, training, plan, 0, 8) > 0.0
