"""The ``pipette-cp`` command line: a thin typer layer over the library."""

from pipette_cp.cli.app import app, main

__all__ = ["app", "main"]
