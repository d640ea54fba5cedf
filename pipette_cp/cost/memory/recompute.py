"""What a dense layer keeps under a framework's own selective recomputation.

The plan's ``selective`` is Megatron's (``--recompute-granularity selective``: the
attention core recomputed, every other activation kept; :mod:`pipette_cp.cost.memory.peak`).
torchtitan's ``selective`` (``activation_checkpoint.selective_ac_option = "op"``, its
train_configs' default) is PyTorch's per-op selective activation checkpointing of every
transformer block with torchtitan's policy (``torchtitan/parallelisms/parallelize_llama.py``
``_custom_policy`` at 9dec370): it saves the outputs of the ops in its ``_save_list``
(``aten.mm``, the SDPA flash and efficient kernels, the TP reduce-scatter, ``abs`` and
``max``) except every second ``mm`` of a block, and recomputes everything else in the
backward.  A block runs its matmuls in the order Q, K, V, output projection, then the MLP
(SwiGLU: gate, up, down; else FC1, FC2), so it keeps (:func:`op_selective_layer_bytes`):

- its input (the checkpoint's input, 2 B x h; ``/ tp`` with sequence parallelism);
- the outputs of the odd-numbered matmuls (2 B each: Q, V, the gate or FC1 and, with
  SwiGLU, the down projection), column-parallel widths ``/ tp``, a row-parallel output the
  full ``h`` (before its reduce-scatter);
- the fused attention's output (2 B x the query width ``/ tp``) and its fp32
  log-sum-exp (4 B per head);
- with tensor parallelism, the outputs of the two sequence-parallel reduce-scatters
  (2 B x h / tp each).

Under torchao's Float8 the same set is taken (assumption: torchtitan's FP8 runs measured
the memory of their BF16 twins, 76.8 and 61.8 GiB against 77.0 and 62.0); the time model
keeps Megatron's selective recomputation for it (:mod:`pipette_cp.cost.compute.model_chunks`).
"""

from __future__ import annotations

from pipette_cp.cost.workload.flops import fc1_factor
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import TrainingSpec

#: Bytes of one saved bf16 element and of one fp32 log-sum-exp entry.
_BF16, _LSE = 2.0, 4.0


def op_selective_layer_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """Bytes one dense layer keeps for one micro-batch under torchtitan's per-op selective
    checkpointing (module docstring), ``s b / cp`` tokens on each GPU."""
    t = plan.tp
    tokens = training.seq_length * plan.micro_batch_size / plan.cp
    h, f, d = model.hidden_size, model.ffn_hidden_size, model.head_size
    q, kv = model.num_attention_heads * d, model.kv_heads * d
    # (width per token on this rank) of every matmul output, in the block's call order
    mlp = [f / t, f / t, float(h)] if fc1_factor(model) == 2 else [f / t, float(h)]
    outputs = [q / t, kv / t, kv / t, float(h), *mlp]
    kept = sum(outputs[::2])  # the 1st, 3rd, 5th, ... matmul of the block
    layer_input = h / t if plan.sequence_parallel else float(h)
    scattered = 2.0 * h / t if t > 1 and plan.sequence_parallel else 0.0
    per_token = _BF16 * (layer_input + kept + q / t + scattered)
    return tokens * (per_token + _LSE * model.num_attention_heads / t)
