"""Launch outputs: Megatron arguments and rank orders that realise a plan's placement."""

from __future__ import annotations

import random

import pytest
from conftest import small_instance
from hypothesis import given, settings
from hypothesis import strategies as st

from pipette_cp.report.launch import rank_map, torchrun_layout, write_launch_files
from pipette_cp.report.megatron import megatron_args, split_args
from pipette_cp.specs import Plan
from pipette_cp.specs.layouts import make_plan


def megatron_units(slots, names, g: int, dp: int, pp: int, tp: int) -> tuple[tuple[int, ...], ...]:
    """Megatron's groups re-derived independently from a rank -> (host, GPU) list: the tp
    group of (stage s, replica d) is ranks s*dp*tp + d*tp + [0, tp) (order tp-dp-pp)."""
    gpu_of_rank = {slot.rank: names.index(slot.host) * g + slot.local_gpu for slot in slots}
    units = []
    for s in range(pp):
        for d in range(dp):
            base = (s * dp + d) * tp
            units.append(tuple(gpu_of_rank[base + t] for t in range(tp)))
    return tuple(units)


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from([(2, 2, 2), (4, 2, 1), (1, 4, 2), (2, 1, 4), (8, 1, 1)]), st.integers(0, 10_000)
)
def test_rank_map_realises_any_placement(degrees: tuple[int, int, int], seed: int) -> None:
    dp, pp, tp = degrees
    instance = small_instance(nodes=4, gpus_per_node=4, global_batch_size=64)
    rng = random.Random(seed)
    slots_per_node = [list(range(n * 4, n * 4 + 4, tp)) for n in range(4)]
    blocks = [b for node in slots_per_node for b in node]
    rng.shuffle(blocks)
    units = tuple(tuple(range(b, b + tp)) for b in blocks[: dp * pp])
    plan = make_plan(num_layers=8, dp=dp, pp=pp, tp=tp, micro_batch_size=1, placement=units)
    slots = rank_map(instance, plan)
    names = instance.cluster.node_names
    assert megatron_units(slots, names, 4, dp, pp, tp) == plan.placement
    assert [s.rank for s in slots] == list(range(dp * pp * tp))


def test_torchrun_only_when_node_ranks_are_consecutive(tmp_path) -> None:
    instance = small_instance(nodes=2, gpus_per_node=4)
    default = make_plan(num_layers=8, dp=2, pp=2, tp=2, micro_batch_size=1)
    layout = torchrun_layout(rank_map(instance, default))
    assert layout == [("node000", [0, 1, 2, 3]), ("node001", [0, 1, 2, 3])]
    # stage 0 replicas on different nodes: node 0 holds ranks 0-1 and 4-5, not consecutive
    mixed = make_plan(
        num_layers=8,
        dp=2,
        pp=2,
        tp=2,
        micro_batch_size=1,
        placement=((0, 1), (4, 5), (2, 3), (6, 7)),
    )
    assert torchrun_layout(rank_map(instance, mixed)) is None
    paths = write_launch_files(instance, mixed, tmp_path, megatron_args(instance, mixed))
    assert {p.name for p in paths} == {
        "rank_map.csv",
        "rankfile",
        "slurm_hostfile",
        "launch_slurm.sh",
        "torchrun.txt",
    }
    assert "cannot realise" in (tmp_path / "torchrun.txt").read_text()
    assert (tmp_path / "rankfile").read_text().splitlines()[2] == "rank 2=node001 slot=0"


def _plan(split: tuple[int, ...], pp: int, vpp: int = 1) -> Plan:
    return make_plan(
        num_layers=sum(split), dp=1, pp=pp, tp=1, micro_batch_size=1, vpp=vpp, layer_split=split
    )


@pytest.mark.parametrize(
    ("split", "pp", "vpp", "expected"),
    [
        ((2, 2, 2, 2), 4, 1, []),
        (
            (1, 3, 3, 1),
            4,
            1,
            ["--decoder-first-pipeline-num-layers 1", "--decoder-last-pipeline-num-layers 1"],
        ),
        ((1, 3, 3, 3), 4, 1, ["--decoder-first-pipeline-num-layers 1"]),
        (
            (3, 2, 1, 2),
            4,
            1,
            ["--pipeline-model-parallel-layout 'Et*3|t*2|t|t*2L'"],
        ),
    ],
)
def test_split_args(split: tuple[int, ...], pp: int, vpp: int, expected: list[str]) -> None:
    instance = small_instance(layers=sum(split))
    assert split_args(instance, _plan(split, pp, vpp)) == expected


def test_megatron_args_cover_every_knob() -> None:
    instance = small_instance()
    plan = make_plan(
        num_layers=8, dp=2, pp=2, tp=2, micro_batch_size=2, vpp=2, sequence_parallel=True,
        recompute="full", distributed_optimizer=True,
    )  # fmt: skip
    args = megatron_args(instance, plan)
    for flag in (
        "--tensor-model-parallel-size 2", "--pipeline-model-parallel-size 2", "--micro-batch-size 2",
        "--global-batch-size 16", "--num-virtual-stages-per-pipeline-rank 2", "--sequence-parallel",
        "--recompute-granularity full", "--use-distributed-optimizer", "--num-layers 8", "--bf16",
    ):  # fmt: skip
        assert flag in args


def test_plots_write_pngs(tmp_path) -> None:
    from pipette_cp.cost.evaluate import simulate
    from pipette_cp.report.plots import placement_figure, timeline_figure

    instance = small_instance(nodes=2, gpus_per_node=4)
    plan = make_plan(num_layers=8, dp=2, pp=2, tp=2, micro_batch_size=1, vpp=2)
    timeline = simulate(instance, plan)
    timeline_figure(timeline).savefig(tmp_path / "t.png")
    placement_figure(instance, plan).savefig(tmp_path / "p.png")
    assert (tmp_path / "t.png").stat().st_size > 10_000 and (
        tmp_path / "p.png"
    ).stat().st_size > 10_000
    kinds = {op.kind for op in timeline.ops}
    assert {"forward", "backward", "send"} <= kinds
