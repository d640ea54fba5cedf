"""One test (mostly a hypothesis property) per class of hostile input.

* YAML structure: alias bombs ("billion laughs"), alias cycles, deep nesting (YAML
  and JSON) are refused with one line before anything recurses or expands;
* what an input file is: a FIFO, a device, a directory or a file over the size
  limit is refused by every reader, without blocking;
* duplicated keys (YAML block and flow style, JSON, nested) are refused, naming
  the key;
* non-finite numbers (``nan``, ``inf``, ``1e400``, numpy's) and numbers beyond
  the physical bounds are refused in every spec, naming the field;
* nccl-tests logs cut at any byte never yield a misread row (every row read is
  one of the full log's), and a table labelled in MB/s is converted.

Each property runs a few dozen examples (``deadline=None``; a few seconds each on
two cores).  The catalogue rows of these classes are in ``docs/bad-inputs.md``.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pipette_cp.errors import InputFileError, PipetteError, SpecError
from pipette_cp.io import files
from pipette_cp.io.cluster_file import cluster_from_mapping, read_cluster_file
from pipette_cp.io.files import parse_yaml, read_mapping
from pipette_cp.io.hostfile import read_hostfile
from pipette_cp.io.instance_file import load_instance
from pipette_cp.io.matrix_files import read_matrix_csv, read_pipette_json
from pipette_cp.io.measurements.mpigraph import read_mpigraph
from pipette_cp.io.measurements.nccl_tests import parse_nccl_tests_log, read_nccl_tests_log
from pipette_cp.io.model_file import load_model
from pipette_cp.io.profile_file import load_layer_profile
from pipette_cp.io.yaml_safe import MAX_ALIAS_NODES, MAX_DEPTH
from pipette_cp.specs import GpuSpec, ModelSpec, TrainingSpec, resolve_gpu, validate_spec
from tests.conftest import FIXTURES
from tests.property.strategies import cluster_file_fields, model_fields, training_fields

FAST = settings(max_examples=30, deadline=None, derandomize=True)
NCCL = FIXTURES / "nccl"


def one_line(exc: PipetteError) -> str:
    text = str(exc)
    assert text.strip() and "\n" not in text and exc.exit_code == 2, text
    return text


# ------------------------------------------------------------------ YAML structure
@pytest.mark.slow
@FAST
@given(st.integers(1, 3000), st.sampled_from(["list", "map", "json"]))
def test_nesting_beyond_the_limit_is_refused_without_recursion(depth: int, kind: str) -> None:
    if kind == "list":
        text = "[" * depth + "1" + "]" * depth
    elif kind == "map":
        text = "{a: " * depth + "1" + "}" * depth
    else:
        text = '{"a": ' * depth + "1" + "}" * depth
    path = Path("deep.json" if kind == "json" else "deep.yaml")
    started = time.perf_counter()
    try:
        data = files.load_json(text, path) if kind == "json" else parse_yaml(text, path)
    except InputFileError as exc:
        assert depth > MAX_DEPTH and f"nested deeper than {MAX_DEPTH} levels" in one_line(exc)
    else:
        assert depth <= MAX_DEPTH and files._depth(data) == depth
    assert time.perf_counter() - started < 2.0


def _bomb(levels: int, refs: int) -> tuple[str, int]:
    """An alias bomb of ``levels`` levels of ``refs`` aliases each, and how many nodes
    its aliases stand for (what LimitedSafeLoader counts)."""
    lines, size, alias_nodes = ["a0: &a0 [x]"], 2, 0
    for k in range(1, levels):
        lines.append(f"a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * refs)}]")
        alias_nodes += refs * size
        size = 1 + refs * size
    return "\n".join(lines) + "\n", alias_nodes


@FAST
@given(st.integers(1, 40), st.integers(1, 10))
def test_alias_expansion_is_bounded(levels: int, refs: int) -> None:
    text, alias_nodes = _bomb(levels, refs)
    started = time.perf_counter()
    try:
        data = parse_yaml(text, "bomb.yaml")
    except InputFileError as exc:
        assert alias_nodes > MAX_ALIAS_NODES and "an alias bomb?" in one_line(exc)
    else:
        assert alias_nodes <= MAX_ALIAS_NODES
        assert data == yaml.safe_load(text)  # small documents read as PyYAML reads them
    assert time.perf_counter() - started < 2.0


@pytest.mark.parametrize("text", ["a: &a [*a]", "a: &a {b: *a}", "&a [1, [2, *a]]"])
def test_an_alias_inside_its_own_node_is_refused(text: str) -> None:
    with pytest.raises(InputFileError, match=r"refers to a node that contains it"):
        parse_yaml(text, "cycle.yaml")


def test_merge_keys_may_be_overridden_and_anchors_reused() -> None:
    text = "base: &b {x: 1, y: 2}\nd: {<<: *b, x: 3}\ne: [*b, *b]\n"
    assert parse_yaml(text, "ok.yaml") == yaml.safe_load(text)


# ------------------------------------------------------------------ what a file is
READERS: dict[str, Callable[[Path], object]] = {
    "inst.yaml": load_instance,
    "model.yaml": load_model,
    "cluster.yaml": read_cluster_file,
    "matrix.csv": read_matrix_csv,
    "pipette.json": read_pipette_json,
    "mpigraph.txt": read_mpigraph,
    "nccl_N2_G1_a_b.log": read_nccl_tests_log,
    "profile.json": load_layer_profile,
    "hosts.txt": read_hostfile,
    "any.yaml": read_mapping,
}


def _refused_in_time(read: Callable[[Path], object], path: Path) -> str:
    """The one-line message of ``read(path)``; fails if it blocks for 10 s."""
    outcome: list[object] = []
    worker = threading.Thread(target=lambda: outcome.append(_attempt(read, path)), daemon=True)
    worker.start()
    worker.join(10)
    assert outcome, f"{read.__name__}({path}) blocked"
    assert isinstance(outcome[0], InputFileError), outcome[0]
    return one_line(outcome[0])


def _attempt(read: Callable[[Path], object], path: Path) -> object:
    try:
        return read(path)
    except Exception as exc:  # the caller checks what it is
        return exc


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize("name", sorted(READERS))
def test_a_fifo_a_device_or_a_directory_is_refused(name: str, tmp_path: Path) -> None:
    fifo = tmp_path / name
    os.mkfifo(fifo)
    assert "is a FIFO (named pipe), expected a regular file" in _refused_in_time(
        READERS[name], fifo
    )
    if Path("/dev/zero").exists():
        message = _refused_in_time(READERS[name], Path("/dev/zero"))
        assert "is a character device, expected a regular file" in message
    folder = tmp_path / "folder"
    folder.mkdir()
    assert "directory" in _refused_in_time(READERS[name], folder)


@pytest.mark.parametrize("name", sorted(READERS))
def test_a_file_over_the_size_limit_is_refused(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "MAX_INPUT_BYTES", 1000)
    path = tmp_path / name
    path.write_text("# padding\n" * 101)
    assert "input files are limited to 1000 bytes" in _refused_in_time(READERS[name], path)


# ------------------------------------------------------------------ duplicate keys
_KEYS = st.lists(st.from_regex(r"k_[a-z0-9]{1,6}", fullmatch=True), min_size=1, max_size=8,
                 unique=True)  # fmt: skip


@FAST
@given(_KEYS, st.data(), st.sampled_from(["block", "flow", "json", "nested"]))
def test_a_duplicated_key_is_refused_naming_it(keys: list[str], data: Any, style: str) -> None:
    mapping = {k: i for i, k in enumerate(keys)}
    twice = data.draw(st.sampled_from(keys))
    items = list(mapping.items())
    items.insert(data.draw(st.integers(0, len(items))), (twice, 99))
    if style == "json":
        text, name = "{" + ", ".join(f'"{k}": {v}' for k, v in items) + "}", "d.json"
    elif style == "flow":
        text, name = "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}", "d.yaml"
    elif style == "block":
        text, name = "".join(f"{k}: {v}\n" for k, v in items), "d.yaml"
    else:
        text, name = "top:\n  inner:\n" + "".join(f"    {k}: {v}\n" for k, v in items), "d.yaml"
    path = Path(data.draw(st.sampled_from(["a", "b/c"]))) / name
    with pytest.raises(InputFileError) as info:
        (files.load_json(text, path) if style == "json" else parse_yaml(text, path))
    message = one_line(info.value)
    assert message.startswith(f"{path}: duplicate key '{twice}'"), message
    unique = text.replace(f"{twice}: 99", "k_other: 99").replace(f'"{twice}": 99', '"k_o": 99')
    if style == "json":
        assert files.load_json(unique, path) == json.loads(unique)
    else:
        assert parse_yaml(unique, path) == yaml.safe_load(unique)


# ------------------------------------------------------------------ non-finite numbers
NON_FINITE: list[Any] = [
    math.nan, math.inf, -math.inf, np.float64("nan"), np.float32("inf"), "1e400", "-1e400",
]  # fmt: skip


def _gpu_fields() -> dict[str, Any]:
    return resolve_gpu("h100").model_dump() | {"name": "custom"}


def _numeric_keys(fields: dict[str, Any]) -> list[str]:
    return sorted(k for k, v in fields.items() if type(v) in (int, float))


@FAST
@given(st.data(), st.sampled_from(["model", "training", "gpu", "cluster"]),
       st.sampled_from(NON_FINITE))  # fmt: skip
def test_a_non_finite_number_is_refused_naming_the_field(data: Any, part: str, bad: Any) -> None:
    if part == "model":
        fields, load = data.draw(model_fields()), lambda f: validate_spec(ModelSpec, f, "model")
    elif part == "training":
        fields = data.draw(training_fields()) | {"memory_headroom_bytes": 4e9}
        load = lambda f: validate_spec(TrainingSpec, f, "training")  # noqa: E731
    elif part == "gpu":
        fields, load = _gpu_fields(), lambda f: validate_spec(GpuSpec, f, "gpu")
    else:
        fields = data.draw(cluster_file_fields(max_nodes=3)) | {"inter_node_latency_us": 10.0}
        load = lambda f: cluster_from_mapping(f, "cluster")  # noqa: E731
    key = data.draw(st.sampled_from(_numeric_keys(fields)))
    with pytest.raises(SpecError) as info:
        load(fields | {key: bad})
    assert key in info.value.field and one_line(info.value)


@FAST
@given(token=st.sampled_from([".inf", "-.inf", ".nan", ".NaN", "1.0e+400", "1e400"]),
       key=st.sampled_from(["global_batch_size", "seq_length", "memory_headroom_bytes"]))  # fmt: skip
def test_non_finite_yaml_numbers_in_an_instance_file(
    token: str, key: str, tmp_path_factory: Any
) -> None:
    path = tmp_path_factory.mktemp("inst") / "inst.yaml"
    training = {"global_batch_size": "8", "seq_length": "256", "memory_headroom_bytes": "4.0e+9"}
    training[key] = token
    body = ", ".join(f"{k}: {v}" for k, v in training.items())
    path.write_text("{model: tiny-gpt, cluster: {generator: {kind: g1, nodes: 2, seed: 0}}, "
                    f"training: {{{body}}}}}")  # fmt: skip
    with pytest.raises(SpecError) as info:
        load_instance(path)
    assert info.value.field == f"training.{key}" and one_line(info.value)


OUT_OF_RANGE: list[tuple[str, Callable[[], object], str]] = [
    ("training.global_batch_size", lambda: validate_spec(
        TrainingSpec, {"global_batch_size": 10**30, "seq_length": 256}, "training"), "less"),
    ("training.seq_length", lambda: validate_spec(
        TrainingSpec, {"global_batch_size": 8, "seq_length": 2**40}, "training"), "less"),
    ("gpu.memory_bytes", lambda: validate_spec(GpuSpec, _gpu_fields() | {"memory_bytes": 1e300},
                                               "gpu"), "less"),
    ("gpu.peak_flops_per_s", lambda: validate_spec(
        GpuSpec, _gpu_fields() | {"peak_flops_per_s": 1e-300}, "gpu"), "greater"),
    ("cluster.node_bandwidth_gb_per_s[0][1]", lambda: cluster_from_mapping(
        {"gpu": "a100", "gpus_per_node": 2, "node_bandwidth_gb_per_s": [[None, 1e-300],
                                                                      [20, None]]}), "below"),
    ("cluster.nic_bandwidth_gb_per_s", lambda: cluster_from_mapping(
        {"gpu": "a100", "gpus_per_node": 2, "nic_bandwidth_gb_per_s": 1e300,
         "node_bandwidth_gb_per_s": [[None, 20], [20, None]]}), "above"),
    ("cluster.inter_node_latency_us", lambda: cluster_from_mapping(
        {"gpu": "a100", "gpus_per_node": 2, "inter_node_latency_us": 1e300,
         "node_bandwidth_gb_per_s": [[None, 20], [20, None]]}), "above"),
]  # fmt: skip


@pytest.mark.parametrize(("field", "load", "why"), OUT_OF_RANGE, ids=[r[0] for r in OUT_OF_RANGE])
def test_sizes_beyond_physical_bounds_are_refused(field: str, load: Callable[[], object],
                                                  why: str) -> None:  # fmt: skip
    with pytest.raises(SpecError) as info:
        load()
    assert info.value.field == field and why in one_line(info.value)


# ------------------------------------------------------------------ cut nccl-tests logs
_LOGS = {
    name: (NCCL / name).read_text()
    for name in ("pairwise/nccl_N2_G1_cnode2-001_cnode2-002.log",
                 "other/nccl_N2_G1_cnode3-002_cnode3-003.log")
}  # fmt: skip


@FAST
@given(st.sampled_from(sorted(_LOGS)), st.data(),
       st.sampled_from(["", "\n", "\nslurmstepd: error: *** JOB 7 CANCELLED ***\n"]))  # fmt: skip
def test_a_log_cut_anywhere_never_yields_a_misread_row(name: str, data: Any, tail: str) -> None:
    text = _LOGS[name]
    full = parse_nccl_tests_log(text)
    cut = text[: data.draw(st.integers(0, len(text)))] + tail
    part = parse_nccl_tests_log(cut, "cut.log")
    assert len(part) <= len(full)
    for got, whole in zip(part, full, strict=False):
        assert got.rows == whole.rows[: len(got.rows)], "a row was misread"
        if got.rows and whole.ok and not got.errors:
            assert got.ok and got.window_busbw() > 0  # a healthy pair stays healthy
        if not got.rows and got.truncated:
            assert "cut off" in (got.failure or "")


def test_a_table_in_mb_per_s_is_converted() -> None:
    text = _LOGS["pairwise/nccl_N2_G1_cnode2-001_cnode2-002.log"]
    gb, mb = parse_nccl_tests_log(text), parse_nccl_tests_log(text.replace("(GB/s)", "(MB/s)"))
    for a, b in zip(gb, mb, strict=True):
        for x, y in zip(a.rows, b.rows, strict=True):
            assert y.busbw_bytes_per_s == pytest.approx(x.busbw_bytes_per_s / 1000, rel=1e-12)
            assert y.algbw_bytes_per_s == pytest.approx(x.algbw_bytes_per_s / 1000, rel=1e-12)
        assert b.avg_busbw_bytes_per_s == pytest.approx((a.avg_busbw_bytes_per_s or 0) / 1000)
    for unit, said in (("(GB/s)", "line 11: bandwidth unit Gbps: expected one of"),
                       ("(us)", "line 11: time unit s: expected one of")):  # fmt: skip
        other = "(Gbps)" if unit == "(GB/s)" else "(s)"
        tests = parse_nccl_tests_log(text.replace(unit, other), "x")
        assert all(not t.rows for t in tests)  # no table read in a unit it does not know
        assert said in (tests[0].malformed or "")  # the first table's unit line
