"""The consoles, the global settings and the start time of the command line.

It imports nothing of the CLI, so that every command module can print without
importing the application that registers it (``pipette_cp.cli.app``); the package
imports it first, so :data:`STARTED_AT` is when the command started.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

#: ``time.perf_counter()`` when the command line package was first imported:
#: ``--time-limit`` counts from here.
STARTED_AT = time.perf_counter()

from rich.console import Console  # noqa: E402  (after the clock: importing rich takes time)

#: Results (stdout).
console = Console()
#: Errors, warnings, progress bars and notes (stderr).
err_console = Console(stderr=True)


@dataclass
class Settings:
    """Global options of ``pipette-cp``, set by the root callback before a command runs."""

    debug: bool = False  # --debug: show tracebacks instead of one-line errors


settings = Settings()
