"""Architecture features a model file may describe but the time model does not price
are refused by name, and the Megatron export carries the ones it does (QK norm)."""

from __future__ import annotations

import pytest
from conftest import small_instance

from pipette_cp.cost.evaluate import Evaluator
from pipette_cp.errors import LayoutError
from pipette_cp.io.model_file import load_model
from pipette_cp.report.megatron import model_args
from pipette_cp.specs.layouts import make_plan


@pytest.mark.parametrize(
    ("field", "value", "what"),
    [
        ("sliding_window", 4096, "sliding-window attention"),
        ("attention_sinks", True, "attention sinks"),
    ],
)
def test_unpriced_attention_features_are_refused(field, value, what) -> None:
    instance = small_instance()
    model = instance.model.model_copy(update={field: value})
    instance = instance.model_copy(update={"model": model})
    plan = make_plan(num_layers=8, dp=2, pp=2, tp=2, micro_batch_size=1)
    with pytest.raises(LayoutError, match=f"model.{field}=.*{what} is not in the cost model"):
        Evaluator(instance).evaluate(plan)


def test_qwen3_exports_its_qk_norm() -> None:
    instance = small_instance().model_copy(update={"model": load_model("qwen3-8b")})
    assert instance.model.qk_norm
    assert "--qk-layernorm" in model_args(instance)
