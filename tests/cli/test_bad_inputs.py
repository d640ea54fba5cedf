"""The bad-input catalogue ``docs/bad-inputs.md``, row by row.

Every row of its tables names a rejected input, optionally a file to write
(name and content), a command (``pipette-cp ...``) or a Python call, the exact
message and the exit code.  Each row runs here, so the catalogue cannot drift from
the code.  Conventions (also stated in the document): ``$FILE`` is the row's file,
``$DIR`` a fresh directory, ``$INSTANCES`` the bundled instances folder; ``\\n``,
``\\t`` and ``\\xNN`` in a file content are a newline, a tab and a byte; a message
ending in `` …`` is matched as a prefix (it goes on with a list that grows as the
project does); a command's message is its one ``error:`` line.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipette_cp.cli import app
from pipette_cp.clusters.generators.fat_tree import fat_tree, fat_tree_cluster
from pipette_cp.clusters.generators.registry import generate
from pipette_cp.errors import PipetteError
from pipette_cp.io.cluster_file import cluster_from_mapping, read_cluster_file
from pipette_cp.io.instance_file import load_instance
from pipette_cp.io.matrix_files import read_matrix_csv, read_pipette_json
from pipette_cp.io.measurements.mpigraph import read_mpigraph
from pipette_cp.io.model_file import load_model
from pipette_cp.io.paths import INSTANCES_DIR
from pipette_cp.specs import (
    ClusterSpec,
    ModelSpec,
    SearchSpace,
    TrainingSpec,
    resolve_gpu,
    validate_spec,
)
from pipette_cp.specs.hierarchy import HierarchicalFabric
from tests.conftest import ROOT

ROOT = ROOT
CATALOGUE = ROOT / "docs" / "bad-inputs.md"
HEADER = ("#", "rejected input", "file", "file content", "command or Python call", "message",
          "exit")  # fmt: skip
#: What a Python call in the catalogue may use.
NAMESPACE = {
    "validate_spec": validate_spec, "ModelSpec": ModelSpec, "TrainingSpec": TrainingSpec,
    "SearchSpace": SearchSpace, "resolve_gpu": resolve_gpu, "load_model": load_model,
    "load_instance": load_instance, "cluster_from_mapping": cluster_from_mapping,
    "read_cluster_file": read_cluster_file, "read_matrix_csv": read_matrix_csv,
    "read_pipette_json": read_pipette_json, "read_mpigraph": read_mpigraph,
    "generate": generate, "float": float, "math": math,
    "HierarchicalFabric": HierarchicalFabric, "fat_tree": fat_tree,
    "fat_tree_cluster": fat_tree_cluster, "ClusterSpec": ClusterSpec,
}  # fmt: skip
ELLIPSIS = " …"


@dataclass(frozen=True)
class Row:
    """One catalogue row (cells without their code backticks, ``\\|`` unescaped)."""

    number: str
    what: str
    file: str
    content: str
    call: str
    message: str
    exit_code: int


def _cells(line: str) -> list[str]:
    inner = line.strip().removeprefix("|").removesuffix("|")
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", inner)]


def _code(cell: str) -> str:
    """A cell without its code-span delimiters (`` `x` `` or ``` `` x `` ```)."""
    for tick in ("``", "`"):
        if len(cell) >= 2 * len(tick) and cell.startswith(tick) and cell.endswith(tick):
            body = cell[len(tick) : -len(tick)]
            return body[1:-1] if tick == "``" and body.startswith(" ") else body
    return cell


def parse_catalogue(text: str) -> list[Row]:
    """Every row of every table whose header is :data:`HEADER`."""
    rows: list[Row] = []
    in_table = False
    for line in text.splitlines():
        if not line.lstrip().startswith("|"):
            in_table = False
            continue
        cells = _cells(line)
        if tuple(cells) == HEADER:
            in_table = True
        elif in_table and not set("".join(cells)) <= set("-: "):
            assert len(cells) == len(HEADER), line
            number, what, file, content, call, message, code = cells
            rows.append(Row(number, what, _code(file), _code(content), _code(call),
                            _code(message), int(code)))  # fmt: skip
    return rows


def _file_bytes(content: str) -> bytes:
    r"""``\n``, ``\t`` and ``\xNN`` escapes decoded; everything else as written (UTF-8)."""
    return content.encode("utf-8").decode("unicode_escape").encode("latin-1")


def run_row(row: Row, tmp: Path) -> tuple[int, str]:
    """Exit code and message of ``row`` (placeholders filled for the directory ``tmp``)."""
    path = tmp / row.file if row.file else tmp / "unused"
    if row.file:
        path.write_bytes(_file_bytes(row.content))
    call = fill(row.call, path, tmp)
    if call.startswith("pipette-cp "):
        result = CliRunner().invoke(app, shlex.split(call)[1:])
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert "Traceback" not in result.output, result.output
        assert len(lines) == 1 and lines[0].startswith("error: "), (result.output, result.exception)
        return result.exit_code, lines[0].removeprefix("error: ")
    try:
        eval(call, dict(NAMESPACE))  # the catalogue's own calls, nothing from outside
    except PipetteError as exc:
        return exc.exit_code, str(exc)
    raise AssertionError(f"{call} was accepted")


def fill(text: str, path: Path, tmp: Path) -> str:
    for key, value in (("$FILE", path), ("$DIR", tmp), ("$INSTANCES", INSTANCES_DIR)):
        text = text.replace(key, str(value))
    return text


ROWS = parse_catalogue(CATALOGUE.read_text(encoding="utf-8"))


@pytest.mark.parametrize("row", ROWS, ids=[f"{r.number}-{r.what}" for r in ROWS])
def test_catalogue_row(row: Row, short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tmp_path = short_tmp
    monkeypatch.chdir(ROOT)  # rows may name files of the repository (tests/fixtures/...)
    code, message = run_row(row, tmp_path)
    expected = fill(row.message, tmp_path / row.file, tmp_path)
    assert "\n" not in message and message.strip()
    if expected.endswith(ELLIPSIS):
        assert message.startswith(expected.removesuffix(ELLIPSIS)), message
    else:
        assert message == expected
    assert code == row.exit_code, (code, message)


def test_catalogue_is_complete_and_numbered() -> None:
    """Rows numbered 1, 2, ...; every section of the catalogue present; both entry points."""
    assert [r.number for r in ROWS] == [str(i) for i in range(1, len(ROWS) + 1)]
    prefixes = {r.what.split(":")[0] for r in ROWS}
    for needed in ("model", "cluster", "training", "search space", "instance", "predict",
                   "solve", "plan"):  # fmt: skip
        assert needed in prefixes, needed
    assert any(r.call.startswith("pipette-cp ") for r in ROWS)
    assert any(not r.call.startswith("pipette-cp ") for r in ROWS)
    assert {r.exit_code for r in ROWS} == {2, 3}


def test_readme_links_the_catalogue() -> None:
    assert "docs/bad-inputs.md" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_parser_reads_escapes_and_code_spans() -> None:
    text = "\n".join(
        ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER),
         r"| 1 | x | `a.csv` | `a\|b\nc` | `pipette-cp show $FILE` | `` it's `x` `` | 2 |"]
    )  # fmt: skip
    (row,) = parse_catalogue(text)
    assert row.content == r"a|b\nc" and _file_bytes(row.content) == b"a|b\nc"
    assert row.message == "it's `x`" and row.exit_code == 2 and row.file == "a.csv"
