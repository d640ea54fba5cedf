"""What one sublayer of a hybrid Mamba-Transformer model computes and moves on one GPU.

The counterpart of :func:`pipette_cp.cost.compute.layer_work.layer_work` for the symbols
of a hybrid pattern (:mod:`pipette_cp.cost.workload.hybrid`), timed by the same
:func:`pipette_cp.cost.compute.model_chunks.layer_times`.  Each sublayer has one pre-norm
and one bias-dropout-add; with sequence parallelism (tp > 1) it all-gathers its input
and reduce-scatters its output (2 TP collectives), as Megatron-Core's ``MambaLayer``
and ``TransformerLayer`` with one sublayer do; the mixture-of-experts MLP alone only
around its shared experts.

:func:`check_hybrid_plan` refuses what the hybrid model is not priced under (context
parallelism, activation offloading, LoRA, layer profiles, a
framework without Megatron-Core's Mamba layers) and Megatron-Core's own rule that tp
divides the Mamba heads and groups.
"""

from __future__ import annotations

from pipette_cp.cost.compute.layer_work import (
    ATTENTION_GEMMS,
    LayerWork,
    attention_gemms,
    layer_work,
    moe_mlp_cast_elements,
)
from pipette_cp.cost.stack.kernels import (
    activation_bytes,
    cast_bytes_per_element,
    keeps_quantized_tensors,
    norm_bytes,
)
from pipette_cp.cost.workload.flops import (
    fc1_factor,
    layer_gemms,
    mamba_elementwise_elements,
    mamba_projection_gemms,
    ssd_gemms,
)
from pipette_cp.cost.workload.latent_attention import attention_cast_elements, rope_elements
from pipette_cp.errors import LayoutError
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import TrainingSpec

#: HBM bytes per element of the Mamba mixer's element-wise kernels, forward: the causal
#: convolution with its SiLU reads and writes ``x, B, C`` (2 + 2 B); the gated RMSNorm
#: reads ``y`` and ``z`` and writes its output (2 + 2 + 2 B) (assumption: bf16, fused).
CONV_BYTES = 4.0
GATED_NORM_BYTES = 6.0
#: The frameworks that build Megatron-Core's hybrid (Mamba) models.
HYBRID_FRAMEWORKS = ("megatron-core", "megatron-lm", "megatron-bridge", "nemo")


def check_hybrid_plan(model: ModelSpec, training: TrainingSpec, plan: Plan) -> None:
    """Raise :class:`LayoutError` for what a hybrid model is not priced under (module
    docstring); nothing for a model without a hybrid pattern."""
    if not model.is_hybrid:
        return
    why = "is not modelled for hybrid Mamba models"
    if plan.cp > 1:
        raise LayoutError("plan.cp", plan.cp, f"context parallelism over Mamba layers {why}")
    if plan.offload_modules:
        raise LayoutError("plan.offload_modules", ",".join(plan.offload_modules),
                          f"activation offloading {why}")  # fmt: skip
    if training.lora is not None:
        raise LayoutError("training.lora", training.lora.rank, f"LoRA {why}")
    if training.framework.name not in HYBRID_FRAMEWORKS:
        raise LayoutError("training.framework", training.framework.name, "hybrid Mamba "
                          f"models run in {', '.join(HYBRID_FRAMEWORKS)} (Megatron-Core's "
                          "MambaModel)")  # fmt: skip
    if "M" in (model.hybrid_pattern or ""):
        heads, groups = model.mamba_num_heads or 0, model.mamba_num_groups
        if heads % plan.tp or groups % plan.tp:
            raise LayoutError("plan.tp", plan.tp, f"tp={plan.tp} must divide mamba_num_heads="
                              f"{heads} and mamba_num_groups={groups} (Megatron-Core's "
                              "MambaMixer)")  # fmt: skip


def _sublayer_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan, tokens: int) -> float:
    """The pre-norm and the bias-dropout-add of one sublayer (as in a dense layer)."""
    drop = 1.0 if training.dropout else 0.0
    rows = tokens * model.hidden_size / (plan.tp if plan.sequence_parallel else 1)
    return rows * (norm_bytes(model, training, plan) + 6.0 + drop)


def hybrid_work(model: ModelSpec, training: TrainingSpec, plan: Plan, symbol: str) -> LayerWork:
    """One sublayer's work per micro-batch on one GPU (the busiest of an expert group for
    ``E``), without the attention core (timed by ``layer_times`` when ``attention``)."""
    s, b, t = training.seq_length, plan.micro_batch_size, plan.tp
    tokens = s * b // plan.cp
    sublayer = _sublayer_bytes(model, training, plan, tokens)
    if symbol == "*":
        rope = 4.0 * rope_elements(model, tokens, t) if model.position_embedding == "rope" else 0.0
        return LayerWork(attention_gemms(model, training, plan), None, sublayer + rope, 2, 0.0)
    if symbol == "-":
        gemms = layer_gemms(model, s, b, t, plan.cp, plan.sequence_parallel)
        mlp = tuple(g for g in gemms if g.name in ("fc1", "fc2"))
        act = tokens * model.ffn_hidden_size / t * activation_bytes(model, training)
        return LayerWork(mlp, None, sublayer + act, 2, 0.0, act, attention=False)
    if symbol == "E":
        moe = layer_work(model, training, plan, moe=True)
        return LayerWork(
            gemms=tuple(g for g in moe.gemms if g.name not in ATTENTION_GEMMS),
            router=moe.router,
            elementwise_bytes=sublayer + moe.mlp_elementwise_bytes,
            activation_collectives=moe.activation_collectives - 2,
            expert_collective_bytes=moe.expert_collective_bytes,
            mlp_elementwise_bytes=moe.mlp_elementwise_bytes,
            attention=False,
        )
    conv, inner = mamba_elementwise_elements(model, tokens, t)
    return LayerWork(
        gemms=mamba_projection_gemms(model, tokens, t),
        router=None,
        elementwise_bytes=sublayer + CONV_BYTES * conv + GATED_NORM_BYTES * inner,
        activation_collectives=2,
        expert_collective_bytes=0.0,
        attention=False,
        scan_gemms=ssd_gemms(model, s, b, t),
    )


def hybrid_cast_bytes(
    model: ModelSpec, training: TrainingSpec, plan: Plan, symbol: str
) -> tuple[float, float]:
    """HBM bytes of one sublayer's casts to FP8 / NVFP4, (forward, backward), counted as
    :func:`pipette_cp.cost.stack.kernels.quantization_cast_bytes` counts a dense layer's:
    each quantised GEMM's input in forward (before the sequence-parallel all-gather), its
    output gradient in backward, and without kept quantised weights every weight each
    way.  The router and the SSD scan stay bf16."""
    tokens = training.seq_length * plan.micro_batch_size // plan.cp
    h, t = model.hidden_size, plan.tp
    hidden = h / t if plan.sequence_parallel else float(h)
    n1 = fc1_factor(model)
    if symbol == "*":
        forward, backward, weights = attention_cast_elements(model, tokens, plan)
    elif symbol == "-":
        f = model.ffn_hidden_size
        forward, backward = tokens * (hidden + f / t), tokens * (n1 * f / t + hidden)
        weights = (n1 + 1) * f * h / t
    elif symbol == "E":
        forward, backward, weights = moe_mlp_cast_elements(model, training, plan)
    else:
        inner, width = model.mamba_inner, model.mamba_in_proj_width
        forward = tokens * (hidden + inner / t)
        backward = tokens * (width / t + hidden)
        weights = h * (width + inner) / t
    if not keeps_quantized_tensors(training):
        forward, backward = forward + weights, backward + weights
    per_element = cast_bytes_per_element(training)
    return forward * per_element, backward * per_element
