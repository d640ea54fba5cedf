"""Analytic model vs simulator on the bundled instances (target: within 2 %).

Every instance up to 1024 GPUs (the 4096-GPU ones take ~6 s each and run in
``python -m pipette_cp.experiments.models.agreement``): its default layout, the
smallest pipelined layout when the default has one stage, ~25 % of a middle
stage's layers moved to the first / the last stage, and the interleaved
(``vpp=2``) versions of these.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from pipette_cp.cost.evaluator.evaluate import Evaluator, placement_array, validate_layout
from pipette_cp.errors import InfeasibleError
from pipette_cp.experiments.models.agreement import (
    Case,
    avoid_failed_links,
    compare,
    default_layout,
    format_table,
    unbalanced_split,
)
from pipette_cp.io.instance_file import list_instances, load_instance
from pipette_cp.specs.layouts import make_plan

TOLERANCE = 0.02
FAST = [name for name in list_instances() if not name.endswith("-4096")]


@cache
def cases(name: str) -> tuple[Case, ...]:
    return tuple(compare(name))


def of_kind(name: str, *kinds: str) -> list[Case]:
    return [c for c in cases(name) if c.kind in kinds]


@pytest.mark.parametrize("name", FAST)
def test_1f1b_default_and_unbalanced_within_2_percent(name: str) -> None:
    checked = of_kind(name, "default", "unbalanced")
    assert any(c.kind == "unbalanced" for c in checked), "every instance gets an unbalanced split"
    for c in checked:
        assert abs(c.difference) <= TOLERANCE, (c.variant, c.layout, c.difference)
        assert c.analytic_s <= c.simulator_s * (1 + 1e-9)  # a lower bound (test_cost_simulator)


@pytest.mark.parametrize("name", FAST)
def test_interleaved_even_split_within_2_percent(name: str) -> None:
    for c in of_kind(name, "interleaved"):
        assert abs(c.difference) <= TOLERANCE, (c.layout, c.layer_split, c.difference)


def test_interleaved_unequal_chunks_explained() -> None:
    """Interleaving with unequal chunks: the analytic model is a lower bound, not 2 %.

    The gaps above 2 % (up to 9 %: gpt3-175b-g1-1024, dp8-pp16-tp8) all come
    from the variant that moves layers from chunk 1 of stage 0 to its chunk 0.
    Every stage keeps its total, and the analytic time barely moves (within
    2 % of the even split's), but Megatron's schedule runs groups of pp
    micro-batches chunk by chunk and the last stage feeds stage 0: while
    stage 0 runs its heavy chunk, the stages after it wait, and these waits
    form cycles through the last -> first hop that no path of the analytic
    model contains (``tests/cost/schedule/test_simulator.py::test_interleaved_unbalanced_chunks_explained``
    shows it on a 2-stage pipeline).  The search re-ranks interleaved plans with
    ``predictor="simulator"``.
    """
    gaps = [c for name in FAST for c in of_kind(name, "interleaved-unbalanced")]
    assert gaps
    for c in gaps:
        assert c.analytic_s <= c.simulator_s * (1 + 1e-9)  # always a lower bound
        if abs(c.difference) <= TOLERANCE:
            continue
        assert c.variant == "interleaved-unbalanced-first", (c.instance, c.variant)
        even = next(e for e in cases(c.instance) if e.variant == "interleaved")
        pp = len(c.layer_split) // 2
        totals = np.add(*np.reshape(c.layer_split, (2, pp)))
        assert (totals == np.add(*np.reshape(even.layer_split, (2, pp)))).all()  # same stages
        assert c.layer_split[0] != c.layer_split[pp]  # unequal chunks on stage 0
        assert c.analytic_s == pytest.approx(even.analytic_s, rel=TOLERANCE)
        assert c.simulator_s > even.simulator_s * (1 + TOLERANCE)  # the waits of the chunks


# ------------------------------------------------------------------ the layouts
def test_default_layout_is_the_smallest_pipeline_that_fits() -> None:
    inst = load_instance("gpt3-175b-g1-1024")
    evaluator = Evaluator(inst)
    plan = default_layout(inst, evaluator)
    assert (plan.tp, plan.micro_batch_size, plan.vpp) == (8, 1, 1)
    assert plan.dp * plan.pp * plan.tp == inst.cluster.num_gpus
    assert evaluator.evaluate(plan).fits
    units, layers = inst.cluster.num_gpus // 8, inst.model.num_layers
    for pp in (pp for pp in range(1, plan.pp) if units % pp == 0):  # shorter pipelines
        shorter = make_plan(num_layers=layers, dp=units // pp, pp=pp, tp=8, micro_batch_size=1)
        assert not evaluator.evaluate(shorter).fits
    assert default_layout(inst, evaluator, min_pp=plan.pp + 1).pp > plan.pp


def test_default_layout_divides_heads_and_batch() -> None:
    inst = load_instance("llama-3-8b-real00-136")  # 136 GPUs = 17 nodes: dp=17 misses the batch
    plan = default_layout(inst)
    validate_layout(inst, plan)
    assert inst.model.kv_heads % plan.tp == 0
    assert inst.training.global_batch_size % plan.dp == 0


def test_avoid_failed_links_relabels_nodes() -> None:
    inst = load_instance("bloom-176b-g3-384")  # a degraded cluster: failed node pairs
    layout = default_layout(inst)
    megatron = make_plan(num_layers=inst.model.num_layers, dp=layout.dp, pp=layout.pp,
                         tp=layout.tp, micro_batch_size=1)  # fmt: skip
    evaluator = Evaluator(inst)
    with pytest.raises(InfeasibleError, match="failed GPU pair"):
        evaluator.evaluate(megatron)  # Megatron's placement crosses a failed pair
    moved = avoid_failed_links(inst, megatron)
    evaluator.evaluate(moved)  # no transfer crosses one now
    nodes = placement_array(moved) // inst.cluster.gpus_per_node
    assert (nodes == nodes[..., :1]).all()  # units stay inside nodes
    assert avoid_failed_links(inst, moved) is moved


def test_unbalanced_split_moves_a_quarter_of_the_middle_stage() -> None:
    assert unbalanced_split((4, 4, 4), "first") == (5, 3, 4)
    assert unbalanced_split((4, 4, 4), "last") == (4, 3, 5)
    assert unbalanced_split((1, 2, 1), "first") == (2, 1, 1)  # at least one layer


def test_table_reports_the_maximum_of_each_class() -> None:
    table = format_table(list(cases("llama-2-70b-g2-256")))
    assert "max |diff| default" in table and "max |diff| interleaved " in table
