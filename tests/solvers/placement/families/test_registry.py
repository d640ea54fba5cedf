"""The one list of families: every family module has its test module here, the hard
families name exactly the checker's functions (with the split master's families), and
the inputs of ``x`` are laid out family by family."""

from __future__ import annotations

from pathlib import Path

import pytest

import pipette_cp.solvers.placement.families as families_package
from pipette_cp.checker import CHECKS
from pipette_cp.solvers.placement.families import BUILTIN, SYMMETRY, placement_families
from pipette_cp.solvers.placement.family import Slot, XIndex
from pipette_cp.solvers.split.families import BUILTIN as SPLIT_BUILTIN

#: modules of the families package that hold no family
SHARED = {"__init__", "rows", "group_tables", "group_family"}


def test_every_family_module_has_its_test_module() -> None:
    root = Path(families_package.__file__).parent
    modules = {p.stem for p in root.glob("*.py")} | {p.stem for p in root.glob("hard/*.py")}
    tests = {p.stem.removeprefix("test_") for p in Path(__file__).parent.glob("test_*.py")}
    assert sorted(modules - SHARED - tests) == []


def test_the_hard_families_name_every_check_of_the_checker() -> None:
    named = [f.check for f in (*BUILTIN, SYMMETRY, *SPLIT_BUILTIN) if f.check]
    assert set(named) == set(CHECKS)
    placement = [f.check for f in BUILTIN if f.check]
    assert placement == ["placement_bijection", "tp_within_node", "memory_limit", "no_failed_link"]


def test_names_are_unique_and_the_symmetry_comes_last() -> None:
    listed = placement_families()
    assert len({f.name for f in listed}) == len(listed)
    assert listed[-1] is SYMMETRY


def test_the_index_lays_slots_out_in_order_and_refuses_a_name_twice() -> None:
    xi = XIndex.assemble([Slot("a", (2,)), Slot("b", (2, 1), boolean=True), Slot("c", (0,))])
    assert xi.size == 4 and xi.a.tolist() == [0, 1] and xi["b"].tolist() == [[2], [3]]
    assert xi.booleans.tolist() == [2, 3] and xi.get("missing").size == 0
    with pytest.raises(ValueError, match="'a'"):
        XIndex.assemble([Slot("a", (1,)), Slot("a", (1,))])
