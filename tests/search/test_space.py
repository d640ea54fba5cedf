"""The layout space's arithmetic: divisors in square-root steps, and a model whose counts
a file can make huge refused by its limits instead of set up for minutes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipette_cp.errors import SpecError
from pipette_cp.io.instance_file import load_instance
from pipette_cp.io.model_file import load_model, model_from_mapping
from pipette_cp.search.space import divisors, enumerate_layouts
from pipette_cp.specs import SearchSpace
from pipette_cp.specs.model_fields import MAX_LAYERS
from pipette_cp.specs.model_moe import MAX_EXPERTS


@given(st.integers(1, 5000), st.one_of(st.none(), st.integers(1, 6000)))
def test_divisors_are_the_brute_force_ones(n: int, at_most: int | None) -> None:
    brute = [d for d in range(1, n + 1) if n % d == 0 and (at_most is None or d <= at_most)]
    assert divisors(n, at_most) == brute


def test_divisors_of_a_huge_count_up_to_the_job_size() -> None:
    assert divisors(2**40, 1024) == [2**k for k in range(11)]
    assert divisors(10**12 + 39, 10**4) == [1]  # a prime: no 10^12 steps


@pytest.mark.parametrize(
    ("field", "value", "limit"),
    [("num_layers", MAX_LAYERS + 1, MAX_LAYERS), ("num_experts", MAX_EXPERTS * 2, MAX_EXPERTS)],
)
def test_a_huge_count_is_refused_naming_the_field(field: str, value: int, limit: int) -> None:
    fields = load_model("deepseek-v3").model_dump() | {field: value}
    with pytest.raises(SpecError) as info:
        model_from_mapping(fields)
    assert str(info.value).startswith(f"model.{field}={value}")
    assert f"{limit}" in str(info.value).replace(",", "")


def test_an_absurd_chunk_count_builds_no_split() -> None:
    """vpp = 10^30 (a command line can say it): no layout, no split of 10^30 chunks."""
    instance = load_instance("gpt3-1.3b-nominal-8")
    assert list(enumerate_layouts(instance, SearchSpace(vpp=(10**30,)))) == []
    assert list(enumerate_layouts(instance, SearchSpace(vpp=(1, 10**30), pp=(2,), tp=(1,))))
