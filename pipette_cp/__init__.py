"""pipette_cp: memory-feasible, bandwidth-aware 3D-parallel layouts for LLM training."""

from pipette_cp.errors import (
    InfeasibleError,
    InputFileError,
    LayoutError,
    PipetteError,
    SolverError,
    SolverTimeoutError,
    SpecError,
    UnsupportedError,
)

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # `pipette_cp.solve` without importing the solvers at package import time.
    if name == "solve":
        from pipette_cp.api import solve

        return solve
    raise AttributeError(f"module 'pipette_cp' has no attribute {name!r}")


__all__ = [
    "InfeasibleError",
    "InputFileError",
    "LayoutError",
    "PipetteError",
    "SolverError",
    "SolverTimeoutError",
    "SpecError",
    "UnsupportedError",
    "__version__",
    "solve",
]
