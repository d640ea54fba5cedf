"""The ``pipette-cp`` command line: a thin typer layer over the library."""

from pipette_cp.cli.console import STARTED_AT  # noqa: I001  (first: the clock starts here)
from pipette_cp.cli.app import app, main

__all__ = ["STARTED_AT", "app", "main"]
