"""The search on random valid instances with LoRA fine-tuning and activation offloading
in the space: no crash, and every returned plan valid, fitting, in the space, ranked and
in agreement with the simulator (the checks of :mod:`tests.property.test_search`)."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from pipette_cp.errors import SolverTimeoutError, SpecError
from pipette_cp.specs import Instance, SearchSpace
from pipette_cp.specs.lora import LORA_TARGETS, LoraSpec
from pipette_cp.specs.training import OFFLOAD_MODULES
from tests.property.strategies import event, fuzz_settings, instances
from tests.property.test_search import CHEAP, NO_TIME_LIMIT_S, assert_valid_plans, run_search

DENSE_OFFLOAD = tuple(m for m in OFFLOAD_MODULES if m not in ("expert_fc1", "moe_act"))


@st.composite
def tuned_instances(draw: st.DrawFn) -> Instance:
    """A valid dense instance with LoRA, activation offloading to try, or both."""
    instance = draw(instances())
    model = instance.model
    assume(not model.is_moe and not model.is_mla and not model.mtp_layers)
    lora = None
    if draw(st.booleans()):
        targets = draw(st.lists(st.sampled_from(LORA_TARGETS), min_size=1, unique=True))
        lora = LoraSpec(rank=draw(st.sampled_from([4, 16, 64])), target_modules=tuple(targets))
    sets = draw(st.lists(st.lists(st.sampled_from(DENSE_OFFLOAD), min_size=1, max_size=2,
                                  unique=True), min_size=1, max_size=2))  # fmt: skip
    offload = None if lora is not None and draw(st.booleans()) else (None, *map(tuple, sets))
    assume(lora is not None or offload is not None)
    try:
        training = instance.training.model_copy(update={"lora": lora})
        space = instance.search_space.model_dump() | (
            {"offload_modules": offload} if offload else {}
        )
        return Instance(
            name=instance.name, model=model, cluster=instance.cluster, training=training,
            search_space=SearchSpace.model_validate(space),
        )  # fmt: skip
    except (SpecError, ValueError):  # a space the knobs refuse outright: not this test's
        assume(False)
        raise


@pytest.mark.slow
@fuzz_settings(10)
@given(tuned_instances(), st.sampled_from(CHEAP), st.integers(0, 3))
def test_search_with_lora_and_offloading(instance: Instance, method: str, seed: int) -> None:
    plans = run_search(instance, method, seed, time_limit_s=NO_TIME_LIMIT_S, max_solves=3)
    if plans is not None:
        event(f"lora {instance.training.lora is not None}: plans")
        assert_valid_plans(instance, plans)
        for plan in plans:
            assert plan.offload_modules in instance.search_space.offload_modules


@pytest.mark.slow
@fuzz_settings(3)
@given(tuned_instances(), st.integers(0, 3))
def test_exact_search_with_lora_and_offloading(instance: Instance, seed: int) -> None:
    assume(instance.cluster.num_gpus <= 32)
    try:
        plans = run_search(instance, "cpsat", seed, time_limit_s=4.0, max_solves=2)
    except SolverTimeoutError:
        event("timed out")
        return
    if plans is not None:
        assert_valid_plans(instance, plans)
