"""The layers that keep bf16 GEMMs under a quantised precision (Megatron
``--first-last-layers-bf16``: ``megatron/core/fp8_utils.py``'s ``get_fp8_context`` runs
global layers below ``num_layers_at_start_in_bf16`` and from ``num_layers -
num_layers_at_end_in_bf16`` on without the FP8 / FP4 context), by kind and virtual stage.

A kind is ``"dense"`` or ``"moe"`` for a transformer layer, or the hybrid symbol of a
hybrid model's sublayer; the costs price each bf16 layer as its kind's layer under a bf16
copy of the training (:func:`bf16_training`).
"""

from __future__ import annotations

import numpy as np

from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import TrainingSpec


def bf16_training(training: TrainingSpec) -> TrainingSpec:
    """``training`` with bf16 GEMMs (what a bf16 layer runs under)."""
    return training.model_copy(update={
        "precision": "bf16", "fp8_recipe": None, "fp8_format": None, "fp8_attention": False,
        "bf16_first_layers": 0, "bf16_last_layers": 0,
    })  # fmt: skip


def keeps_bf16_layers(training: TrainingSpec) -> bool:
    """Whether some layers keep bf16 GEMMs: a quantised precision and layers named."""
    quantised = training.precision in ("fp8", "fp4")
    return quantised and training.bf16_first_layers + training.bf16_last_layers > 0


def layer_kind(model: ModelSpec, layer: int) -> str:
    """The kind of global layer ``layer`` (the module docstring)."""
    if model.hybrid_pattern is not None:
        return model.hybrid_pattern[layer]
    return "moe" if model.is_moe_layer(layer) else "dense"


def bf16_layers_by_chunk(
    model: ModelSpec, training: TrainingSpec, plan: Plan
) -> dict[str, np.ndarray]:
    """The bf16 layers of each kind in every virtual stage ``c * pp + s`` (floats); empty
    without any (bf16 training, or none named)."""
    if not keeps_bf16_layers(training):
        return {}
    first, last = training.bf16_first_layers, training.bf16_last_layers
    layers = model.num_layers
    chosen = sorted(set(range(min(first, layers))) | set(range(max(layers - last, 0), layers)))
    ends = np.cumsum(plan.layer_split)
    out: dict[str, np.ndarray] = {}
    for layer in chosen:
        chunk = int(np.searchsorted(ends, layer, side="right"))
        if chunk >= len(ends):  # a split of fewer layers (a bound's probe)
            continue
        counts = out.setdefault(layer_kind(model, layer), np.zeros(len(plan.layer_split)))
        counts[chunk] += 1.0
    return out
