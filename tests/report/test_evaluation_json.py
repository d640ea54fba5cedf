"""``predict --json``: the degrees, every knob's fields (derived from the declarations),
the split and the evaluation."""

from __future__ import annotations

from pipette_cp.cost.evaluator.evaluate import evaluate
from pipette_cp.report.evaluation import evaluation_json
from pipette_cp.specs.knobs import KNOBS
from pipette_cp.specs.layouts import make_plan
from tests.conftest import small_instance


def test_every_knob_field_and_degree_is_reported() -> None:
    instance = small_instance()
    plan = make_plan(num_layers=8, dp=2, pp=2, tp=2, micro_batch_size=1, dp_sharding="optim")
    out = evaluation_json(plan, evaluate(instance, plan))
    fields = {field for knob in KNOBS for field in knob.fields}
    assert fields | {"dp", "pp", "tp", "cp", "ep", "etp"} <= set(out)
    assert (out["dp_sharding"], out["dp_shard_size"]) == ("optim", 2)  # as they take effect
    assert out["layout"] == plan.layout() and out["fits"] is True
