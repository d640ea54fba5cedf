"""Progress bars on stderr: one rich task per phase of a search (``search.loop.Progress``),
or the benchmark suite's one bar over its jobs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from pipette_cp.cli.console import err_console

#: Label of every phase the search (and the robust search) reports.
PHASES = {
    "bounds": "bounding layouts",
    "score": "scoring",
    "sweep": "greedy sweep",
    "solve": "solving split + placement",
    "rerank": "re-ranking (simulator)",
    "robust": "scoring on every snapshot",
}


def progress_bar(disable: bool = False) -> Progress:
    """A transient bar on stderr: description, bar, done/total and elapsed time per task."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())  # fmt: skip
    return Progress(*columns, console=err_console, transient=True, disable=disable)


@contextmanager
def search_progress(disable: bool = False) -> Iterator[Callable[[str, int, int], None]]:
    """A ``progress(phase, done, total)`` callback drawing one bar per phase on stderr."""
    with progress_bar(disable) as bar:
        tasks: dict[str, TaskID] = {}

        def progress(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(PHASES.get(phase, phase), total=total)
            bar.update(tasks[phase], completed=done, total=total)

        yield progress
