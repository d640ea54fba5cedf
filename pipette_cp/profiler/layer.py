"""One transformer layer as one tensor-parallel rank computes it, in plain PyTorch.

Megatron-LM splits a layer over ``tp`` ranks (Shoeybi et al. 2019, sec. 3):
QKV and FC1 are column-parallel (each rank holds ``heads/tp`` query heads,
``kv_heads/tp`` key/value groups and ``ffn/tp`` MLP columns), the output
projection and FC2 are row-parallel (``[heads/tp x d, h]`` and ``[ffn/tp, h]``,
their biases replicated), the norms and the residual stream keep the full
hidden size.  :class:`RankLayer` is exactly that shard, so its parameter count
equals :func:`pipette_cp.cost.memory.peak.layer_params_per_gpu`.  It runs no
collective: the two all-reduces of each pass are what a single device cannot
measure (see :mod:`pipette_cp.profiler`).

Architecture options follow :class:`~pipette_cp.specs.model.ModelSpec`: GQA,
SwiGLU or GeLU MLP, RMSNorm or LayerNorm, linear biases, rotary embeddings
(``rope``; ``alibi`` and ``learned`` add nothing inside the layer here).
Attention is :func:`torch.nn.functional.scaled_dot_product_attention` with a
causal mask, which picks a FlashAttention kernel where one exists; with
``flash=False`` it is pinned to the math path.  Layout is ``[batch, seq,
hidden]`` (Megatron uses ``[seq, batch, hidden]``; same GEMMs).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.training import Recompute

#: Rotary base frequency (Su et al. 2021; Llama's default).
ROPE_BASE = 10_000.0


@dataclass(frozen=True)
class ShardShape:
    """Widths of one layer on one tensor-parallel rank."""

    hidden: int
    head_dim: int
    heads: int
    kv_heads: int
    ffn: int
    swiglu: bool
    rmsnorm: bool
    bias: bool
    rope: bool


def shard_problem(model: ModelSpec, tp: int) -> str | None:
    """Why ``model`` cannot be split over ``tp`` ranks as Megatron does, or None.

    Megatron-Core divides the query heads, the key/value groups and the MLP
    width by tp (``divide()`` asserts divisibility).

    >>> from pipette_cp.io.model_file import load_model
    >>> shard_problem(load_model("llama-2-7b"), 3)
    'tp=3 does not divide num_attention_heads=32'
    """
    for name, value in (
        ("num_attention_heads", model.num_attention_heads),
        ("num_kv_heads", model.kv_heads),
        ("ffn_hidden_size", model.ffn_hidden_size),
    ):
        if value % tp:
            return f"tp={tp} does not divide {name}={value}"
    return None


def shard_shape(model: ModelSpec, tp: int) -> ShardShape:
    """The widths one of ``tp`` ranks holds (``tp`` must pass :func:`shard_problem`)."""
    assert shard_problem(model, tp) is None, shard_problem(model, tp)
    return ShardShape(
        hidden=model.hidden_size,
        head_dim=model.head_size,
        heads=model.num_attention_heads // tp,
        kv_heads=model.kv_heads // tp,
        ffn=model.ffn_hidden_size // tp,
        swiglu=model.activation == "swiglu",
        rmsnorm=model.norm == "rmsnorm",
        bias=model.linear_bias,
        rope=model.position_embedding == "rope",
    )


class AttentionCore(torch.nn.Module):
    """Causal softmax attention of ``q [b, a, s, d]`` over ``k, v [b, g, s, d]``."""

    def __init__(self, dropout: float = 0.0, flash: bool = True) -> None:
        super().__init__()
        self.dropout, self.flash = dropout, flash

    def backend(self) -> AbstractContextManager[Any]:
        """The SDPA backend choice: default dispatch, or the math path only."""
        return nullcontext() if self.flash else sdpa_kernel(SDPBackend.MATH)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # Inside forward, so a recomputation under checkpoint picks the same backend.
        with self.backend():
            return F.scaled_dot_product_attention(
                q,
                k,
                v,
                dropout_p=self.dropout if self.training else 0.0,
                is_causal=True,
                enable_gqa=k.shape[1] != q.shape[1],
            )


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding in the rotate-half form (Su et al. 2021, eq. 34)."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


class RankLayer(torch.nn.Module):
    """One pre-norm transformer layer, the shard of one tensor-parallel rank.

    ``recompute``: ``"none"``; ``"selective"`` checkpoints the attention core
    (Korthikanti et al. 2022); ``"full"`` is applied by :meth:`step`, which
    checkpoints the whole layer, so its backward repeats the forward.
    """

    def __init__(
        self,
        shape: ShardShape,
        *,
        recompute: Recompute = "none",
        flash: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        h, d = shape.hidden, shape.head_dim
        self.shape, self.recompute, self.dropout = shape, recompute, dropout
        norm = torch.nn.RMSNorm if shape.rmsnorm else torch.nn.LayerNorm
        self.input_norm = norm(h)
        self.qkv = torch.nn.Linear(h, (shape.heads + 2 * shape.kv_heads) * d, bias=shape.bias)
        self.core = AttentionCore(dropout, flash)
        self.proj = torch.nn.Linear(shape.heads * d, h, bias=shape.bias)
        self.post_attention_norm = norm(h)
        width = (2 if shape.swiglu else 1) * shape.ffn
        self.fc1 = torch.nn.Linear(h, width, bias=shape.bias)
        self.fc2 = torch.nn.Linear(shape.ffn, h, bias=shape.bias)
        self._rope_cache: tuple[int, torch.Tensor, torch.Tensor] | None = None

    @property
    def flash(self) -> bool:
        return self.core.flash

    @flash.setter
    def flash(self, value: bool) -> None:
        self.core.flash = value

    def _rope(self, seq: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cache = self._rope_cache
        if cache is None or cache[0] != seq or cache[1].device != like.device:
            d = self.shape.head_dim
            inv = ROPE_BASE ** (-torch.arange(0, d, 2, device=like.device, dtype=torch.float32) / d)
            angles = torch.outer(torch.arange(seq, device=like.device, dtype=torch.float32), inv)
            angles = torch.cat((angles, angles), dim=-1)
            cache = self._rope_cache = (seq, angles.cos(), angles.sin())
        return cache[1].to(like.dtype), cache[2].to(like.dtype)

    def _attention(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        sh = self.shape
        q, k, v = self.qkv(x).split(
            [sh.heads * sh.head_dim, sh.kv_heads * sh.head_dim, sh.kv_heads * sh.head_dim], dim=-1
        )
        q = q.view(b, s, sh.heads, sh.head_dim).transpose(1, 2)
        k = k.view(b, s, sh.kv_heads, sh.head_dim).transpose(1, 2)
        v = v.view(b, s, sh.kv_heads, sh.head_dim).transpose(1, 2)
        if sh.rope:
            cos, sin = self._rope(s, q)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if self.recompute == "selective":
            context = checkpoint(self.core, q, k, v, use_reentrant=False)
        else:
            context = self.core(q, k, v)
        return self.proj(context.transpose(1, 2).reshape(b, s, sh.heads * sh.head_dim))

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        up = self.fc1(x)
        if self.shape.swiglu:
            gate, value = up.chunk(2, dim=-1)
            up = F.silu(gate) * value
        else:
            up = F.gelu(up)
        return self.fc2(up)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [batch, seq, hidden]`` to the same shape."""
        p = self.dropout if self.training else 0.0
        x = x + F.dropout(self._attention(self.input_norm(x)), p, self.training)
        return x + F.dropout(self._mlp(self.post_attention_norm(x)), p, self.training)

    def step(self, x: torch.Tensor) -> torch.Tensor:
        """The forward pass as training runs it: checkpointed under full recompute."""
        if self.recompute == "full":
            out: torch.Tensor = checkpoint(self, x, use_reentrant=False)
            return out
        return self(x)


def build_layer(
    model: ModelSpec,
    tp: int,
    *,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    dropout: float = 0.0,
    seed: int = 0,
) -> RankLayer:
    """A :class:`RankLayer` of ``model`` for one of ``tp`` ranks, in training mode."""
    torch.manual_seed(seed)
    with torch.device(device):  # allocated there (nothing at all on "meta")
        layer = RankLayer(shard_shape(model, tp), dropout=dropout)
    return layer.to(dtype=dtype).train()
