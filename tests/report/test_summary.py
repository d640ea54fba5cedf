"""The one-screen answer: the plan, its time and memory, its gap and Megatron's default
on the same cluster, in lines of at most 80 columns that cut nothing."""

from __future__ import annotations

import pytest

from pipette_cp.api import solve
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.io.instance_file import load_instance
from pipette_cp.report.summary import plan_summary
from pipette_cp.solvers import SolveOptions, get_method


@pytest.fixture(scope="module")
def slow_node():
    """Three nodes, one of them with a slow NIC: Megatron's order uses it."""
    instance = load_instance("gpt3-760m-g5-3n-slownic")
    return instance, solve(instance, method="cpsat", time_limit_s=5, top_k=1, deterministic=True)[0]


def test_every_line_fits_80_columns_and_says_each_part(slow_node) -> None:
    instance, plan = slow_node
    lines = plan_summary(instance, plan)
    assert all(len(line) <= 80 for line in lines), lines
    text = "\n".join(lines)
    for label in ("best plan", "time", "memory", "gap", "megatron"):
        assert any(line.startswith(label) for line in lines), label
    assert plan.layout() in text and f"{plan.evaluation.iteration_time_s:.3f} s" in text


def test_the_megatron_line_is_megatrons_order_scored_alike(slow_node) -> None:
    instance, plan = slow_node
    skeleton = plan.model_copy(update={"placement": None, "layer_split": None,
                                       "evaluation": None, "solve_info": None})  # fmt: skip
    default = get_method("megatron-default")(instance, skeleton, SolveOptions())
    ev = Evaluator(instance).evaluate(default)
    assert default.placement[0][0] == 0  # rank 0 on the first GPU
    text = " ".join(plan_summary(instance, plan, width=200))
    assert f"{ev.iteration_time_s:.3f} s, fits" in text
    slower = ev.iteration_time_s / plan.evaluation.iteration_time_s - 1
    assert (f"{slower:.1%} slower" in text) == (slower > 0.0005)


def test_a_narrow_screen_wraps_and_keeps_every_number(slow_node) -> None:
    instance, plan = slow_node
    wide = " ".join(" ".join(plan_summary(instance, plan, width=300)).split())
    narrow = plan_summary(instance, plan, width=50)
    assert all(len(line) <= 50 for line in narrow)
    assert " ".join(" ".join(narrow).split()) == wide


@pytest.mark.parametrize("width", [60, 80, 120])
def test_the_plans_table_cuts_no_number(slow_node, width: int) -> None:
    import io

    from rich.console import Console

    from pipette_cp.report.plans import plans_table

    _, plan = slow_node
    out = io.StringIO()
    Console(file=out, width=width, force_terminal=False).print(plans_table([plan], "t", width))
    text = out.getvalue()
    assert "…" not in text and all(len(line) <= width for line in text.splitlines())
    assert f"{plan.evaluation.iteration_time_s:.3f}" in text
    assert plan.layout() in text or width < 80  # a narrow column folds the layout


def test_defaults_the_numbers_rest_on_are_named_with_their_weight(slow_node) -> None:
    from pipette_cp.report.summary import assumed_defaults

    instance, plan = slow_node
    said = assumed_defaults(instance, plan)
    assert "dropout masks kept (training.dropout defaults to on;" in said
    assert "memory headroom 2 %" in said
    training = instance.training.model_copy(update={"dropout": True})  # set, not assumed
    given = instance.model_copy(update={"training": training})
    assert "dropout" not in assumed_defaults(given, plan)
    off = instance.model_copy(update={"training": instance.training.model_copy(
        update={"dropout": False})})  # fmt: skip
    kept = plan.evaluation.memory_bytes_max
    freed = Evaluator(off).evaluate(plan.model_copy(update={"evaluation": None}))
    assert f"{(kept - freed.memory_bytes_max) / 1e9:.1f} GB per GPU" in said
