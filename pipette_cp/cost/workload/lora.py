"""LoRA fine-tuning's work and state on one GPU: the adapters' parameters, GEMMs and kept
activations, and which parameters are trained (``training.lora``,
:class:`~pipette_cp.specs.lora.LoraSpec`; every function is 0 or the full-training value
without it).

Megatron-Bridge's adapters (``src/megatron/bridge/peft/utils.py``,
``ParallelLinearAdapter``; ``lora.py``, ``LoRAMerge.merge``): on a column-parallel linear
(``linear_qkv``, ``linear_fc1``) ``linear_in`` (A) is a column-parallel ``a x r/t`` whose
output is gathered to the full rank, ``linear_out`` (B) a column-parallel ``r x b/t``; on a
row-parallel linear (``linear_proj``, ``linear_fc2``) A is a row-parallel ``a/t x r``
(its output all-reduced) and B a column-parallel ``r x b/t``.  Either way a
tensor-parallel rank holds ``r (a + b) / t`` adapter parameters and runs ``1/t`` of the
adapter FLOPs.  The adapters are Megatron-Core's own parallel linears, not Transformer
Engine's: bf16 under FP8 training too.

Assumptions (Hu et al. 2021, sec. 4: only A and B are trained, the rest frozen):

- the base weights of every layer, the embedding and the output layer are frozen: no
  gradient buffer, no optimizer state, no weight-gradient GEMM, no gradient reduction
  (:func:`trained_param_split`); the data-gradient GEMMs run as in full training (the
  adapters of the layers below need them), but the first layer's own input gradient,
  which nothing needs, is still counted (errs slow by under one layer's dgrad);
- the adapters are trained in mixed precision like any parameter (the framework's
  bytes: bf16 weight, fp32 gradient, master weight and Adam moments);
- kept activations: an adapted linear's bf16 input (its A's weight gradient needs it), a
  frozen linear without an adapter none
  (:func:`pipette_cp.cost.memory.activations.activation_bytes_per_layer`), plus each
  adapter's rank-r intermediate, ``2 r`` bytes per token
  (:func:`adapter_activation_bytes`; dropout off, Megatron-Bridge's default); under FP8 or
  NVFP4 no weight cache (Megatron-Bridge's PEFT recipes set
  ``disable_parameter_transpose_cache``): each micro-batch casts the frozen weights and
  keeps their column-wise copy for the data gradient
  (:func:`pipette_cp.cost.memory.activations.frozen_weight_copy_bytes`);
- the adapters' own small tensor-parallel collectives (the rank-r gather or all-reduce)
  are not timed;
- dense models with standard attention only (the instance refuses the rest), and no
  adapters on multi-token prediction modules.
"""

from __future__ import annotations

import math

from pipette_cp.cost.workload.flops import Gemm, fc1_factor
from pipette_cp.cost.workload.parameters import stage_layer_kinds, stage_param_split
from pipette_cp.cost.workload.tokens import unit_tokens
from pipette_cp.specs.lora import LoraSpec
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import TrainingSpec

#: Bytes per element of an adapter's kept intermediate (bf16).
ADAPTER_ACTIVATION_BYTES = 2.0
#: The row-parallel targets (their A splits its input over tp); the others are
#: column-parallel (A splits the rank, its output gathered).
ROW_PARALLEL = ("linear_proj", "linear_fc2")


def adapter_widths(model: ModelSpec, lora: LoraSpec) -> tuple[tuple[str, int, int], ...]:
    """(target, in-width a, out-width b) of every adapted linear of one layer, whole (not
    split over tp): QKV ``h -> (heads + 2 kv heads) d``, projection ``heads d_v -> h``, FC1
    ``h -> f`` (``2f`` with SwiGLU), FC2 ``f -> h``."""
    h, f = model.hidden_size, model.ffn_hidden_size
    qkv = (model.num_attention_heads + 2 * model.kv_heads) * model.head_size
    widths = {
        "linear_qkv": (h, qkv),
        "linear_proj": (model.num_attention_heads * model.v_head_size, h),
        "linear_fc1": (h, fc1_factor(model) * f),
        "linear_fc2": (f, h),
    }
    return tuple((name, *widths[name]) for name in lora.target_modules)


def adapter_params_per_layer(model: ModelSpec, lora: LoraSpec, tp: int) -> float:
    """Adapter parameters of one layer on one tensor-parallel rank: ``r (a + b) / t`` per
    adapted linear."""
    return sum(lora.rank * (a + b) for _, a, b in adapter_widths(model, lora)) / tp


def adapter_gemms(model: ModelSpec, training: TrainingSpec, plan: Plan) -> tuple[Gemm, ...]:
    """Forward GEMMs of one layer's adapters on one tensor-parallel rank over the ``s b /
    cp`` tokens: per adapted linear A (``a x r/t`` column-parallel, ``a/t x r``
    row-parallel; a rank below tp rounds up to one column per rank) then B (``r x b/t``);
    () without LoRA."""
    lora = training.lora
    if lora is None:
        return ()
    t, r = plan.tp, lora.rank
    tokens = int(unit_tokens(training, plan))
    out = []
    for name, a, b in adapter_widths(model, lora):
        if name in ROW_PARALLEL:
            out.append(Gemm(f"{name}.lora_a", tokens, r, a // t))
        else:
            out.append(Gemm(f"{name}.lora_a", tokens, math.ceil(r / t), a))
        out.append(Gemm(f"{name}.lora_b", tokens, b // t, r))
    return tuple(out)


def adapter_activation_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """Bytes one layer's adapters keep for one micro-batch: each adapter's rank-r
    intermediate (B's input, for B's weight gradient), whole on every tensor-parallel
    rank (gathered or all-reduced), ``2 r`` bytes per token of the ``s b / cp``; 0
    without LoRA."""
    lora = training.lora
    if lora is None:
        return 0.0
    tokens = unit_tokens(training, plan)
    return len(lora.target_modules) * tokens * lora.rank * ADAPTER_ACTIVATION_BYTES


def stage_adapter_params(model: ModelSpec, training: TrainingSpec, plan: Plan, stage: int) -> float:
    """Adapter parameters held by one GPU of ``stage`` (its layers over all its chunks);
    0 without LoRA."""
    if training.lora is None:
        return 0.0
    layers, _ = stage_layer_kinds(model, plan, stage)
    return layers * adapter_params_per_layer(model, training.lora, plan.tp)


def trained_param_split(
    model: ModelSpec, training: TrainingSpec, plan: Plan, stage: int
) -> tuple[float, float]:
    """(dense, routed-expert) parameters of one GPU of ``stage`` that are trained: with
    a gradient, optimizer state, a place in the data-parallel gradient reduction and the
    optimizer step.  Every parameter
    (:func:`~pipette_cp.cost.workload.parameters.stage_param_split`) in full training;
    the adapters alone under LoRA."""
    if training.lora is None:
        return stage_param_split(model, plan, stage)
    return stage_adapter_params(model, training, plan, stage), 0.0
