"""Tensor-parallel rings in NCCL's order: best_ring against brute force, the fast paths,
the DGX-1 cube mesh, and what the Evaluator, the placement builder and the checker charge."""

from __future__ import annotations

from itertools import permutations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipette_cp.checker.checks import check_no_failed_link, communication_pairs
from pipette_cp.clusters.expand import cluster_from_node_matrix
from pipette_cp.clusters.generators.healthy import dgx1_intra_node
from pipette_cp.clusters.generators.registry import generate
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.cost.network import tp_rings as rings
from pipette_cp.cost.network.tp_rings import best_ring, ring_bandwidths
from pipette_cp.errors import InfeasibleError
from pipette_cp.io.model_file import load_model
from pipette_cp.specs import Instance, SearchSpace, TrainingSpec, resolve_gpu
from pipette_cp.specs.layouts import make_plan
from pipette_cp.units import GB
from tests.placement_checks import assert_master_prices_as_evaluator

CUBE = dgx1_intra_node(45 * GB, 22.5 * GB, 10 * GB)


def brute_force(bw: np.ndarray) -> float:
    """The best directed bottleneck over every order of the GPUs (no shortcut)."""
    k = len(bw)
    return max(min(bw[p[i], p[(i + 1) % k]] for i in range(k)) for p in permutations(range(k)))


def bottleneck(bw: np.ndarray, ring: tuple[int, ...]) -> float:
    return min(float(bw[a, b]) for a, b in rings.ring_links(ring))


@st.composite
def matrices(draw: st.DrawFn, max_k: int = 6) -> np.ndarray:
    """Directed k x k matrices of a few levels, 0 (a failed pair) among them."""
    k = draw(st.integers(2, max_k))
    levels = draw(
        st.lists(st.sampled_from([0.0, 1.0, 2.0, 3.0, 5.0]), min_size=k * k, max_size=k * k)
    )
    bw = np.array(levels).reshape(k, k)
    np.fill_diagonal(bw, 0.0)
    return bw


@settings(max_examples=200, deadline=None)
@given(matrices())
def test_best_ring_matches_brute_force(bw: np.ndarray) -> None:
    ring, value = best_ring(bw)
    assert sorted(ring) == list(range(len(bw))) and ring[0] == 0
    assert value == brute_force(bw)
    assert bottleneck(bw, ring) == value  # the ring returned has the bottleneck claimed


def test_eight_gpus_match_brute_force() -> None:
    rng = np.random.default_rng(3)
    for _ in range(3):
        bw = rng.choice([0.0, 1.0, 2.0, 4.0], size=(8, 8), p=[0.2, 0.4, 0.3, 0.1])
        np.fill_diagonal(bw, 0.0)
        ring, value = best_ring(bw)
        assert value == brute_force(bw) == bottleneck(bw, ring)


def test_a_ring_is_directed() -> None:
    bw = np.array([[0, 5, 1], [1, 0, 5], [5, 1, 0]], dtype=float)
    assert best_ring(bw) == ((0, 1, 2), 5.0)
    assert best_ring(bw.T) == ((0, 2, 1), 5.0)  # the reverse ring


def test_uniform_groups_keep_rank_order() -> None:
    for k in (2, 4, 8, 16):
        bw = np.full((k, k), 7.0)
        np.fill_diagonal(bw, 0.0)
        assert best_ring(bw) == (tuple(range(k)), 7.0)
    assert best_ring(np.zeros((1, 1))) == ((0,), float("inf"))  # one GPU: no link


def test_failed_pairs() -> None:
    bw = np.full((4, 4), 3.0)
    np.fill_diagonal(bw, 0.0)
    bw[1, 2] = 0.0  # on the rank-order ring; 0 2 1 3 avoids it
    ring, value = best_ring(bw)
    assert value == 3.0 and (1, 2) not in rings.ring_links(ring)
    bw[1, [0, 3]] = 0.0  # GPU 1 can send to nobody: every ring crosses a failed pair
    assert best_ring(bw) == ((0, 1, 2, 3), 0.0)


def test_large_groups_use_a_threshold_search_never_worse_than_rank_order() -> None:
    k = 12
    rng = np.random.default_rng(0)
    hidden = (0, *(int(v) + 1 for v in rng.permutation(k - 1)))
    bw = rng.choice([1.0, 2.0], size=(k, k))
    for a, b in rings.ring_links(hidden):
        bw[a, b] = 9.0  # one ring of fast links, hidden among slow ones
    np.fill_diagonal(bw, 0.0)
    ring, value = best_ring(bw)
    assert value == 9.0 == bottleneck(bw, ring)
    noisy = rng.choice([0.0, 1.0, 2.0, 3.0], size=(10, 10))
    np.fill_diagonal(noisy, 0.0)
    ring, value = best_ring(noisy)
    assert value >= bottleneck(noisy, tuple(range(10))) and value == bottleneck(noisy, ring)


def test_the_cube_mesh_ring_is_all_nvlink() -> None:
    assert bottleneck(CUBE, tuple(range(8))) == 10 * GB  # rank order crosses PCIe (3-4, 7-0)
    ring, value = best_ring(CUBE)
    assert value == 45 * GB  # the two-NVLink pairs form a Hamiltonian cycle
    assert all(CUBE[a, b] == 45 * GB for a, b in rings.ring_links(ring))
    cluster = generate("v100-cube", nodes=2, seed=0)
    groups = np.arange(16).reshape(2, 8)
    assert ring_bandwidths(cluster.bandwidth_bytes_per_s, groups).tolist() == [45 * GB] * 2
    quads = np.arange(16).reshape(4, 4)  # inside a quad every ring has a one-NVLink pair
    assert ring_bandwidths(cluster.bandwidth_bytes_per_s, quads).tolist() == [22.5 * GB] * 4


def test_ring_bandwidths_take_any_gpu_order() -> None:
    cluster = generate("v100-cube", nodes=2, seed=0)
    bw = cluster.bandwidth_bytes_per_s
    rng = np.random.default_rng(1)
    for _ in range(10):
        groups = np.stack([rng.permutation(8), 8 + rng.permutation(8)])
        assert ring_bandwidths(bw, groups).tolist() == [45 * GB] * 2


# ------------------------------------------------------------------ the Evaluator
def cube_instance(intra: np.ndarray | None = None) -> Instance:
    """gpt3-760m on two DGX-1V nodes; ``intra`` replaces both nodes' 8 x 8 block."""
    cluster = generate("v100-cube", nodes=2, seed=0)
    if intra is not None:
        matrix = cluster.bandwidth_bytes_per_s.copy()
        for n in (0, 1):
            matrix[8 * n : 8 * n + 8, 8 * n : 8 * n + 8] = intra
        cluster = cluster.model_copy(update={"bandwidth_bytes_per_s": matrix})
    training = TrainingSpec(
        global_batch_size=64, seq_length=2048, precision="fp16", flash_attention_available=False
    )
    return Instance(name="cube", model=load_model("gpt3-760m"), cluster=cluster, training=training)


def uniform(value: float) -> np.ndarray:
    out = np.full((8, 8), value)
    np.fill_diagonal(out, 0.0)
    return out


def cube_plan(**kw: object):
    return make_plan(num_layers=24, micro_batch_size=1, flash_attention=False, **kw)  # type: ignore[arg-type]


def test_the_cube_mesh_tp8_layout_runs_at_nvlink_speed() -> None:
    plan = cube_plan(dp=1, pp=2, tp=8)
    cube = Evaluator(cube_instance()).evaluate(plan)
    # the rank-order charge of before: every TP link at its PCIe bottleneck
    before = Evaluator(cube_instance(uniform(10 * GB))).evaluate(plan)
    nvlink = Evaluator(cube_instance(uniform(45 * GB))).evaluate(plan)
    assert cube.iteration_time_s == pytest.approx(nvlink.iteration_time_s, rel=1e-12)
    assert cube.iteration_time_s < 0.8 * before.iteration_time_s
    assert cube.breakdown_s.tp_comm < 0.3 * before.breakdown_s.tp_comm
    # the order of a unit's GPUs does not matter any more
    ring = best_ring(CUBE)[0]
    placed = plan.model_copy(update={"placement": (ring, tuple(8 + g for g in ring))})
    assert Evaluator(cube_instance()).iteration_time(placed) == pytest.approx(
        cube.iteration_time_s, rel=1e-12
    )


def a100_instance(failed: tuple[tuple[int, int], ...]) -> Instance:
    cluster = cluster_from_node_matrix(
        node_bandwidth=np.full((2, 2), 20 * GB), intra_node=200 * GB, gpus_per_node=4,
        gpu=resolve_gpu("a100"), nics_per_node=4, nic_bandwidth_bytes_per_s=25 * GB,
    )  # fmt: skip
    matrix = cluster.bandwidth_bytes_per_s.copy()
    for i, j in failed:
        matrix[i, j] = 0.0
    cluster = cluster.model_copy(update={"bandwidth_bytes_per_s": matrix})
    instance = cube_instance().model_copy(update={"cluster": cluster})
    return instance.model_copy(update={"search_space": SearchSpace(use_all_gpus=False)})


def test_a_failed_rank_order_link_with_another_ring_evaluates() -> None:
    plan = cube_plan(dp=1, pp=2, tp=4)  # units (0, 1, 2, 3) and (4, 5, 6, 7)
    healthy = Evaluator(a100_instance(())).iteration_time(plan)
    broken = a100_instance(((1, 2), (6, 7)))  # on both rank-order rings
    assert Evaluator(broken).iteration_time(plan) == pytest.approx(healthy, rel=1e-12)
    assert check_no_failed_link(broken, plan) == []
    used = communication_pairs(plan, True, broken.cluster.bandwidth_bytes_per_s)["tp"]
    assert (1, 2) not in used and (6, 7) not in used and len(used) == 8


def test_a_group_without_a_clean_ring_is_named() -> None:
    plan = cube_plan(dp=1, pp=2, tp=4)
    cut = a100_instance(((1, 0), (1, 2), (1, 3)))  # GPU 1 cannot send inside its unit
    with pytest.raises(InfeasibleError, match=r"tensor-parallel group.*1->2"):
        Evaluator(cut).iteration_time(plan)
    found = check_no_failed_link(cut, plan)
    assert found and "tp traffic" in found[0].message


def test_the_placement_builder_charges_the_best_ring() -> None:
    instance = cube_instance().model_copy(update={"search_space": SearchSpace(use_all_gpus=False)})
    evaluator = Evaluator(instance, dp_algorithm="ring", validate=False)
    for dp, pp, tp in ((1, 2, 8), (2, 2, 4), (1, 2, 4)):
        plan = cube_plan(dp=dp, pp=pp, tp=tp)
        assert_master_prices_as_evaluator(instance, plan, evaluator, seed=0, draws=5)
