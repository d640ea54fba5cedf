"""Top-level typer application, global options and error handling.

Every :class:`~pipette_cp.errors.PipetteError` becomes one line on stderr and
the error's exit code; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from pipette_cp import __version__
from pipette_cp.errors import PipetteError

console = Console()
err_console = Console(stderr=True)
_state = {"debug": False}


class _ErrorsAsOneLine(TyperGroup):
    """Turn library errors into a one-line message and an exit code."""

    def invoke(self, ctx: Any) -> Any:  # click.Context (typer may vendor click)
        try:
            return super().invoke(ctx)
        except PipetteError as exc:
            if _state["debug"]:
                raise
            message = escape(str(exc))  # a literal "[profile]" is no markup tag
            err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None


app = typer.Typer(
    cls=_ErrorsAsOneLine,
    no_args_is_help=True,
    add_completion=False,
    help="Fastest memory-feasible 3D-parallel layouts for LLM training on measured clusters.",
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        console.print(f"pipette-cp {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show tracebacks instead of one-line errors.")
    ] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    _state["debug"] = debug


def main() -> None:
    """Console-script entry point."""
    app()


# Sub-commands register themselves on import (kept last to avoid cycles).
from pipette_cp.cli import bench as _bench  # noqa: E402
from pipette_cp.cli import cluster as _cluster  # noqa: E402
from pipette_cp.cli import explain as _explain  # noqa: E402
from pipette_cp.cli import export as _export  # noqa: E402
from pipette_cp.cli import info as _info  # noqa: E402
from pipette_cp.cli import predict as _predict  # noqa: E402
from pipette_cp.cli import profile as _profile  # noqa: E402, F401
from pipette_cp.cli import solve as _solve  # noqa: E402

__all__ = [
    "_bench",
    "_cluster",
    "_explain",
    "_export",
    "_info",
    "_predict",
    "_solve",
    "app",
    "console",
    "err_console",
    "main",
]
