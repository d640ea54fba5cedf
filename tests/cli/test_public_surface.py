"""Pin the public surface: the published JSON schemas and the CLI's commands and options.

Changing either must be deliberate: regenerate with
``pipette-cp schema -o pipette_cp/schemas`` and
``python tests/cli/test_public_surface.py`` (rewrites the CLI pin).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import typer.main

from pipette_cp.cli import app
from pipette_cp.report.reference import schemas as file_schemas
from pipette_cp.specs import SCHEMA_SPECS
from tests.conftest import FIXTURES, ROOT

SCHEMAS = ROOT / "pipette_cp" / "schemas"
CLI_PIN = FIXTURES / "cli_surface.json"


def cli_surface() -> dict[str, list[str]]:
    """Every command path with its sorted option strings and argument names."""

    def walk(command: Any, prefix: str) -> dict[str, list[str]]:
        # typer >= 0.20 vendors click, so test for a group by its sub-commands.
        if hasattr(command, "commands"):
            found: dict[str, list[str]] = {}
            for name, sub in sorted(command.commands.items()):
                found.update(walk(sub, f"{prefix} {name}".strip()))
            return found
        opts = {o for p in command.params for o in [*p.opts, *getattr(p, "secondary_opts", [])]}
        return {prefix: sorted(opts)}

    return walk(typer.main.get_command(app), "")


@pytest.mark.parametrize("spec", SCHEMA_SPECS, ids=lambda s: s.__name__)
def test_published_schema_matches_the_code(spec: type) -> None:
    published = json.loads((SCHEMAS / f"{spec.__name__}.schema.json").read_text())
    assert published == spec.model_json_schema(), (
        "regenerate: pipette-cp schema --specs -o pipette_cp/schemas"
    )


@pytest.mark.parametrize("name", sorted(file_schemas()))
def test_published_file_schema_matches_the_code(name: str) -> None:
    published = json.loads((SCHEMAS / name).read_text())
    assert published == file_schemas()[name], "regenerate: pipette-cp schema -o pipette_cp/schemas"


def test_cli_surface_is_pinned() -> None:
    assert {"solve", "predict", "cluster import nccl-tests"} <= set(cli_surface())
    assert cli_surface() == json.loads(CLI_PIN.read_text()), "update the pin deliberately"


if __name__ == "__main__":
    CLI_PIN.write_text(json.dumps(cli_surface(), indent=1, sort_keys=True) + "\n")
