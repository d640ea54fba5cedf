"""Fuzzing the loaders and the CLI with invalid inputs.

Valid model / cluster / training / search-space mappings and instance files
(``tests/property/strategies.py``) are mutated: wrong types, negative / zero / NaN /
inf / huge numbers, missing and unknown fields, non-divisible heads, empty and
non-square matrices, garbage bytes in YAML / JSON / CSV files.  Whatever comes
in, a loader returns a *valid* spec (it round-trips through JSON, holds only finite
numbers >= 0 and positive sizes: ``fuzz_strategies.assert_valid``) or raises a
:class:`PipetteError` whose message is one non-empty line naming the field
(``field=value: ...``) or the file; nothing else escapes, and no loader hangs (a
5 s deadline per example).  One property test per class of hostile input (YAML
bombs and depth, duplicate keys, non-finite numbers, cut logs) is in
``tests/io/test_input_classes.py``.  Through the CLI, bad
input gives exit code 2, one ``error:`` line and no traceback.

Run long: ``HYPOTHESIS_PROFILE=fuzz python -m pytest tests/property/test_inputs.py``.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import BaseModel
from typer.testing import CliRunner

from pipette_cp.cli import app
from pipette_cp.errors import InputFileError, PipetteError, SpecError
from pipette_cp.io.cluster_file import cluster_from_mapping, read_cluster_file
from pipette_cp.io.instance_file import load_instance
from pipette_cp.io.matrix_files import LabelledMatrix, read_matrix_csv, read_pipette_json
from pipette_cp.io.measurements.mpigraph import MpiGraphResult, read_mpigraph
from pipette_cp.io.model_file import load_model, model_from_mapping
from pipette_cp.specs import ModelSpec, SearchSpace, TrainingSpec, validate_spec
from tests.property.strategies import (
    assert_valid,
    cluster_file_fields,
    event,
    fuzz_settings,
    model_fields,
    search_space_fields,
    training_fields,
)

#: Per-example deadline of the loaders: a bad input must never hang.
LOADER_DEADLINE_MS = 5000
runner = CliRunner()


# ------------------------------------------------------------------ mutations
BAD_SCALARS: list[Any] = [
    None, 0, -1, -7, 1.5, -0.5, math.nan, math.inf, -math.inf, 10**30, 2**63, 1e300,
    True, False, "", "abc", "12", [], [1, "x"], {}, {"a": 1},
]  # fmt: skip


def bad_values() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.sampled_from(BAD_SCALARS),
        st.integers(-(10**12), 10**12),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=12),
        st.lists(st.one_of(st.none(), st.integers(-5, 5), st.floats()), max_size=4),
    )


def bad_matrices(n: int) -> st.SearchStrategy[Any]:
    """Matrices that are empty, ragged, non-square, wrongly sized or hold bad cells."""
    cell = st.one_of(st.floats(0, 100), st.none(), st.sampled_from(BAD_SCALARS))
    return st.one_of(
        st.just([]),
        st.just([[]]),
        st.lists(st.lists(cell, min_size=0, max_size=n + 2), min_size=1, max_size=n + 2),
        st.integers(0, 9).map(lambda k: [[None] * k for _ in range(k + 1)]),
        st.sampled_from(BAD_SCALARS),
    )


@st.composite
def mutated(draw: st.DrawFn, data: dict[str, Any], matrix_keys: tuple[str, ...] = ()) -> dict:
    """``data`` with one to three random mutations (top-level keys)."""
    data = dict(data)
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["delete", "unknown", "value", "value", "matrix"]))
        keys = sorted(data)
        if action == "delete" and keys:
            del data[draw(st.sampled_from(keys))]
        elif action == "unknown":
            names = st.sampled_from(["nmu_layers", "hidden", "bandwidth_gbps", "x"])
            data[draw(st.one_of(names, st.text(max_size=6)))] = 1
        elif action == "matrix" and matrix_keys:
            key = draw(st.sampled_from(matrix_keys))
            data[key] = draw(bad_matrices(4))
        elif keys:
            data[draw(st.sampled_from(keys))] = draw(bad_values())
    return data


def non_divisible_heads(fields: dict[str, Any]) -> dict[str, Any]:
    kv = max(2, fields["num_attention_heads"])
    return {**fields, "num_attention_heads": kv + 1, "num_kv_heads": kv}


# ------------------------------------------------------------------ the property
def assert_one_line(exc: PipetteError, names: tuple[str, ...] = ()) -> None:
    """One non-empty line that names the field (``field=value``) or the file."""
    text = str(exc)
    assert text.strip() and len(text.splitlines()) == 1 and text.isprintable(), repr(text)
    if isinstance(exc, SpecError):  # (a control character in a name is escaped)
        assert exc.field and (text.startswith(f"{exc.field}=") or not exc.field.isprintable())
    elif isinstance(exc, InputFileError):
        assert exc.path and (text.startswith(exc.path) or not exc.path.isprintable()), text
    if names:
        assert any(name in text for name in names), (names, text)


def loads_or_rejects(load: Callable[[], object], names: tuple[str, ...] = ()) -> object | None:
    """The spec, checked to be valid (:func:`assert_accepted_is_valid`), or None after
    checking the error; any other exception fails."""
    try:
        spec = load()
    except PipetteError as exc:
        event(f"rejected: {type(exc).__name__}")
        assert exc.exit_code == 2, (type(exc).__name__, exc)
        assert_one_line(exc, names)
        return None
    event("accepted")
    assert_accepted_is_valid(spec)
    return spec


def assert_accepted_is_valid(result: object) -> None:
    """Accepting bad input is a defect too: a spec must round-trip and hold only finite,
    non-negative numbers and positive sizes (:func:`fuzz_strategies.assert_valid`); a
    matrix read from a file only finite bandwidths >= 0."""
    if isinstance(result, BaseModel):
        assert_valid(result)
    elif isinstance(result, LabelledMatrix):
        matrix = result.bandwidth_bytes_per_s
        assert np.isfinite(matrix).all() and (matrix >= 0).all(), matrix
        assert result.intra_node_bytes_per_s is None or result.intra_node_bytes_per_s >= 0
    elif isinstance(result, MpiGraphResult):
        for matrix in (result.send_bytes_per_s, result.recv_bytes_per_s):
            assert np.isfinite(matrix).all() and (matrix >= 0).all(), matrix
    else:
        raise AssertionError(f"unexpected result {type(result).__name__}")


def _write(directory: Path, name: str, data: object, fmt: str) -> Path:
    path = directory / name
    if fmt == "json":
        path.write_text(json.dumps(data), encoding="utf-8")
    else:
        path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


# ------------------------------------------------------------------ spec mappings
@fuzz_settings(60, deadline_ms=LOADER_DEADLINE_MS)
@given(model_fields().flatmap(mutated))
@example({"name": "m", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 6,
          "num_kv_heads": 4, "ffn_hidden_size": 256, "vocab_size": 100,
          "max_seq_length": 128})  # fmt: skip
def test_model_mapping(data: dict[str, Any]) -> None:
    loads_or_rejects(lambda: model_from_mapping(data, "model"), ("model",))
    loads_or_rejects(lambda: validate_spec(ModelSpec, data, "model"), ("model",))


@fuzz_settings(20, deadline_ms=LOADER_DEADLINE_MS)
@given(model_fields().map(non_divisible_heads))
def test_model_heads_not_divisible(data: dict[str, Any]) -> None:
    assert loads_or_rejects(lambda: model_from_mapping(data), ("num_kv_heads",)) is None


@fuzz_settings(40, deadline_ms=LOADER_DEADLINE_MS)
@given(training_fields().flatmap(mutated))
def test_training_mapping(data: dict[str, Any]) -> None:
    loads_or_rejects(lambda: validate_spec(TrainingSpec, data, "training"), ("training",))


@fuzz_settings(40, deadline_ms=LOADER_DEADLINE_MS)
@given(search_space_fields().flatmap(mutated))
def test_search_space_mapping(data: dict[str, Any]) -> None:
    loads_or_rejects(lambda: validate_spec(SearchSpace, data, "search_space"), ("search_space",))


_MATRIX_KEYS = (
    "node_bandwidth_gb_per_s",
    "gpu_bandwidth_gb_per_s",
    "intra_node_bandwidth_gb_per_s",
)


@fuzz_settings(80, deadline_ms=LOADER_DEADLINE_MS)
@given(cluster_file_fields().flatmap(lambda d: mutated(d, _MATRIX_KEYS)))
@example({"gpu": "a100", "gpus_per_node": 8, "nominal": True, "num_nodes": 10**9,
          "inter_node_bandwidth_gb_per_s": 10, "nic_bandwidth_gb_per_s": 10})  # fmt: skip
@example({"gpu": "a100", "gpus_per_node": 10**9, "nominal": True, "num_nodes": 2,
          "inter_node_bandwidth_gb_per_s": 10, "nic_bandwidth_gb_per_s": 10})  # fmt: skip
def test_cluster_mapping(data: dict[str, Any]) -> None:
    loads_or_rejects(lambda: cluster_from_mapping(data, "cluster"), ("cluster",))


@st.composite
def generator_recipes(draw: st.DrawFn) -> dict[str, Any]:
    recipe = {"kind": draw(st.sampled_from(["degraded", "g1", "healthy-a100", "v100-cube"])),
              "nodes": draw(st.integers(2, 4)), "seed": draw(st.integers(0, 9))}  # fmt: skip
    return draw(mutated(recipe))


# ------------------------------------------------------------------ files
@st.composite
def instance_mappings(draw: st.DrawFn) -> dict[str, Any]:
    """An instance file's mapping, mutated at the top level or inside one part."""
    data: dict[str, Any] = {
        "name": "fuzz",
        "model": draw(model_fields()),
        "cluster": draw(st.one_of(cluster_file_fields(max_nodes=3), generator_recipes().map(
            lambda r: {"generator": r}))),
        "training": draw(training_fields()),
        "search_space": draw(search_space_fields()),
    }  # fmt: skip
    part = draw(st.sampled_from(["", "model", "cluster", "training", "search_space"]))
    if part == "" or not isinstance(data[part], dict):
        return draw(mutated(data))
    inner = data[part].get("generator", data[part])
    changed = draw(mutated(inner, _MATRIX_KEYS if part == "cluster" else ()))
    data[part] = {"generator": changed} if "generator" in data[part] else changed
    return data


@fuzz_settings(60, deadline_ms=LOADER_DEADLINE_MS)
@given(instance_mappings(), st.sampled_from(["yaml", "json"]))
@example({"model": "tiny-gpt", "cluster": {"generator": {"kind": "g1", "nodes": 10**7,
          "seed": 0}}, "training": {"global_batch_size": 8, "seq_length": 128}}, "yaml")  # fmt: skip
@example({"model": "tiny-gpt", "": 1}, "yaml")  # named the field '' ("=1: unknown ...")
def test_instance_file(data: dict[str, Any], fmt: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(Path(tmp), f"inst.{fmt}", data, fmt)
        loads_or_rejects(lambda: load_instance(path))


@fuzz_settings(40, deadline_ms=LOADER_DEADLINE_MS)
@given(model_fields().flatmap(mutated), cluster_file_fields(max_nodes=3).flatmap(
    lambda d: mutated(d, _MATRIX_KEYS)))  # fmt: skip
def test_model_and_cluster_files(model: dict[str, Any], cluster: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model_path = _write(Path(tmp), "model.yaml", model, "yaml")
        loads_or_rejects(lambda: load_model(model_path))
        cluster_path = _write(Path(tmp), "cluster.yaml", cluster, "yaml")
        loads_or_rejects(lambda: read_cluster_file(cluster_path), (str(cluster_path),))


VALID_YAML = yaml.safe_dump(
    {
        "model": "tiny-gpt",
        "cluster": {"generator": {"kind": "g1", "nodes": 2, "seed": 0}},
        "training": {"global_batch_size": 8, "seq_length": 256},
    }
)


@st.composite
def garbled_text(draw: st.DrawFn, text: str) -> str:
    """``text`` with random characters inserted, deleted or replaced."""
    chars = list(text)
    for _ in range(draw(st.integers(1, 6))):
        i = draw(st.integers(0, len(chars)))
        action = draw(st.sampled_from(["insert", "delete", "replace"]))
        junk = draw(st.sampled_from(list(":-[]{}\"'\t\n #&*!|>%@`,?\\\x00\x85\u2028")))
        if action == "insert" or not chars:
            chars.insert(i, junk)
        elif action == "delete" and i < len(chars):
            del chars[i]
        elif i < len(chars):
            chars[i] = junk
    return "".join(chars)


LOADERS: dict[str, Callable[[Path], object]] = {
    "inst.yaml": load_instance,
    "inst.json": load_instance,
    "model.yaml": load_model,
    "config.json": load_model,
    "cluster.yaml": read_cluster_file,
    "matrix.csv": read_matrix_csv,
    "pipette.json": read_pipette_json,
    "mpigraph.txt": read_mpigraph,
}


@fuzz_settings(60, deadline_ms=LOADER_DEADLINE_MS)
@given(
    st.sampled_from(sorted(LOADERS)),
    st.one_of(st.binary(max_size=200), garbled_text(VALID_YAML).map(str.encode)),
)
@example("inst.yaml", b"\xff\xfe\x00garbage")
@example("inst.yaml", b"~: 1\nzz: 2\n")  # a null key among strings: sorted() raised TypeError
@example("cluster.yaml", b"format: pipette-cp-cluster/1\n~: 1\nzz: 2\n")
@example("matrix.csv", b"a,b\n1,2,3\n")
@example("pipette.json", b'{"gpus": ["a"], "bandwidth": [[1, 2]]}')
@example("mpigraph.txt", b"START mpiGraph v1.5\nSend\tn:0\nn:0 to\tx\nEND mpiGraph\n")
def test_garbage_files(name: str, content: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(content)
        loads_or_rejects(lambda: LOADERS[name](path))


def test_missing_and_directory_paths(tmp_path: Path) -> None:
    for name, load in LOADERS.items():
        absent = tmp_path / "absent" / name
        assert loads_or_rejects(lambda: load(absent), (str(absent),)) is None  # noqa: B023
    with pytest.raises(PipetteError, match="directory"):
        read_cluster_file(tmp_path)


# ------------------------------------------------------------------ the CLI
def assert_cli_rejects(args: list[str], codes: tuple[int, ...] = (2,)) -> int:
    """Exit 0, or one of ``codes`` with one ``error:`` line; never a traceback."""
    result = runner.invoke(app, args)
    out = result.output
    assert "Traceback" not in out, out
    if result.exit_code != 0:
        assert result.exit_code in codes, (args, result.exit_code, out, result.exception)
        lines = [line for line in out.splitlines() if line.strip()]
        if result.exit_code != 2 or not out.lstrip().startswith("Usage"):  # click's own usage
            assert len(lines) == 1 and lines[0].startswith("error: "), out
    return result.exit_code


def test_control_characters_are_escaped() -> None:
    """Fuzzing found it: ``cluster: "\\x1e"`` in an instance file printed the file name
    raw, and ``\\x1e`` (like a newline in a field name) splits the one-line message.
    Fixed in ``PipetteError.__str__``: non-printable characters are escaped."""
    assert str(InputFileError("\x1e", "no such file")) == "\\x1e: no such file"
    assert str(SpecError("cluster.a\nb", 1, "unknown field")) == "cluster.a\\nb=1: unknown field"


@fuzz_settings(25)
@given(instance_mappings(), st.sampled_from(["yaml", "json"]))
@example({"model": "tiny-gpt", "cluster": "\x1e",
          "training": {"global_batch_size": 1, "seq_length": 128}}, "yaml")  # fmt: skip
@pytest.mark.slow
def test_cli_show_bad_instance(data: dict[str, Any], fmt: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(Path(tmp), f"inst.{fmt}", data, fmt)
        assert_cli_rejects(["show", str(path)])


@fuzz_settings(25)
@given(st.binary(max_size=120), st.sampled_from(["show", "export", "plot"]))
def test_cli_garbage_files(content: bytes, command: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("inst.yaml" if command == "show" else "plan.json")
        path.write_bytes(content)
        extra = ["--timeline", str(Path(tmp) / "t.png")] if command == "plot" else []
        assert_cli_rejects([command, str(path), *extra])


_OPTION = st.one_of(
    st.integers(-3, 300).map(str),
    st.sampled_from(["", "x", "1.5", "-0", "1e3", "nan", "9" * 30]),
)


@fuzz_settings(25)
@given(
    st.dictionaries(st.sampled_from(["--tp", "--pp", "--dp", "--mb", "--vpp"]), _OPTION),
    st.one_of(st.none(), st.text(",0123456789x-", max_size=12)),
)
def test_cli_predict_bad_options(options: dict[str, str], split: str | None) -> None:
    args = ["predict", "gpt3-1.3b-nominal-8"]
    for key, value in options.items():
        args += [key, value]
    if split is not None:
        args += ["--split", split]
    assert_cli_rejects(args, codes=(2, 3))


@fuzz_settings(20)
@given(
    st.dictionaries(
        st.sampled_from(["--tp", "--pp", "--dp", "--mb", "--vpp", "--method", "--top"]),
        st.one_of(_OPTION, st.lists(_OPTION, min_size=1, max_size=3).map(",".join)),
        min_size=1,
    )
)
@pytest.mark.slow
def test_cli_solve_bad_options(options: dict[str, str]) -> None:
    """Options of ``solve`` on a small instance (a search that does run stays short)."""
    args = ["solve", "gpt3-1.3b-nominal-8", "--time-limit", "2"]
    if "--method" not in options:
        args += ["--method", "megatron-default"]
    for key, value in options.items():
        args += [key, value]
    assert_cli_rejects(args, codes=(2, 3))
