"""Reference pages and JSON Schemas of the files users write, made from the code.

``python -m pipette_cp.report.reference DIR`` writes one Markdown page per file kind
(cluster, instance, model, plan, profile) and an index into ``DIR`` (the project keeps
them in ``docs/reference``); ``pipette-cp schema -o DIR`` writes the JSON Schemas.  Both
come from the same models: :mod:`pipette_cp.io.file_formats` (cluster and instance
files, whose key sets are the readers'), :class:`~pipette_cp.specs.ModelSpec`,
:class:`~pipette_cp.specs.LayerProfile` and the plan document
(:mod:`pipette_cp.report.plan_file`).  Every example on a page is read by the real
reader in the tests.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipette_cp.io.file_formats import ClusterFile, InstanceFile
from pipette_cp.report.plan_file import plan_file_schema
from pipette_cp.report.reference_examples import examples
from pipette_cp.specs import LayerProfile, ModelSpec


@dataclass(frozen=True)
class FileKind:
    """One kind of file: its page's title, what it is, its schema, where it is used."""

    name: str
    title: str
    used_by: str
    schema: Callable[[], dict[str, Any]]
    #: sections described on another page instead: $defs name -> page name
    elsewhere: tuple[tuple[str, str], ...] = ()


FILE_KINDS: tuple[FileKind, ...] = (
    FileKind("cluster", "Cluster file", "`solve --cluster FILE`, an instance's `cluster:`, "
             "written by `cluster generate` and `cluster import`", ClusterFile.model_json_schema),
    FileKind("instance", "Instance file", "`solve FILE`, `predict FILE`, `show FILE`; the "
             "bundled ones are in `instances/`", InstanceFile.model_json_schema,
             (("ModelSpec", "model"), ("InlineCluster", "cluster"))),
    FileKind("model", "Model file", "`solve --model FILE`, an instance's `model:`; the "
             "bundled ones are in `models/`", ModelSpec.model_json_schema),
    FileKind("plan", "Plan file", "written by `solve -o PLAN.json` (and printed by `solve "
             "--json` and `predict --json`); read by `export`, `plot`, `explain`, `predict "
             "--placement`", plan_file_schema),
    FileKind("profile", "Layer profile", "written by `pipette-cp profile`; an instance's "
             "`profile:` or `solve --profile FILE`", LayerProfile.model_json_schema),
)  # fmt: skip

_HEADER = "<!-- Made by `python -m pipette_cp.report.reference docs/reference`: do not edit. -->"
_UNITS = ("Units are in the key names: `_gb_per_s` GB/s (1e9 bytes/s), `_gb` GB (1e9 "
          "bytes), `_bytes` bytes, `_s` seconds, `_us` microseconds, `_fraction` 0-1.")  # fmt: skip


def _ref(schema: dict[str, Any]) -> str:
    return str(schema["$ref"]).rsplit("/", 1)[-1]


def type_text(schema: dict[str, Any], links: dict[str, str]) -> str:
    """A JSON Schema type in words: ``integer``, ``list of number``, ``A or B``."""
    if "$ref" in schema:
        name = _ref(schema)
        return links.get(name, f"[{name}](#{name.lower()})")
    if "anyOf" in schema:
        parts = [type_text(s, links) for s in schema["anyOf"] if s.get("type") != "null"]
        return " or ".join(dict.fromkeys(parts))
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    if "enum" in schema:
        return " | ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        if "prefixItems" in schema:
            return "list of " + ", ".join(type_text(s, links) for s in schema["prefixItems"])
        return "list of " + type_text(schema.get("items", {}), links)
    if kind == "object":
        values = schema.get("additionalProperties")
        return "mapping" + (f" to {type_text(values, links)}" if isinstance(values, dict) else "")
    return str(kind or "any")


def _default(name: str, prop: dict[str, Any], required: set[str]) -> str:
    if name in required:
        return "required"
    if "default" not in prop or prop["default"] is None:
        return "—"
    return f"`{json.dumps(prop['default'])}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("``", "`").replace("|", "\\|")


def fields_table(schema: dict[str, Any], links: dict[str, str]) -> list[str]:
    """A Markdown table of an object schema's keys."""
    required = set(schema.get("required", ()))
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for name, prop in schema.get("properties", {}).items():
        lines.append(f"| `{name}` | {_cell(type_text(prop, links))} | "
                     f"{_default(name, prop, required)} | "
                     f"{_cell(prop.get('description', ''))} |")  # fmt: skip
    return lines


def _reachable(schema: dict[str, Any], defs: dict[str, Any], skip: set[str]) -> list[str]:
    """The $defs reachable from ``schema``, in the order first met (``skip``: not entered)."""
    order: list[str] = []
    todo: list[Any] = [schema.get("properties", {})]
    while todo:
        node = todo.pop(0)
        if isinstance(node, dict):
            if "$ref" in node:
                name = _ref(node)
                if name not in order and name not in skip:
                    order.append(name)
                    todo.append(defs[name].get("properties", {}))
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return order


def page(kind: FileKind) -> str:
    """The reference page of ``kind``, Markdown."""
    schema = kind.schema()
    defs = schema.get("$defs", {})
    links = {name: f"[{name}]({other}.md)" for name, other in kind.elsewhere}
    lines = [_HEADER, "", f"# {kind.title}", "", _cell(schema.get("description", "")), "",
             f"Used by: {kind.used_by}.", "", _UNITS, ""]  # fmt: skip
    for title, language, text in examples(kind.name):
        lines += [f"**{title}**", "", f"```{language}", text.rstrip("\n"), "```", ""]
    lines += ["## Keys", "", *fields_table(schema, links), ""]
    for name in _reachable(schema, defs, set(links)):
        sub = defs[name]
        lines += [f"### {name}", ""]
        if sub.get("description"):
            lines += [_cell(sub["description"]), ""]
        lines += [*fields_table(sub, links), ""] if "properties" in sub else []
    return "\n".join(lines).rstrip("\n") + "\n"


def index_page() -> str:
    """The index of the reference pages."""
    lines = [_HEADER, "", "# File reference", "",
             "Every file the tool reads or writes, one page each, made from the code that "
             "reads it (`pipette-cp schema -o DIR` writes the same as JSON Schemas).", ""]  # fmt: skip
    lines += [f"- [{k.title}]({k.name}.md): {k.used_by}." for k in FILE_KINDS]
    return "\n".join(lines) + "\n"


def pages() -> dict[str, str]:
    """File name -> text of every reference page."""
    return {"README.md": index_page(), **{f"{k.name}.md": page(k) for k in FILE_KINDS}}


def schemas() -> dict[str, dict[str, Any]]:
    """File name -> JSON Schema of every file kind."""
    out = {}
    for kind in FILE_KINDS:
        schema = kind.schema()
        schema["$id"] = f"pipette-cp/{kind.name}.schema.json"
        out[f"{kind.name}.schema.json"] = schema
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m pipette_cp.report.reference DIR", file=sys.stderr)
        return 2
    folder = Path(args[0])
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in pages().items():
        (folder / name).write_text(text, encoding="utf-8")
        print(f"wrote {folder / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
