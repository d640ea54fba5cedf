"""Progress bars on stderr: one rich task per phase of a search (``search.loop.Progress``),
or the benchmark suite's one bar over its jobs.  When stderr is no terminal (piped, a
log file, a batch job), a search reports in plain lines instead: each phase as it starts
and ends, and each new best plan (:class:`LineProgress`)."""

from __future__ import annotations

import time
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
from pipette_cp.specs import Plan

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


class LineProgress:
    """Progress as plain lines on stderr, time-stamped from the start: a phase when it
    starts and when it ends, and each new best plan with its gap and the time left."""

    def __init__(self, deadline: float | None = None) -> None:
        self.start, self.deadline = time.perf_counter(), deadline
        self.started: set[str] = set()
        self.ended: set[str] = set()

    def _say(self, text: str) -> None:
        stamp = f"[{time.perf_counter() - self.start:6.1f} s]"
        err_console.print(f"{stamp} {text}", highlight=False, soft_wrap=True)

    def _left(self) -> str:
        if self.deadline is None:
            return ""
        return f", {max(self.deadline - time.perf_counter(), 0.0):.0f} s left"

    def progress(self, phase: str, done: int, total: int) -> None:
        """A phase's first report and its last (``done == total``) become lines."""
        label = PHASES.get(phase, phase)
        if phase not in self.started:
            self.started.add(phase)
            self._say(f"{label}: {total} to do{self._left()}")
        if done >= total and phase not in self.ended:
            self.ended.add(phase)
            self._say(f"{label}: done ({done}){self._left()}")

    def on_best(self, plan: Plan, gap: float | None) -> None:
        """A new best plan, its gap to the search's lower bound and the time left."""
        assert plan.evaluation is not None
        shown = "search gap unknown" if gap is None else f"search gap {100 * gap:.1f} %"
        self._say(f"best: {plan.layout()} {plan.evaluation.iteration_time_s:.4f} s "
                  f"({shown}){self._left()}")  # fmt: skip


@contextmanager
def search_progress(disable: bool = False) -> Iterator[Callable[[str, int, int], None]]:
    """A ``progress(phase, done, total)`` callback drawing one bar per phase on stderr
    (plain lines when stderr is no terminal)."""
    if not disable and not err_console.is_terminal:
        yield LineProgress().progress
        return
    with progress_bar(disable) as bar:
        tasks: dict[str, TaskID] = {}

        def progress(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(PHASES.get(phase, phase), total=total)
            bar.update(tasks[phase], completed=done, total=total)

        yield progress


@contextmanager
def solve_progress(
    deadline: float, disable: bool = False
) -> Iterator[tuple[Callable[[str, int, int], None], Callable[[Plan, float | None], None]]]:
    """``(progress, on_best)`` for a search ending by ``deadline`` (perf_counter time):
    a bar per phase, and a line with the best plan so far, its gap to the search's
    lower bound and the time left (plain lines when stderr is no terminal)."""
    if not disable and not err_console.is_terminal:
        lines = LineProgress(deadline)
        yield lines.progress, lines.on_best
        return
    with progress_bar(disable) as bar:
        tasks: dict[str, TaskID] = {}
        best = bar.add_task("best: none yet", total=None, visible=False)

        def left() -> str:
            return f"{max(deadline - time.perf_counter(), 0.0):.0f} s left"

        def progress(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(PHASES.get(phase, phase), total=total)
            bar.update(tasks[phase], completed=done, total=total)
            bar.update(best, description=bar.tasks[best].fields.get("line", "best: none yet")
                       + f", {left()}")  # fmt: skip

        def on_best(plan: Plan, gap: float | None) -> None:
            assert plan.evaluation is not None
            shown = "search gap unknown" if gap is None else f"search gap {100 * gap:.1f} %"
            line = f"best: {plan.layout()} {plan.evaluation.iteration_time_s:.4f} s ({shown})"
            bar.update(best, description=f"{line}, {left()}", line=line, visible=True)

        yield progress, on_best
