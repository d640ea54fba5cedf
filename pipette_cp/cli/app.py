"""The ``pipette-cp`` application: the root app, its global options, its error
handling, and the one place where every command and command group is registered.

Every :class:`~pipette_cp.errors.PipetteError` becomes one line on stderr and
the error's exit code; ``--debug`` shows the traceback instead.  SIGTERM and SIGHUP
stop a run as Ctrl-C does (:func:`interrupt_on_stop_signals`).
"""

from __future__ import annotations

import os
import signal
from typing import Annotated, Any

import typer
from rich.markup import escape
from typer.core import TyperGroup

from pipette_cp import __version__
from pipette_cp.cli import bench, explain, export, info, predict, profile, solve
from pipette_cp.cli.cluster import commands as cluster
from pipette_cp.cli.console import console, err_console, settings
from pipette_cp.errors import PipetteError


class _ErrorsAsOneLine(TyperGroup):
    """Turn library errors into a one-line message and an exit code."""

    def invoke(self, ctx: Any) -> Any:  # click.Context (typer may vendor click)
        try:
            return super().invoke(ctx)
        except PipetteError as exc:
            if settings.debug:
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
    settings.debug = debug


# The commands in the order `pipette-cp --help` lists them, then the command groups.
app.command()(export.export)
app.command()(export.plot)
app.command()(explain.explain)
app.command("list")(info.list_)
app.command()(info.show)
app.command()(info.schema)
app.command()(predict.predict)
app.command()(profile.profile)
app.command()(solve.solve)
app.add_typer(bench.bench_app, name="bench")
app.add_typer(cluster.cluster_app, name="cluster")


#: Signals that stop a run as Ctrl-C does (the search ends its workers and keeps the
#: best plan found): a scheduler's or a shell's termination, a closed terminal.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def interrupt_on_stop_signals() -> None:
    """Make :data:`STOP_SIGNALS` raise :class:`KeyboardInterrupt` in this process; a
    process forked from it (a worker) ends on them as by default."""
    main_pid = os.getpid()

    def stop(signum: int, frame: object) -> None:
        del frame
        if os.getpid() != main_pid:  # a forked worker: the default end
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for signum in STOP_SIGNALS:
        signal.signal(signum, stop)


def main() -> None:
    """Console-script entry point: SIGTERM and SIGHUP stop a run as Ctrl-C does."""
    interrupt_on_stop_signals()
    app()


__all__ = ["app", "console", "err_console", "main"]
