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
]
