""" "Nothing fits" tells the truth: the whole-model memory bound and the search's messages.

* :func:`~pipette_cp.search.capacity.model_capacity` is below the predicted worst-stage
  memory of every layout of the space, whatever its split;
* :func:`~pipette_cp.search.bounds.memory_check` never prunes a layout some split of
  which fits, and its deficit is no more than the best split's;
* a model too big for the cluster is reported with its real deficit and the GPUs it
  needs, never with advice to give more time; more time is advised only when some
  layout may fit and the budget ran out.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import pipette_cp.search.loop as loop
from pipette_cp.cli import app
from pipette_cp.cost.memory.peak import memory_by_stage
from pipette_cp.errors import InfeasibleError
from pipette_cp.io.instance_file import load_instance
from pipette_cp.search import enumerate_layouts, search
from pipette_cp.search.bounds import _limit, memory_check
from pipette_cp.search.capacity import model_capacity
from pipette_cp.search.options import SearchOptions
from pipette_cp.specs import Instance, SearchSpace
from tests.conftest import small_instance


def _worst(instance: Instance, plan, split: tuple[int, ...] | None = None) -> float:
    if split is not None:
        plan = plan.model_copy(update={"layer_split": split})
    return max(b.total_bytes for b in memory_by_stage(instance.model, instance.training, plan))


def _lopsided(layers: int, chunks: int) -> tuple[int, ...]:
    """Every chunk one layer but the first, which holds the rest."""
    return (layers - chunks + 1,) + (1,) * (chunks - 1)


def _big(instance: Instance, hidden: int = 8192) -> Instance:
    model = instance.model.model_copy(
        update={"hidden_size": hidden, "num_attention_heads": 64, "ffn_hidden_size": 4 * hidden}
    )
    return instance.model_copy(update={"model": model})


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt3-1.3b-nominal-8", "llama-2-7b-g3-32", "gpt3-2.7b-g1-64"])
def test_capacity_is_below_every_layout(name: str) -> None:
    instance = load_instance(name)
    bound = model_capacity(instance).per_gpu_bytes()
    layers = instance.model.num_layers
    count = 0
    for plan in enumerate_layouts(instance):
        chunks = plan.pp * plan.vpp
        assert bound <= _worst(instance, plan), plan.layout()
        assert bound <= _worst(instance, plan, _lopsided(layers, chunks)), plan.layout()
        count += 1
    assert count > 100


@settings(max_examples=25, deadline=None)
@given(
    hidden=st.sampled_from([512, 1024, 2048]),
    layers=st.integers(2, 12),
    batch=st.sampled_from([4, 8, 16]),
    recompute=st.sets(st.sampled_from(["none", "selective", "full"]), min_size=1),
    mbs=st.sets(st.sampled_from([1, 2, 4]), min_size=1),
    flash=st.sets(st.booleans(), min_size=1),
)
def test_capacity_is_a_lower_bound_on_random_instances(
    hidden: int, layers: int, batch: int, recompute: set, mbs: set, flash: set
) -> None:
    instance = _big(small_instance(layers=layers, global_batch_size=batch), hidden)
    space = SearchSpace(
        micro_batch_size=tuple(mbs), recompute=tuple(sorted(recompute)),
        flash_attention=tuple(flash), vpp=(1, 2),
    )  # fmt: skip
    bound = model_capacity(instance, space).per_gpu_bytes()
    for plan in enumerate_layouts(instance, space):
        assert bound <= _worst(instance, plan) * (1 + 1e-12), plan.layout()


def _splits(layers: int, chunks: int):
    """Every split of ``layers`` into ``chunks`` positive parts."""
    for cuts in itertools.combinations(range(1, layers), chunks - 1):
        bounds = (0, *cuts, layers)
        yield tuple(b - a for a, b in itertools.pairwise(bounds))


@pytest.mark.parametrize("hidden", [4096, 6144, 8192])
def test_memory_check_is_a_relaxation_of_every_split(hidden: int) -> None:
    """Exhaustively over the splits: a layout some split of which fits is kept, and the
    deficit of a pruned one is no more than its best split's (vpp 1 and 2)."""
    instance = _big(small_instance(gpu="v100-16gb", layers=8, global_batch_size=8), hidden)
    space = SearchSpace(tp=(2, 4), vpp=(1, 2), micro_batch_size=(1,), flash_attention=(True,))
    limit = _limit(instance)
    pruned = 0
    for plan in enumerate_layouts(instance, space):
        chunks = plan.pp * plan.vpp
        best = min(_worst(instance, plan, s) for s in _splits(8, chunks)) - limit
        check = memory_check(instance, plan)
        assert check.feasible or best > 0, plan.layout()
        if not check.feasible:
            pruned += 1
            assert check.deficit_bytes <= best * (1 + 1e-9) + 1.0, plan.layout()
    assert pruned


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def test_a_huge_model_on_a_small_cluster_names_the_real_deficit(tmp_path: Path) -> None:
    cluster = tmp_path / "c.yaml"
    code, out = _run("cluster", "generate", "healthy-a100", "--nodes", "2", "-o", str(cluster))
    assert code == 0, out
    code, out = _run("solve", "--model", "gpt3-175b", "--cluster", str(cluster))
    assert code == 3, out
    (line,) = [x for x in out.splitlines() if x.strip()]
    match = re.fullmatch(
        r"error: nothing fits in memory: gpt3-175b needs at least ([\d.]+) GB per GPU even at maximal sharding "
        r"\((\d+) GB across 16 GPUs\), the A100-SXM4-80GB has ([\d.]+) GB usable: "
        r"at least (\d+) such GPUs are needed, the cluster has 16",
        line,
    )
    assert match, line
    need, total, usable, gpus = map(float, match.groups())
    assert need > 2 * usable and total > 16 * usable and gpus > 2 * 16
    assert "time-limit" not in out


def test_no_time_advice_when_the_model_cannot_fit() -> None:
    """Even with no time at all, a model too big for the cluster gets the memory answer."""
    instance = _big(small_instance(gpu="v100-16gb", global_batch_size=8))
    with pytest.raises(InfeasibleError) as info:
        search(instance, SearchOptions(method="megatron-default", time_limit_s=1e-3))
    message = str(info.value)
    assert "needs at least" in message and "such GPUs are needed, the cluster has 8" in message
    assert "time" not in message and "\n" not in message


def test_the_closest_layout_when_the_model_could_fit_but_the_space_forbids_it() -> None:
    """The model fits at maximal sharding, but the space allows data parallelism only:
    the deficit of the one layout left (the whole model on each GPU) is the real one."""
    instance = _big(small_instance(gpu="v100-16gb", global_batch_size=8), 4096)
    space = SearchSpace(tp=(1,), pp=(1,), recompute=("none",), flash_attention=(True,))
    assert model_capacity(instance, space).fits
    deficits = [
        _worst(instance, plan) - _limit(instance) for plan in enumerate_layouts(instance, space)
    ]
    with pytest.raises(InfeasibleError) as info:
        search(instance, SearchOptions(method="megatron-default", space=space))
    message = str(info.value)
    assert message.startswith("nothing fits in memory: the closest layout")
    assert f"needs {min(deficits) / 1e9:.2f} GB more per GPU" in message
    assert "allow --recompute full" in message and "allow more --tp/--pp/--dp values" in message
    assert "time-limit" not in message


def test_more_time_is_advised_only_when_layouts_fit_and_time_ran_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    instance = small_instance()
    assert model_capacity(instance).fits
    monkeypatch.setattr(loop, "fallback", lambda *args, **kwargs: [])  # no default plan
    with pytest.raises(InfeasibleError, match=r"no plan within the time limit.*--time-limit"):
        search(instance, SearchOptions(method="megatron-default", time_limit_s=1e-3))
