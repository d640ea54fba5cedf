"""``pipette-cp bench [INSTANCES...] | bench report | bench update-best-known``.

``pipette-cp bench X Y --methods ...`` is short for ``pipette-cp bench run X Y ...``.
The group is :data:`bench_app`; :mod:`pipette_cp.cli.app` mounts it as ``bench``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from pipette_cp import __version__
from pipette_cp.cli.console import console, err_console
from pipette_cp.cli.options import RayAddressOption
from pipette_cp.cli.progress import progress_bar
from pipette_cp.errors import PipetteError, SpecError
from pipette_cp.io.instance_file import bundled_instance_file, load_best_known, write_best_known
from pipette_cp.io.output_paths import check_output_dir, output_error
from pipette_cp.specs import BestKnown
from pipette_cp.suite import (
    DEFAULT_DB,
    DEFAULT_METHODS,
    EXECUTORS,
    BenchRow,
    BenchStore,
    best_known_updates,
    build_report,
    make_executor,
    prepare_jobs,
    run_bench,
    to_csv,
    to_markdown,
)
from pipette_cp.suite.variants import Sweep


class _RunByDefault(TyperGroup):
    """A group whose first argument, when not a sub-command, belongs to ``run``."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("--help", "-h")):
            args = ["run", *args]
        return super().parse_args(ctx, args)


bench_app = typer.Typer(
    cls=_RunByDefault,
    help="Benchmark every method on every instance; report and compare.",
)

_DB = typer.Option("--db", help="SQLite store of the results.")


def _list(option: str, text: str, kind: type) -> list[Any]:
    """The comma-separated values of ``option``; a value given twice is refused (it would
    run, or sweep, the same jobs twice)."""
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecError(option, text, f"expected comma-separated {kind.__name__} values") from None
    twice = next((v for i, v in enumerate(values) if v in values[:i]), None)
    if twice is not None:
        raise SpecError(option, text, f"{twice} is given twice")
    return values


def _sweep(nodes: str | None, model: str | None, batch: str | None, seq: str | None) -> Sweep:
    """The what-if options as one :class:`Sweep` (each value checked, one line each)."""

    def counts(option: str, text: str | None) -> list[int]:
        values = [] if text is None else _list(option, text, int)
        if text is not None and not values:
            raise SpecError(option, text, "expected comma-separated positive integers")
        for value in values:
            if value < 1:
                raise SpecError(option, value, "expected a positive integer")
        return values

    models = [] if model is None else [m.strip() for m in model.split(",") if m.strip()]
    if model is not None and not models:
        raise SpecError("--model", model, "expected comma-separated model names or files")
    return Sweep(
        nodes=counts("--nodes", nodes),
        model=models,
        global_batch=counts("--global-batch", batch),
        seq_length=counts("--seq-length", seq),
    )


def _what_if(flag: str, what: str) -> Any:
    return typer.Option(flag, help=f"Comma-separated {what}.", rich_help_panel="What-if variants")


@bench_app.command("run")
def run_cmd(
    instances: Annotated[
        list[str] | None,
        typer.Argument(help="Instance names or files (default: every bundled instance)."),
    ] = None,
    methods: Annotated[str, typer.Option("--methods", help="Comma-separated methods.")] = ",".join(
        DEFAULT_METHODS
    ),
    time_limit: Annotated[
        str | None,
        typer.Option(
            "--time-limit",
            help="Budget per job, s; comma-separated for several (default: the instance's).",
        ),
    ] = None,
    seeds: Annotated[str, typer.Option("--seeds", help="Comma-separated seeds.")] = "0",
    db: Annotated[Path, _DB] = Path(DEFAULT_DB),
    jobs: Annotated[int, typer.Option("--jobs", help="Jobs run in parallel.")] = 1,
    executor: Annotated[
        str, typer.Option("--executor", help=f"Where jobs run: {' | '.join(EXECUTORS)}.")
    ] = "local",
    ray_address: RayAddressOption = None,
    nodes: Annotated[
        str | None, _what_if("--nodes", "node counts (generated clusters are generated again)")
    ] = None,
    model: Annotated[
        str | None, _what_if("--model", "bundled model names or model files (as solve --model)")
    ] = None,
    global_batch: Annotated[
        str | None, _what_if("--global-batch", "global batch sizes, sequences")
    ] = None,
    seq_length: Annotated[str | None, _what_if("--seq-length", "sequence lengths, tokens")] = None,
) -> None:
    """Run every method on every instance; finished rows are skipped (resumable).

    What-if variants: with --nodes, --model, --global-batch or --seq-length, each
    instance is replaced by one variant per combination of the values, an instance of
    its own named like gpt3-1.3b-g5-16+nodes=4+global_batch=1024.
    """
    limits = [None] if time_limit is None else _list("--time-limit", time_limit, float)
    sweep = _sweep(nodes, model, global_batch, seq_length)
    planned = prepare_jobs(
        instances or (),
        _list("--methods", methods, str),
        _list("--seeds", seeds, int),
        limits,
        sweep,
    )
    runner = make_executor(executor, jobs, ray_address)
    with BenchStore(db) as store, progress_bar() as bar:
        done = store.finished()
        todo = sum(job.key not in done for job in planned.jobs)
        task = bar.add_task(f"{todo} jobs", total=todo)

        def on_result(row: BenchRow, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total,
                       description=f"{row.instance} {row.method}: {row.status}")  # fmt: skip

        summary = run_bench(planned, store, runner, on_result)
    console.print(
        f"{summary.total} jobs: {len(summary.rows)} run, {summary.skipped} already in {db}",
        highlight=False,
    )
    for row in summary.failed:
        err_console.print(
            f"[yellow]warning:[/] {row.instance} {row.method}: {row.status}: {row.message}",
            highlight=False,
            soft_wrap=True,
        )
    for flag in summary.flags:
        err_console.print(f"[yellow]warning:[/] {flag.message()}", highlight=False, soft_wrap=True)
    if summary.without_best_known:
        console.print(
            f"{len(summary.without_best_known)} instance(s) without best_known; "
            f"`pipette-cp bench update-best-known --db {db}` writes them",
            highlight=False,
        )


def _owned(name: str) -> Path:
    """The bundled instance file ``name`` stands for, or a one-line SpecError."""
    try:
        return bundled_instance_file(name)
    except SpecError as exc:
        raise SpecError(
            "instance",
            name,
            f"{exc.expected}; update-best-known writes only bundled instance "
            "files (edit best_known: of other files by hand)",
        ) from None


def _best_known(names: set[str]) -> dict[str, BestKnown | None]:
    """``best_known`` of each instance whose file can still be read (others: no flags)."""
    found: dict[str, BestKnown | None] = {}
    for name in sorted(names):
        try:
            found[name] = load_best_known(name)
        except PipetteError:
            continue
    return found


@bench_app.command("report")
def report_cmd(
    db: Annotated[Path, _DB] = Path(DEFAULT_DB),
    fmt: Annotated[str, typer.Option("--format", help="markdown | csv.")] = "markdown",
    plots: Annotated[
        Path | None, typer.Option("--plots", help="Directory to write comparison plots into.")
    ] = None,
    time_limit: Annotated[
        float | None,
        typer.Option("--time-limit", help="Report this time limit (default: the largest)."),
    ] = None,
) -> None:
    """Per-instance iteration times, speed-ups of the solvers, geometric means, flags."""
    if fmt not in ("markdown", "csv"):
        raise SpecError("--format", fmt, "expected markdown or csv")
    check_output_dir(plots, "--plots")
    with BenchStore(db, readonly=True) as store:  # a report never writes the store
        rows = store.rows()
    report = build_report(rows, _best_known({r.instance for r in rows}), time_limit)
    typer.echo(to_markdown(report) if fmt == "markdown" else to_csv(report), nl=False)
    if plots is not None:
        from pipette_cp.suite.plots import write_plots  # matplotlib only when asked

        try:
            written, skipped = write_plots(report, rows, plots)
        except OSError as exc:
            raise output_error("--plots", plots, exc) from None
        for path in written:
            err_console.print(f"wrote {path}", highlight=False)
        for line in skipped:
            err_console.print(line, highlight=False)


@bench_app.command("update-best-known")
def update_best_known_cmd(db: Annotated[Path, _DB] = Path(DEFAULT_DB)) -> None:
    """Write the best fitting plan of this version into each instance file it beats.

    Only bundled instance files (instance files inside the instances directory) are
    written: if a row to apply names any other file, nothing is written.
    """
    with BenchStore(db, readonly=True) as store:
        rows = store.rows()
    current = _best_known({r.instance for r in rows})
    readable = [r for r in rows if r.instance in current]
    updates = best_known_updates(readable, current, __version__)
    targets = {name: _owned(name) for name in updates}  # all checked before any is written
    for name, best in updates.items():
        path = write_best_known(targets[name], best)
        console.print(
            f"{path}: best_known {best.iteration_time_s:.6g} s by {best.method} ({best.layout})",
            highlight=False,
        )
    if not updates:
        console.print(f"no row of version {__version__} beats a best_known", highlight=False)
