"""The search's options as one object, and the library's keywords that build it."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from pipette_cp import api
from pipette_cp.errors import SpecError
from pipette_cp.search.options import OPTION_NAMES, SearchKeywords, SearchOptions
from pipette_cp.search.robust import robust_search
from tests.conftest import small_instance


def test_the_keywords_are_the_options() -> None:
    assert tuple(SearchKeywords.__annotations__) == OPTION_NAMES
    assert set(SearchKeywords.__annotations__) == {
        f.name for f in dataclasses.fields(SearchOptions)
    }


def test_options_are_frozen_and_hold_a_tuple_of_constraints() -> None:
    options = SearchOptions(constraints=[])
    assert options.constraints == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.top_k = 3  # type: ignore[misc]
    solve = SearchOptions(seed=7, milp_solver="cbc", deterministic=True).solve_options()
    assert (solve.seed, solve.milp_solver, solve.deterministic) == (7, "cbc", True)


@pytest.mark.parametrize("function", [api.solve, api.solve_with_stats, api.solve_robust])
def test_the_library_functions_take_the_options_as_keywords(function: object) -> None:
    params = inspect.signature(function).parameters  # type: ignore[arg-type]
    assert params["options"].kind is inspect.Parameter.VAR_KEYWORD


def test_api_solve_builds_the_options_once(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[SearchOptions] = []

    def fake(instance: object, options: SearchOptions) -> api.SearchResult:
        seen.append(options)
        raise SpecError("test", 0, "stopped")

    monkeypatch.setattr(api, "search", fake)
    with pytest.raises(SpecError):
        api.solve("gpt3-1.3b-nominal-8", method="greedy", top_k=2, jobs=1, max_solves=3)
    assert seen == [SearchOptions(method="greedy", top_k=2, jobs=1, max_solves=3)]


@pytest.mark.parametrize("name", ["deterministic", "on_best"])
def test_the_robust_search_refuses_what_it_cannot_honour(name: str) -> None:
    value = True if name == "deterministic" else (lambda plan, gap: None)
    options = dataclasses.replace(SearchOptions(), **{name: value})
    inst = small_instance(nodes=2, gpus_per_node=2)
    with pytest.raises(SpecError, match=name):
        robust_search(inst, [inst.cluster], options)
