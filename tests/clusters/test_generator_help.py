"""``pipette-cp cluster generate KIND --help``: the ``--set`` parameters of every generator.

The list comes from the builders' signatures and docstrings
(:mod:`pipette_cp.clusters.generators.help`); these tests keep it equal to what
``--set`` (that is, :func:`~pipette_cp.clusters.generators.registry.generate`) accepts.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from pipette_cp.cli.app import app
from pipette_cp.cli.cluster.commands import _params
from pipette_cp.clusters.generators.help import (
    accepted_keys,
    format_value,
    generator_kind,
    generator_parameters,
)
from pipette_cp.clusters.generators.params import parameters_of
from pipette_cp.clusters.generators.registry import ALL_GENERATORS, generate
from pipette_cp.clusters.generators.trees import TREE_GENERATORS
from pipette_cp.errors import SpecError
from pipette_cp.specs import ClusterSpec

runner = CliRunner()
KINDS = [*ALL_GENERATORS, *TREE_GENERATORS]
ALIASES = {info.alias: kind for kind, info in [*ALL_GENERATORS.items(), *TREE_GENERATORS.items()]}
#: Small clusters every generator builds with its defaults (pods, racks, leaves).
NODES = {"oversubscribed": 16, "gb200-nvl72": 18, "gb300-nvl72": 18, "fat-tree": 64}


def _generate(kind: str, **params: Any) -> ClusterSpec:
    cluster = generate(kind, nodes=NODES.get(kind, 8), seed=3, **params)
    return cluster.model_copy(update={"source": ""})  # the source lists the parameters given


def _set_by_registry(kind: str) -> set[str]:
    """The names ``generate`` passes on to the generator (as its unknown-name check does)."""
    if kind in TREE_GENERATORS:
        return set(TREE_GENERATORS[kind].defaults)
    info = ALL_GENERATORS[kind]
    return {*parameters_of(info.builder), *(p for b in info.base_kinds.values() for p in parameters_of(b))}  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_every_listed_parameter_takes_its_listed_default(kind: str) -> None:
    params = generator_parameters(kind)
    assert params and len({p.name for p in params}) == len(params)
    for p in params:
        assert p.description and p.type, p
        (value,) = _params([f"{p.name}={p.text}"]).values()  # as the command reads it
        assert value == p.default or (value is None and p.default is None), p
        assert _generate(kind, **p.needs, **{p.name: value}) == _generate(kind, **p.needs), p.name


@pytest.mark.parametrize("kind", KINDS)
def test_every_key_set_accepts_is_listed(kind: str) -> None:
    listed = {p.name for p in generator_parameters(kind)}
    by_name = _set_by_registry(kind)
    assert accepted_keys(kind) == by_name and listed <= by_name
    for name in by_name - listed:  # taken by name, then refused (failslow's persistent_share)
        default = {**parameters_of(ALL_GENERATORS[kind].base_kinds["healthy-a100"])}[name]
        with pytest.raises(SpecError, match="set correlation instead"):
            _generate(kind, **{name: default})
    with pytest.raises(SpecError, match="unknown parameter"):
        _generate(kind, no_such_parameter=1)


def test_aliases_list_their_kinds_parameters() -> None:
    assert {"g3", "nvl72", "g8", "ft"} <= set(ALIASES)
    for alias, kind in ALIASES.items():
        assert generator_kind(alias.upper()) == kind
        assert generator_parameters(alias) == generator_parameters(kind)


def test_units_and_base_specific_parameters() -> None:
    degraded = {p.name: p for p in generator_parameters("degraded")}
    assert degraded["nic_gbytes_per_s"].unit == "GB/s" and "GB/s" in degraded["nic_gbytes_per_s"].description  # fmt: skip
    assert degraded["leaf_pair_gbytes_per_s"].needs == {"base": "h100-multileaf"}
    assert "40 with base h100-multileaf" in degraded["nic_gbytes_per_s"].note
    racks = {p.name: p for p in generator_parameters("gb300-nvl72")}
    assert racks["nic_gbytes_per_s"].default == 80.0 and racks["segment_trays"].text == "null"
    assert "persistent_share" not in {p.name for p in generator_parameters("failslow")}
    assert [format_value(v) for v in (None, True, 0.026, 17.0, 1e-6, "a100")] == [
        "null", "true", "0.026", "17", "1.0e-06", "a100"
    ]  # fmt: skip


def test_unknown_kind_is_the_generate_error() -> None:
    with pytest.raises(SpecError) as listed:
        generator_parameters("nope")
    with pytest.raises(SpecError) as generated:
        generate("nope", nodes=2, seed=0)
    assert str(listed.value) == str(generated.value)


# ------------------------------------------------------------------ the command line
def _help(*args: str) -> Any:
    return runner.invoke(app, ["cluster", "generate", *args], env={"COLUMNS": "80"})


@pytest.mark.parametrize("kind", ["degraded", "g8", "fat-tree"])
def test_cli_help_lists_names_and_defaults(kind: str) -> None:
    result = _help(kind, "--help")
    assert result.exit_code == 0, result.output
    assert "--gpus-per-node" in result.output  # the normal help comes first
    name = ALIASES.get(kind, kind)
    assert f"Parameters of {name} (--set KEY=VALUE)" in result.output
    for p in generator_parameters(kind):
        row = rf"^  {p.name} +{re.escape(p.text)}  "
        assert re.search(row, result.output, re.MULTILINE), (p.name, result.output)
    assert max(len(line) for line in result.output.splitlines()) <= 80


def test_cli_help_kind_anywhere_before_or_after_options() -> None:
    result = _help("-o", "x.yaml", "--help", "degraded")
    assert result.exit_code == 0 and "Parameters of degraded" in result.output


def test_cli_help_without_kind_says_how_to_list() -> None:
    result = _help("--help")
    assert result.exit_code == 0 and "Parameters of" not in result.output
    assert "Give a KIND before --help to list its parameters (see `pipette-cp list generators`)." in result.output  # fmt: skip


def test_cli_help_of_unknown_kind_is_one_line_exit_2() -> None:
    result = _help("nope", "--help")
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith("error: generator.kind='nope': unknown generator; known: ")


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("leaf=4", "fat-tree.leaf=4: unknown parameter (did you mean leaf_nodes?); "
                   "`pipette-cp cluster generate fat-tree --help` lists them"),
        ("seed=3", "--set seed=3: not a generator parameter; use --seed"),
    ],
)  # fmt: skip
def test_cli_unknown_set_key_names_it_and_points_to_help(
    setting: str, message: str, tmp_path: Path
) -> None:
    out = tmp_path / "c.yaml"
    result = _help("ft", "--gpus", "64", "--set", setting, "-o", str(out))
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and lines == [f"error: {message}"], result.output
    assert not out.exists()


def test_cli_set_gpus_per_node_acts_as_the_option(tmp_path: Path) -> None:
    out = tmp_path / "c.yaml"
    result = _help("g1", "-n", "2", "--set", "gpus_per_node=4", "-o", str(out))
    assert result.exit_code == 0 and "2 x 4 " in result.output, result.output
    result = _help("g1", "-n", "2", "--set", "gpus_per_node=4", "--gpus-per-node", "4", "-o", str(out))  # fmt: skip
    assert result.exit_code == 2 and "given twice" in result.output
