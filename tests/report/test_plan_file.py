"""The plan file and the plans of ``--json`` are one document: it reads back as the plan
it was written from, and anything else is refused naming the key."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.cost.evaluator.layout_rules import validate_layout
from pipette_cp.errors import InfeasibleError, SpecError
from pipette_cp.io.instance_file import instance_from_mapping, load_instance
from pipette_cp.report.plan_file import DOCUMENT_KEYS, FORMAT, plan_document, read_plan_document
from pipette_cp.report.plans import plans_json
from pipette_cp.search.space import enumerate_layouts
from pipette_cp.specs.layouts import make_plan

#: a mixture-of-experts model on a healthy cluster (every default placement works)
MOE = {"name": "qwen3-moe-h100-256", "model": "qwen3-235b-a22b",
       "cluster": {"generator": {"kind": "h100-multileaf", "nodes": 32, "seed": 0}},
       "training": {"global_batch_size": 1024, "seq_length": 4096}}  # fmt: skip


def _evaluated(name: str, count: int, seed: int = 0):
    instance = instance_from_mapping(MOE) if name == MOE["name"] else load_instance(name)
    evaluator = Evaluator(instance, validate=False)
    layouts = list(itertools.islice(enumerate_layouts(instance), 4000))
    for plan in random.Random(seed).sample(layouts, min(count, len(layouts))):
        try:
            evaluation = evaluator.evaluate(plan)
        except InfeasibleError:  # its default placement crosses a failed pair
            continue
        yield evaluator, plan.model_copy(update={"evaluation": evaluation, "instance": name})


@pytest.mark.parametrize("name", ["gpt3-2.7b-g1-64", "llama-2-7b-g3-32",
                                  MOE["name"]])  # fmt: skip
def test_a_document_reads_back_as_its_plan(name: str) -> None:
    seen = 0
    for evaluator, plan in _evaluated(name, 40):
        again = read_plan_document(json.loads(json.dumps(plan_document(plan))))
        assert (again.layout(), again.placement, again.layer_split) == (
            plan.layout(), plan.placement, plan.layer_split)  # fmt: skip
        assert again.instance == name
        ev, back = plan.evaluation, again.evaluation
        assert back is not None and back.fits == ev.fits
        assert back.iteration_time_s == ev.iteration_time_s
        assert back.memory_bytes_max == pytest.approx(ev.memory_bytes_max, rel=1e-12)
        # the knobs as written (sharding as it takes effect) give the same prediction
        assert evaluator.evaluate(again).iteration_time_s == ev.iteration_time_s
        seen += 1
    assert seen >= 10


def test_json_output_and_plan_file_are_the_same_document() -> None:
    _, plan = next(_evaluated("gpt3-2.7b-g1-64", 1))
    (entry,) = plans_json([plan])
    assert entry == plan_document(plan)
    assert entry["format"] == FORMAT
    extra = set(entry) - set(type(plan).model_fields)
    assert extra <= set(DOCUMENT_KEYS), extra - set(DOCUMENT_KEYS)


def test_a_plan_dumped_by_an_older_version_still_reads() -> None:
    _, plan = next(_evaluated("gpt3-2.7b-g1-64", 1))
    assert read_plan_document(json.loads(plan.model_dump_json())) == plan


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"format": "pipette-cp-plan/9"}, "plan.format"),
        ({"iteration_time": 1.0}, "plan.iteration_time"),
        ({"memory_limit_gb": "80GB"}, "plan.memory_limit_gb"),
        ({"dp": 0}, "plan.dp"),
    ],
)
def test_a_bad_document_names_the_key(change: dict, field: str) -> None:
    _, plan = next(_evaluated("gpt3-2.7b-g1-64", 1))
    with pytest.raises(SpecError) as info:
        read_plan_document(plan_document(plan) | change)
    assert str(info.value).startswith(f"{field}="), str(info.value)


def test_a_document_without_its_evaluation_keys_is_refused() -> None:
    _, plan = next(_evaluated("gpt3-2.7b-g1-64", 1))
    doc = plan_document(plan)
    del doc["memory_limit_gb"]
    with pytest.raises(SpecError, match="memory_limit_gb"):
        read_plan_document(doc)


@pytest.mark.parametrize("sharding", [None, "none", "optim", "optim_grads_params"])
def test_sharding_as_it_takes_effect_reads_back(sharding: str | None) -> None:
    """The document reports dp_sharding and dp_shard_size as they take effect (the shard
    group is every dp rank when the plan names none): that reads back as the plan."""
    instance = load_instance("gpt3-2.7b-g1-64")
    plan = make_plan(num_layers=instance.model.num_layers, dp=16, pp=1, tp=4, micro_batch_size=1,
                     **({} if sharding is None else {"dp_sharding": sharding}))  # fmt: skip
    plan = plan.model_copy(update={"evaluation": Evaluator(instance).evaluate(plan)})
    document = plan_document(plan)
    assert document["dp_shard_size"] == 16
    again = read_plan_document(json.loads(json.dumps(document)))
    assert again.layout() == plan.layout() and again.sharding == plan.sharding
    assert again.shard_group == plan.shard_group
    validate_layout(instance, again)  # the rules export and plot apply to a loaded plan
