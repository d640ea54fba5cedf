"""How much of the causal attention core a sliding-window model computes.

A sliding-window layer (Mistral, Gemma 2/3, gpt-oss; Megatron-Core ``--window-size``,
run by Transformer Engine's attention) lets query ``i`` attend to keys
``max(0, i - w + 1) .. i``: ``min(i + 1, w)`` keys instead of the causal ``i + 1``.
``ModelSpec.sliding_window_pattern`` ``n`` makes every ``n``-th layer (``n - 1, 2n - 1,
...``) a full one; without it every layer slides.

Two fractions of the full causal core, per layer averaged over the model's layers (a
pipeline chunk's layers are priced at the model's average; the total over the model
is exact):

- :func:`window_flops_fraction`: the (query, key) pairs computed, the model FLOPs;
- :func:`window_tile_fraction`: the ``128 x 128`` tiles a fused kernel runs (it skips
  tiles wholly outside the window and the causal triangle; FlashAttention-2 splits the
  score matrix into blocks of ``{64, 128} x {64, 128}``, Dao 2023, "FlashAttention-2",
  sec. 3.3), the kernel time relative to the full causal kernel's.

Both are 1 when ``s <= w`` and decrease towards ``w / s`` (pairs) and ``2 w / s``
(tiles, at ``w`` one tile wide: the diagonal tile and the one before it) as ``s`` grows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipette_cp.specs.model import ModelSpec

#: Side of the attention tiles a fused kernel computes (FlashAttention-2 sec. 3.3: blocks
#: of 64 or 128 rows and columns; 128 x 128 for head widths up to 128 on Hopper).
ATTENTION_TILE = 128


def windowed_layers(model: ModelSpec) -> int:
    """Layers that slide: all without ``sliding_window_pattern``, else all but every n-th."""
    if model.sliding_window is None:
        return 0
    n = model.sliding_window_pattern
    return model.num_layers - (model.num_layers // n if n else 0)


def causal_pairs(seq_length: int, window: int | None = None) -> int:
    """(query, key) pairs of causal attention over ``seq_length`` tokens, each query seeing
    at most ``window`` keys (itself included): ``sum_i min(i + 1, w)``."""
    s = seq_length
    w = s if window is None else min(window, s)
    return w * (w + 1) // 2 + (s - w) * w


def causal_tiles(seq_length: int, window: int | None = None, tile: int = ATTENTION_TILE) -> int:
    """Tiles of ``tile x tile`` a fused causal kernel computes: for the query tile ``i`` the
    key tiles from the one holding key ``max(0, i tile - w + 1)`` up to tile ``i``."""
    blocks = -(-seq_length // tile)
    if window is None or window >= seq_length:
        return blocks * (blocks + 1) // 2
    return sum(i - max(0, i * tile - window + 1) // tile + 1 for i in range(blocks))


def _fraction(model: ModelSpec, windowed: float) -> float:
    layers = windowed_layers(model)
    if not layers:
        return 1.0
    return (model.num_layers - layers + layers * windowed) / model.num_layers


def window_flops_fraction(model: ModelSpec, seq_length: int) -> float:
    """Fraction of the full causal attention core's FLOPs one layer computes (average)."""
    if model.sliding_window is None:
        return 1.0
    ratio = causal_pairs(seq_length, model.sliding_window) / causal_pairs(seq_length)
    return _fraction(model, ratio)


def window_tile_fraction(model: ModelSpec, seq_length: int) -> float:
    """Fraction of the full causal fused kernel's tiles one layer runs (average)."""
    if model.sliding_window is None:
        return 1.0
    ratio = causal_tiles(seq_length, model.sliding_window) / causal_tiles(seq_length)
    return _fraction(model, ratio)
