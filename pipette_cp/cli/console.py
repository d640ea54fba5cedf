"""The consoles and the global settings of the command line.

It imports nothing of the CLI, so that every command module can print without
importing the application that registers it (``pipette_cp.cli.app``).
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console

#: Results (stdout).
console = Console()
#: Errors, warnings, progress bars and notes (stderr).
err_console = Console(stderr=True)


@dataclass
class Settings:
    """Global options of ``pipette-cp``, set by the root callback before a command runs."""

    debug: bool = False  # --debug: show tracebacks instead of one-line errors


settings = Settings()
