"""Measure one transformer layer with PyTorch and write a :class:`LayerProfile`.

``pipette-cp profile`` builds the shard of one layer that one tensor-parallel
rank computes (:mod:`pipette_cp.profiler.layer`), times its forward and backward
passes (:mod:`pipette_cp.profiler.timing`) for every requested (tp, micro-batch,
recompute, FlashAttention) combination (:mod:`pipette_cp.profiler.run`).

The measurement runs on ONE device without any collective, so the profile
holds compute only and says so (``includes_tp_comm: false``); the cost model
adds its analytic tensor-parallel communication to it.

PyTorch is an optional dependency (``pip install 'pipette-cp[profile]'``): this
package's ``__init__`` does not import it, the sub-modules do.
"""

from __future__ import annotations

from pipette_cp.errors import PipetteError

TORCH_MISSING = "pipette-cp profile needs PyTorch: pip install 'pipette-cp[profile]'"


class TorchMissingError(PipetteError):
    """PyTorch is not installed (the ``profile`` extra)."""

    exit_code = 2

    def __init__(self) -> None:
        super().__init__(TORCH_MISSING)


def require_torch() -> None:
    """Raise :class:`TorchMissingError` unless ``import torch`` works."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise TorchMissingError() from None


__all__ = ["TORCH_MISSING", "TorchMissingError", "require_torch"]
