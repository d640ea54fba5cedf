"""One exception hierarchy for every user-facing failure.

Library code raises these; the CLI turns them into a single line and a
non-zero exit code.  ``assert`` is reserved for our own invariants.
"""

from __future__ import annotations

from typing import Any


class PipetteError(Exception):
    """Base class of every error pipette_cp raises on purpose."""

    exit_code = 1

    def __str__(self) -> str:
        # one line, whatever the input held: control characters (newlines too) escaped
        return _one_line(super().__str__())


class SpecError(PipetteError, ValueError):
    """A value in a spec, an instance file or a command-line option is invalid.

    The message always names the field, the value and what was expected, e.g.
    ``model.num_kv_heads=5: num_attention_heads=32 must be divisible by it``.
    """

    exit_code = 2

    def __init__(self, field: str, value: Any, expected: str) -> None:
        self.field = field
        self.value = value
        self.expected = expected
        super().__init__(f"{field}={_short(value)}: {expected}")

    def __reduce__(self) -> tuple[Any, ...]:  # rebuilt from its parts (worker processes)
        return type(self), (self.field, self.value, self.expected)


class UnsupportedError(SpecError):
    """A valid input that pipette_cp does not model (e.g. mixture-of-experts)."""


class LayoutError(SpecError):
    """A parallel layout that cannot exist for this model, cluster and batch."""


class InputFileError(PipetteError):
    """A file that is missing, unreadable or not in the expected format."""

    exit_code = 2

    def __init__(self, path: object, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.path, self.problem)


class InfeasibleError(PipetteError):
    """No plan satisfies the constraints (typically: nothing fits in memory)."""

    exit_code = 3


class SolverTimeoutError(PipetteError):
    """A solver hit its time limit without any feasible solution."""

    exit_code = 4


class SolverError(PipetteError):
    """A solver failed for a reason other than infeasibility or time."""

    exit_code = 5


def _one_line(text: str) -> str:
    """``text`` with every non-printable character written as its escape (``\\x1e``)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
