"""Topology-aware tensor groups: where a node's links differ, the placement chooses
which GPUs form a tensor group (build.tensor_slots), the brute-force oracle enumerates
any groups (``groups="any"``), and an ``optimal`` claim holds against it."""

from __future__ import annotations

import numpy as np
import pytest

from pipette_cp.clusters.generators.registry import generate
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.cost.network.tp_rings import (
    best_partition,
    partition_is_complete,
    partitions,
    ring_bandwidths,
)
from pipette_cp.errors import SpecError
from pipette_cp.io.model_file import load_model
from pipette_cp.solvers.methods import exact_placement
from pipette_cp.solvers.options import SolveOptions
from pipette_cp.solvers.placement.build import build_placement_data, tensor_slots
from pipette_cp.solvers.placement.oracle import brute_force_placement
from pipette_cp.specs import Instance, SearchSpace, TrainingSpec
from pipette_cp.specs.layouts import make_plan
from pipette_cp.units import GB
from tests.conftest import small_instance


def cube() -> Instance:
    """gpt3-350m on two DGX-1V nodes (hybrid cube mesh), layouts on part of the GPUs."""
    training = TrainingSpec(
        global_batch_size=64, seq_length=2048, precision="fp16", flash_attention_available=False
    )
    return Instance(
        name="cube", model=load_model("gpt3-350m"), cluster=generate("v100-cube", nodes=2, seed=0),
        training=training, search_space=SearchSpace(use_all_gpus=False),
    )  # fmt: skip


def layout(dp: int, pp: int, tp: int, **kw: object):
    return make_plan(num_layers=24, dp=dp, pp=pp, tp=tp, micro_batch_size=1,  # type: ignore[arg-type]
                     flash_attention=False, **kw)  # fmt: skip


def solve(instance: Instance, plan):
    return exact_placement(instance, plan, SolveOptions(time_limit_s=20))


# ------------------------------------------------------------------ the cut into groups
def test_partitions_are_every_cut_once() -> None:
    for k, size, count in ((4, 2, 3), (6, 2, 15), (6, 3, 10), (8, 2, 105), (8, 4, 35)):
        cuts = partitions(k, size)
        assert len(cuts) == count
        assert len({tuple(map(tuple, c)) for c in cuts.tolist()}) == count
        assert all(sorted(c.ravel().tolist()) == list(range(k)) for c in cuts)
        assert cuts[0].tolist() == np.arange(k).reshape(-1, size).tolist()  # aligned first


def test_cube_pairs_are_the_two_nvlink_pairs_and_quads_stay_aligned() -> None:
    instance = cube()
    bw = instance.cluster.bandwidth_bytes_per_s
    slots, complete = tensor_slots(instance, 2)
    # aligned pairs (0, 1) and (4, 5) have one NVLink (22.5 GB/s); the cut has two each
    assert ring_bandwidths(bw, np.arange(16).reshape(8, 2)).min() == 22.5 * GB
    assert slots[:4].tolist() == [[0, 3], [1, 2], [4, 7], [5, 6]]
    assert ring_bandwidths(bw, slots).tolist() == [45 * GB] * 8
    assert not complete  # other cuts pair consecutive stages' GPUs differently
    quads, complete = tensor_slots(instance, 4)  # every quad has a one-NVLink ring:
    assert quads.tolist() == np.arange(16).reshape(4, 4).tolist()  # the aligned ones kept
    assert not complete
    for tp in (1, 8):  # one way to cut: complete
        slots, complete = tensor_slots(instance, tp)
        assert complete and slots.tolist() == np.arange(16).reshape(-1, tp).tolist()


def test_large_nodes_take_the_swap_search() -> None:
    """16 GPUs (beyond the exact enumeration): fast links only between i and i + 8."""
    bw = np.full((16, 16), 10 * GB)
    for i in range(8):
        bw[i, i + 8] = bw[i + 8, i] = 300 * GB
    np.fill_diagonal(bw, 0.0)
    cut = best_partition(bw, 2)
    assert sorted(map(tuple, cut.tolist())) == [(i, i + 8) for i in range(8)]
    uniform = np.full((16, 16), 50 * GB)
    np.fill_diagonal(uniform, 0.0)
    aligned = np.arange(16).reshape(8, 2)
    assert best_partition(uniform, 2).tolist() == aligned.tolist()
    assert partition_is_complete(uniform, np.arange(16), aligned)  # every GPU alike


# ------------------------------------------------------------------ placements
@pytest.mark.slow
@pytest.mark.parametrize(("dp", "pp", "tp"), [(1, 4, 2), (8, 1, 2), (1, 2, 4), (2, 2, 4)])
def test_chosen_groups_are_at_least_as_fast_as_aligned_blocks(dp, pp, tp) -> None:
    instance = cube()
    plan = layout(dp, pp, tp)
    _, aligned = brute_force_placement(instance, plan, "best", groups="aligned")
    result = solve(instance, plan)
    info = result.solve_info
    assert info is not None
    assert Evaluator(instance).iteration_time(result) == pytest.approx(info.objective)
    assert info.objective <= aligned * (1 + 1e-9)
    # the proof covers one cut of each node only: no claim over every grouping
    assert info.status == "feasible" and info.bound is None and info.gap is None
    if tp == 2:
        assert info.objective < aligned  # two-NVLink pairs: faster than any aligned placement


def test_unaligned_groups_beat_aligned_blocks_on_the_oracle_too() -> None:
    instance = cube()
    plan = layout(1, 2, 2)
    _, aligned = brute_force_placement(instance, plan, "best", groups="aligned")
    best, anywhere = brute_force_placement(instance, plan, "best", groups="any")
    assert anywhere < aligned
    assert any(unit != tuple(range(unit[0], unit[0] + 2)) or unit[0] % 2 for unit in best.placement)
    assert solve(instance, plan).solve_info.objective >= anywhere * (1 - 1e-9)  # type: ignore[union-attr]


@pytest.mark.parametrize(("dp", "pp", "tp"), [(1, 2, 8), (1, 2, 1), (2, 1, 1)])
def test_optimal_claims_hold_against_any_groups(dp, pp, tp) -> None:
    """Where the cut is the only one (tp = 1, tp = a node), the claim is over every
    grouping, and the oracle over any groups agrees."""
    instance = cube()
    plan = layout(dp, pp, tp)
    info = solve(instance, plan).solve_info
    _, anywhere = brute_force_placement(instance, plan, "best", groups="any")
    assert info is not None and info.status == "optimal"
    assert info.objective == pytest.approx(anywhere, rel=1e-6)


def test_uniform_nodes_keep_aligned_blocks() -> None:
    instance = small_instance(nodes=2, gpus_per_node=4)
    instance = instance.model_copy(update={"search_space": SearchSpace(use_all_gpus=False)})
    slots, complete = tensor_slots(instance, 2)
    assert complete and slots.tolist() == np.arange(8).reshape(4, 2).tolist()
    plan = make_plan(num_layers=8, dp=1, pp=2, tp=2, micro_batch_size=1)
    data = build_placement_data(instance, plan)
    assert data.node_level and data.slots_complete
    info = exact_placement(instance, plan, SolveOptions(time_limit_s=10)).solve_info
    _, aligned = brute_force_placement(instance, plan, "best", groups="aligned")
    _, anywhere = brute_force_placement(instance, plan, "best", groups="any")
    assert info is not None and info.status == "optimal"
    assert info.objective == pytest.approx(aligned, rel=1e-6) == pytest.approx(anywhere, rel=1e-6)


def test_unaligned_hints_are_accepted() -> None:
    instance = cube()
    plan = layout(1, 2, 2)
    data = build_placement_data(instance, plan)
    assign = data.assignment_of(((0, 3), (5, 6)))
    assert assign is not None
    assert data.placement(assign) == ((0, 3), (5, 6))
    assert data.assignment_of(((3, 0), (6, 5))) is not None  # a slot in any rank order
    assert data.assignment_of(((0, 1), (2, 3))) is None  # aligned pairs are not slots here
    assert data.assignment_of(((0, 3), (0, 3))) is None  # one slot twice
    hinted = plan.model_copy(update={"placement": ((1, 2), (5, 6))})
    result = solve(instance, hinted)
    assert result.solve_info is not None
    assert result.solve_info.objective <= Evaluator(instance).iteration_time(hinted) + 1e-12


def test_the_any_oracle_refuses_large_enumerations() -> None:
    instance = cube()
    with pytest.raises(SpecError, match=r"plan\.dp\*pp=4: 4 units on 56 tensor groups of tp=2"):
        brute_force_placement(instance, layout(2, 2, 2), groups="any")
    with pytest.raises(SpecError, match="groups='every'"):
        brute_force_placement(instance, layout(1, 2, 2), groups="every")  # type: ignore[arg-type]
