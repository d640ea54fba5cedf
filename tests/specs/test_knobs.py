"""The knob declarations: every plan and search-space field accounted for, the cost key
telling apart plans that differ in any knob, labels, rules by phase, generated options."""

from __future__ import annotations

import types
from typing import Any, Literal, Union, get_args, get_origin

import pytest

from pipette_cp.cli.knob_flags import PLAN_FLAGS, SPACE_FLAGS
from pipette_cp.specs import Plan, SearchSpace
from pipette_cp.specs.knobs import (
    DEGREES,
    KNOBS,
    NOT_KNOBS,
    NOT_SPACE_KNOBS,
    Phase,
    knob_rules,
    knobs_key,
    plan_key,
)
from pipette_cp.specs.layouts import even_split, make_plan

LAYERS = 8


def test_every_plan_field_is_a_degree_a_knob_field_or_not_a_knob() -> None:
    knob_fields = [f for knob in KNOBS for f in knob.fields]
    declared = [*DEGREES, *knob_fields, *NOT_KNOBS]
    assert len(declared) == len(set(declared)), "a field declared twice"
    assert set(Plan.model_fields) == set(declared), (
        "a Plan field is neither a degree, a knob's field (pipette_cp.specs.knobs.KNOBS) "
        "nor in NOT_KNOBS"
    )


def test_every_search_space_field_is_a_degree_a_knob_field_or_not_a_knob() -> None:
    space_fields = [f for knob in KNOBS for f in knob.space_fields]
    declared = [*DEGREES, *space_fields, *NOT_SPACE_KNOBS]
    assert len(declared) == len(set(declared))
    assert set(SearchSpace.model_fields) == set(declared)


def _alternatives(field: str, current: object) -> list[object]:
    """Other values of a plan field, from its annotation (bool, Literal, int, float, a
    tuple of Literal names, None)."""
    annotation = Plan.model_fields[field].annotation
    union = get_origin(annotation) in (Union, types.UnionType)
    options: list[object] = []
    for arg in get_args(annotation) if union else (annotation,):
        if arg is bool:
            options += [True, False]
        elif get_origin(arg) is Literal:
            options += list(get_args(arg))
        elif arg is int:
            options += [1, 2, 4]
        elif arg is float:
            options += [0.0, 0.5, 1.0]
        elif get_origin(arg) is tuple and get_origin(get_args(arg)[0]) is Literal:
            names = get_args(get_args(arg)[0])  # a set of names: the first, the last alone
            options += [(names[0],), (names[-1],)]
        elif arg is type(None):
            options.append(None)
    return [v for v in options if v != current]


def _base() -> Plan:
    # sharding on, so that the shard group matters
    return make_plan(num_layers=LAYERS, dp=8, pp=2, tp=2, micro_batch_size=1,
                     distributed_optimizer=True)  # fmt: skip


@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.name)
def test_knobs_key_tells_apart_plans_that_differ_in_any_knob(knob: Any) -> None:
    """Every field of every knob changes :func:`knobs_key` for some other value (a knob
    left out of the key would serve stale cached costs)."""
    base = _base()
    for field in knob.fields:
        keys = set()
        for value in _alternatives(field, getattr(base, field)):
            data = {**base.model_dump(), field: value}
            if field == "vpp":
                data["layer_split"] = even_split(LAYERS, base.pp, int(value))  # type: ignore[arg-type]
            try:
                plan = Plan.model_validate(data)
            except ValueError:
                continue
            keys.add(knobs_key(plan))
        assert keys - {knobs_key(base)}, f"{knob.name}.{field} does not change knobs_key"


def test_plan_key_is_the_cost_key_and_the_placement() -> None:
    plan = _base()
    moved = plan.model_copy(update={"placement": tuple(reversed(plan.placement))})
    assert knobs_key(moved) == knobs_key(plan) and plan_key(moved) != plan_key(plan)
    renamed = plan.model_copy(update={"instance": "elsewhere", "evaluation": None})
    assert plan_key(renamed) == plan_key(plan)


@pytest.mark.parametrize(
    ("knobs", "label"),
    [
        ({}, "dp8-pp2-tp2-mb1"),
        ({"vpp": 2, "sequence_parallel": True, "recompute": "selective"}, "dp8-pp2-tp2-mb1-vpp2-sp-sel"),
        ({"distributed_optimizer": True}, "dp8-pp2-tp2-mb1-do"),
        ({"dp_sharding": "optim", "dp_shard_size": 4}, "dp8-pp2-tp2-mb1-do-hsdp4"),
        ({"dp_sharding": "optim_grads_params"}, "dp8-pp2-tp2-mb1-zero3"),
        ({"flash_attention": False}, "dp8-pp2-tp2-mb1-nofa"),
        ({"attention_kernel": "eager", "fused_norm": False}, "dp8-pp2-tp2-mb1-nofa-eager-nofusednorm"),
        ({"attention_kernel": "cudnn", "fused_norm": True}, "dp8-pp2-tp2-mb1-cudnn"),
        ({"recompute": "selective", "recompute_modules": "mlp,core_attn"}, "dp8-pp2-tp2-mb1-sel:core_attn+mlp"),
        ({"dp_sharding": "optim", "precision_aware_optimizer": True, "fp8_param_gather": True,
          "grad_reduce_in_bf16": True, "optimizer_offload_fraction": 0.5},
         "dp8-pp2-tp2-mb1-do-bf16adam-fp8param-bf16grad-offload0.5"),
    ],
)  # fmt: skip
def test_labels_come_from_the_knobs_in_their_order(knobs: dict[str, Any], label: str) -> None:
    plan = make_plan(num_layers=LAYERS, dp=8, pp=2, tp=2, micro_batch_size=1, **knobs)
    assert plan.layout() == label


def test_rules_run_by_phase_in_the_knobs_order() -> None:
    order = {knob.name: i for i, knob in enumerate(KNOBS)}
    owner = {id(rule): knob.name for knob in KNOBS for rule in knob.rules}
    for phase in Phase:
        ranks = [order[owner[id(rule)]] for rule in knob_rules(phase)]
        assert ranks == sorted(ranks)
    assert sum(len(knob_rules(phase)) for phase in Phase) == sum(len(k.rules) for k in KNOBS)


def test_generated_options_name_existing_fields() -> None:
    plan_fields = {f for knob in KNOBS for f in knob.fields}
    space_fields = {f for knob in KNOBS for f in knob.space_fields}
    assert {flag.field for flag in PLAN_FLAGS} <= plan_fields
    assert {flag.field for flag in SPACE_FLAGS} <= space_fields
    params = [flag.param for flag in PLAN_FLAGS]
    assert len(params) == len(set(params))


def test_knob_functions_read_only_what_their_protocols_name() -> None:
    """Labels and keys work on a plain namespace of the plan's values (no Plan needed):
    the declarations stay below :mod:`pipette_cp.specs.plan`."""
    plan = make_plan(num_layers=LAYERS, dp=8, pp=2, tp=2, micro_batch_size=2,
                     dp_sharding="optim", dp_shard_size=4, recompute="full")  # fmt: skip
    names = {*DEGREES, *(f for k in KNOBS for f in k.fields)}
    names |= {"sharding", "shard_group", "hybrid", "replicas"}
    view = types.SimpleNamespace(**{name: getattr(plan, name) for name in names})
    parts = [part for knob in KNOBS for part in knob.label(view)]
    assert "-".join(parts) == plan.layout().split("-", 3)[3]
