"""The ``pipette-cp`` application: the root app, its global options, its error
handling, and the one place where every command and command group is registered.

Every :class:`~pipette_cp.errors.PipetteError` becomes one line on stderr and
the error's exit code; ``--debug`` shows the traceback instead.  SIGTERM and SIGHUP
stop a run as Ctrl-C does, and a stopped run ends within :data:`STOP_GRACE_S`
(:func:`interrupt_on_stop_signals`).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time
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

#: Seconds a stopped command has to end on its own (print the best plan, end its
#: workers) before it is ended: its worker processes killed, then itself (exit 130).
STOP_GRACE_S = 4.0


def end_after(seconds: float) -> None:
    """Start a daemon thread that, ``seconds`` from now, kills this process's worker
    processes, flushes the output and ends the process with exit status 130.

    The deadline behind every stop: an interrupt raised at an unlucky point (while a
    lock of the process pool's is taken) can leave the pool's manager thread waiting
    forever, and the interpreter joins that thread on exit."""

    def end() -> None:
        time.sleep(seconds)
        for child in multiprocessing.active_children():
            child.kill()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed pipe: nothing more to say
                stream.flush()
        os._exit(130)

    threading.Thread(target=end, name="stop-deadline", daemon=True).start()


def interrupt_on_stop_signals() -> None:
    """Make :data:`STOP_SIGNALS` and SIGINT raise :class:`KeyboardInterrupt` in this
    process, with :data:`STOP_GRACE_S` to end before it is ended (:func:`end_after`);
    a process forked from it (a worker) ends on them as by default."""
    main_pid = os.getpid()
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        del frame
        if os.getpid() != main_pid:  # a forked worker: the default end
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if not stopping:
            stopping = True
            end_after(STOP_GRACE_S)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for signum in (*STOP_SIGNALS, signal.SIGINT):
        signal.signal(signum, stop)
    default_hook = sys.unraisablehook

    def raise_again(unraisable: Any) -> None:
        # a stop raised where Python cannot raise it (a fork handler, a finaliser) is
        # printed as "Exception ignored" and lost: raise it again in the main thread, once
        # this hook has returned (from here it would be raised inside the hook)
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and os.getpid() == main_pid:
            main = threading.main_thread().ident
            assert main is not None
            threading.Timer(0.01, signal.pthread_kill, (main, signal.SIGINT)).start()
            return
        default_hook(unraisable)

    sys.unraisablehook = raise_again


def main() -> None:
    """Console-script entry point: SIGTERM and SIGHUP stop a run as Ctrl-C does."""
    interrupt_on_stop_signals()
    app()


__all__ = ["app", "console", "err_console", "main"]
