"""Fuzzing the evaluator on random layouts and placements, and the cost-model
regressions fuzzing found (the search on random instances: ``tests/property/test_search.py``).

Properties: the evaluator rejects a failed link only if the checker sees one, its
``fits`` is the checker's memory family, and the analytic time is a lower bound of the
simulated one, with the slack of the known over-counts (:func:`assert_lower_bound`).

Run long: ``HYPOTHESIS_PROFILE=fuzz python -m pytest tests/property/test_evaluator.py`` (60 x
the examples).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from pipette_cp.checker import check_plan
from pipette_cp.cost.evaluator.evaluate import Evaluator, evaluate
from pipette_cp.cost.schedule.critical_path import PipelineInputs, pipeline_times
from pipette_cp.cost.schedule.simulator import simulate_pipeline
from pipette_cp.errors import InfeasibleError
from pipette_cp.io.cluster_file import cluster_from_mapping
from pipette_cp.search.space import enumerate_layouts
from pipette_cp.solvers.baselines import random_placement
from pipette_cp.specs import Instance, Plan, SearchSpace, TrainingSpec, validate_spec
from pipette_cp.specs.layouts import even_split
from tests.models import gpt_model
from tests.property.strategies import clusters, event, fuzz_settings, models, training_fields

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")


# ------------------------------------------------------------------ helpers
def assert_lower_bound(evaluator: Evaluator, plan: Plan, analytic: float, simulated: float) -> None:
    """The analytic pipeline time is a lower bound of the simulated one (every term is a
    path of the schedule), but for the known over-count of the interleaved model
    (:func:`test_interleaved_analytic_is_a_lower_bound`: an exchange charged
    ``max(send, receive)`` where only the send happens costs at most the largest hop, on
    at most ``2 m v + 1`` exchanges).  The iteration adds each stage's DP sync to that
    stage's end, which the model estimates back from the pipeline's end and may put late
    (:func:`test_analytic_stage_ends_are_lower_bounds`): with ``dp > 1`` the iteration
    may exceed the simulator's by up to the longest DP sync, never more."""
    x, _ = evaluator.pipeline_inputs(plan)
    slack = 0.0
    if plan.vpp > 1:
        largest = max(np.max(x.fwd_hop_s, initial=0.0), np.max(x.bwd_hop_s, initial=0.0))
        slack = (2 * x.num_micro_batches * plan.vpp + 1) * largest
    pipeline = pipeline_times(x).pipeline_s
    assert pipeline <= simulate_pipeline(x, record=False).pipeline_time_s * (1 + 1e-9) + slack
    tail = float(np.max(x.dp_sync_s)) if plan.dp > 1 else 0.0
    if analytic > simulated * (1 + 1e-9):
        event(f"analytic above the simulator (known; vpp {plan.vpp}, dp {plan.dp})")
    assert analytic <= simulated * (1 + 1e-9) + slack + tail, "analytic must be a lower bound"


def tiny_instance(
    name: str,
    num_layers: int,
    cluster: dict[str, object],
    global_batch_size: int,
    *,
    tied_embeddings: bool = True,
    search_space: SearchSpace | None = None,
) -> Instance:
    """A tiny model (hidden size 16, one head, 128 tokens) on ``cluster`` (a cluster
    file mapping), as the regressions fuzzing found are written."""
    model = gpt_model("fuzz", num_layers, 16, 1, ffn_hidden_size=16, vocab_size=100,
                      max_seq_length=128, tied_embeddings=tied_embeddings)  # fmt: skip
    return Instance(
        name=name,
        model=model,
        cluster=cluster_from_mapping(cluster),
        training=TrainingSpec(global_batch_size=global_batch_size, seq_length=128),
        search_space=search_space or SearchSpace(),
    )


# ------------------------------------------------------------------ regressions
def _dp_ring_case() -> tuple[Instance, Plan]:
    """Three 2-GPU nodes, nodes 0 and 1 not linked; stages 0 and 2 have their two
    replicas on nodes 0 and 1, stage 1 both on node 2."""
    rows = [[None, 0, 20], [0, None, 20], [20, 20, None]]
    cluster = {
        "gpu": "a100",
        "gpus_per_node": 2,
        "node_bandwidth_gb_per_s": rows,
        "nic_bandwidth_gb_per_s": 20,
        "intra_node_bandwidth_gb_per_s": 200,
    }
    inst = tiny_instance("split-rings", 3, cluster, 2, tied_embeddings=False)
    placement = ((0,), (2,), (4,), (5,), (1,), (3,))
    return inst, Plan(dp=2, pp=3, tp=1, micro_batch_size=1, layer_split=(1, 1, 1),
                      placement=placement)  # fmt: skip


def test_interleaved_analytic_is_a_lower_bound() -> None:
    """Fuzzing found it (searched plans on G3 clusters, whose links differ by direction):
    the interleaved analytic time above the simulator's, so not the lower bound the module
    claims.  ``interleaved()`` charges every warm-up exchange of stage 0 the receive of
    the next input from the last stage and every cool-down exchange of the last stage the
    receive of the next gradient, but a chunk-0 input comes from the data and a last-chunk
    gradient from the loss: no receive, only the send.  ``_gradient_chain`` also charges
    an exchange after the last steady backward, whose send Megatron waits for only at the
    end.  Here the wrap-around hop (0.5) is charged twice in stage 0's warm-up: 26.0 s
    against the simulator's 25.0 s (4 %; 0.0007 % in the fuzzed plan)."""
    f = np.array([1.0, 1.0, 3.0, 1.0])
    x = PipelineInputs(pp=2, vpp=2, schedule="interleaved", num_micro_batches=2, forward_s=f,
                       backward_s=2 * f, fwd_hop_s=np.array([0.0, 0.5]), bwd_hop_s=np.zeros(2))  # fmt: skip
    simulated = simulate_pipeline(x, record=False).pipeline_time_s
    assert simulated == pytest.approx(25.0)
    assert pipeline_times(x).pipeline_s <= simulated * (1 + 1e-9)


@pytest.mark.xfail(strict=True, reason="1F1B stage ends are estimated back from the pipeline's "
                   "end, not bounded; the fix is left to the cost model")  # fmt: skip
def test_analytic_stage_ends_are_lower_bounds() -> None:
    """Fuzzing found it (a random placement whose last stage's DP ring crosses a 1 GB/s
    link): the analytic iteration 0.02 % above the simulator's.  ``pipeline_times`` puts
    the end of stage ``s`` at ``T - drain_s`` (the pipeline's end less the gradient chain
    below ``s``), which holds on the critical path only; a stage off it ends earlier, and
    its DP sync, which starts at that end, is then placed late.  Here stage 2 ends at 9 s,
    not 10 s: with a DP sync of 10 s on stage 2 alone, the analytic iteration is 20 s
    against 19 s.  A valid bound, ``max(path of a stage >= s) - drain_s``, is much looser
    on balanced pipelines (47.5 s -> 26.2 s for the last stage of ``1f1b-p5-m12`` in
    ``tests/cost/schedule/test_critical_path.py``, 48.4 s simulated), so the fix is left to the cost model."""
    f = np.array([2.0, 1.0, 1.0])
    x = PipelineInputs(pp=3, num_micro_batches=2, forward_s=f, backward_s=2 * f,
                       fwd_hop_s=np.zeros(3), bwd_hop_s=np.zeros(3))  # fmt: skip
    simulated = simulate_pipeline(x, record=False).stage_end_s
    assert simulated.tolist() == [16.0, 12.0, 9.0]
    assert (pipeline_times(x).stage_end_s <= simulated + 1e-9).all()


def test_dp_ring_over_a_failed_link_is_infeasible_not_infinite() -> None:
    """Fuzzing found it: with NCCL's "best" algorithm, a DP ring over a failed pair
    whose two-level alternative does not apply (local groups of unequal size: stage 1
    sits on one node) gave an iteration time of inf (and NaN cuts in the split model)
    instead of the InfeasibleError the checker's ``no_failed_link`` family predicts.
    Fixed in ``comm.collective_times_s``."""
    inst, plan = _dp_ring_case()
    assert [v.family for v in check_plan(inst, plan)] == ["no_failed_link"]
    with pytest.raises(InfeasibleError, match="failed GPU pair"):
        evaluate(inst, plan)


# ------------------------------------------------------------------ properties
@st.composite
def random_plans(draw: st.DrawFn) -> tuple[Instance, Plan]:
    """A valid instance and one of its layouts with a random split and placement."""
    model, cluster = draw(models()), draw(clusters())
    training = validate_spec(TrainingSpec, draw(training_fields()), "training")
    instance = Instance(name="fuzz", model=model, cluster=cluster, training=training)
    layouts = list(enumerate_layouts(instance))
    assume(layouts)
    plan = draw(st.sampled_from(layouts))
    chunks = plan.pp * plan.vpp
    split = list(even_split(model.num_layers, plan.pp, plan.vpp))
    for _ in range(draw(st.integers(0, 4))):  # move layers between chunks, keep >= 1 each
        a, b = draw(st.integers(0, chunks - 1)), draw(st.integers(0, chunks - 1))
        if a != b and split[a] > 1:
            split[a], split[b] = split[a] - 1, split[b] + 1
    rng = random.Random(draw(st.integers(0, 2**16)))
    placement = random_placement(cluster, plan.dp, plan.pp, plan.tp, rng)
    return instance, plan.model_copy(update={"layer_split": tuple(split), "placement": placement})


@fuzz_settings(40)
@given(random_plans())
@example(_dp_ring_case())
def test_evaluator_and_checker_agree(case: tuple[Instance, Plan]) -> None:
    """On any layout and placement: the evaluator rejects a failed link only if the
    checker sees one, ``fits`` is the checker's memory family, and the analytic model
    is a lower bound of the simulator."""
    instance, plan = case
    families = {v.family for v in check_plan(instance, plan)}
    assert families <= {"no_failed_link", "memory_limit"}, families
    try:
        evaluation = evaluate(instance, plan)
    except InfeasibleError as exc:
        event("failed link")
        assert "no_failed_link" in families, str(exc)
        return
    event("fits" if evaluation.fits else "does not fit")
    assert evaluation.fits == ("memory_limit" not in families)
    assert np.isfinite(evaluation.iteration_time_s) and evaluation.iteration_time_s > 0
    simulated = evaluate(instance, plan, predictor="simulator").iteration_time_s
    assert_lower_bound(Evaluator(instance), plan, evaluation.iteration_time_s, simulated)
