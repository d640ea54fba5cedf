"""What PyTorch-native training (FSDP2, ``torch.distributed.pipelining``, DTensor TP and
``context_parallel``) holds beyond the Megatron-shaped terms of :mod:`pipette_cp.cost.memory.peak`.

torchtitan (the torch of its December 2024 benchmark, 1963fc8, and torchtitan 9dec370) is
the one framework of :data:`PYTORCH_NATIVE`.  Per GPU of a pipeline stage, bytes
(:func:`stage_extra_bytes`):

- **Pipeline stage buffers** (pp > 1).  ``PipelineStage._prepare_forward_infra`` and
  ``_prepare_backward_infra`` allocate, once per step and for *every* micro-batch, the
  receive buffer of the stage input (stages after the first) and of the output gradient
  (stages before the last); ``forward_one_chunk`` appends every micro-batch's output to
  ``output_chunks``, kept until the schedule's step ends (``clear_runtime_states``): the
  boundary hidden states, and on the last stage the bf16 logits (vocabulary-parallel,
  ``loss_parallel``).  A receive buffer of a micro-batch in flight is the first block's
  saved input, already counted with the activations.
- **FSDP2 gradient accumulation without sync** (pp > 1).  torchtitan's ``apply_fsdp`` sets
  ``reshard_after_forward=False`` under pp (the gathered bf16 weights stay for the step,
  :mod:`pipette_cp.experiments.models.published_runs_setup` models it as ZeRO-1), and the pipeline
  stage calls ``set_requires_gradient_sync(False)`` for every backward but the last, so
  ``FSDPParam.to_accumulated_grad_if_needed`` keeps unsharded fp32 (``reduce_dtype``)
  gradients; each backward first writes the block's gradients in bf16 (``param_dtype``),
  which ``accumulate_unsharded_grad_if_needed`` adds in and frees: one block's bf16
  gradients on top.
- **FSDP2 root** (pp = 1, ZeRO-3).  ``FSDPState._lazy_init`` sets the root group's
  ``post_forward_mesh_info = None`` ("for the root, do not reshard after forward"): the
  embedding, final norm and output weights (torchtitan's root group) stay gathered in bf16
  from the forward to the end of the backward.
- **DTensor tensor parallelism** (tp > 1, full recompute).  The column-parallel Q/K/V and
  FC1 (w1, w3) take the all-gathered (``Replicate``) norm output, and autograd saves that
  full-sequence input for the weight gradient (Megatron saves the 1/tp shard and gathers
  again in backward): the block being recomputed holds 2 x 2 B x h per token more than
  :func:`pipette_cp.cost.memory.activations.full_layer_activation_bytes` counts under
  sequence parallelism.  Its backward holds one more full-sequence ``h``-wide bf16 tensor at a
  time: the all-gathered output gradient of a row-parallel GEMM (wo, w2; their
  ``output_layouts=Shard(1)`` redistributes it to ``Replicate`` for the local matmuls) or
  the partial-sum input gradient of Q/K/V and w1/w3 before its reduce-scatter.
- **Ring attention** (cp > 1).  PyTorch's ``_templated_ring_attention`` (``rotate_method``
  all-gather, the default of that torch) all-gathers K and V of the whole sequence at the
  query heads' width (torchtitan calls ``repeat_kv`` before SDPA), forward and backward,
  and accumulates dQ, dK, dV in fp32; this replaces Megatron's four p2p K/V chunks
  (:func:`pipette_cp.cost.memory.moe_activations.cp_temporary_bytes`), which is subtracted.
"""

from __future__ import annotations

from pipette_cp.cost.memory.limits import in_flight_microbatches
from pipette_cp.cost.memory.moe_activations import cp_temporary_bytes
from pipette_cp.cost.stack.frameworks import resolve_framework
from pipette_cp.cost.workload import parameters
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import TrainingSpec

#: Frameworks built on FSDP2, torch.distributed.pipelining, DTensor TP and context_parallel.
PYTORCH_NATIVE = frozenset({"torchtitan"})
#: bf16 (``param_dtype``), fp32 (``reduce_dtype``; ring accumulators).
_BF16, _FP32 = 2.0, 4.0


def is_pytorch_native(training: TrainingSpec) -> bool:
    """Whether the job's framework is one of :data:`PYTORCH_NATIVE`."""
    return resolve_framework(training.framework).name in PYTORCH_NATIVE


def _tokens(training: TrainingSpec, plan: Plan) -> float:
    return training.seq_length * plan.micro_batch_size / plan.cp


def boundary_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """One micro-batch's hidden states between two stages (bf16; ``/ tp`` under sequence
    parallelism: torchtitan's blocks pass the local sequence shard)."""
    shard = plan.tp if plan.sequence_parallel else 1
    return _BF16 * _tokens(training, plan) * model.hidden_size / shard


def pipeline_buffer_bytes(
    model: ModelSpec, training: TrainingSpec, plan: Plan, stage: int, microbatches: int
) -> float:
    """``torch.distributed.pipelining`` buffers of one GPU of ``stage`` (all its virtual
    stages): every micro-batch's output (``output_chunks``) and preallocated receive
    buffers (module docstring)."""
    if plan.pp == 1:
        return 0.0
    edge = boundary_bytes(model, training, plan)
    logits = _BF16 * _tokens(training, plan) * model.vocab_size / plan.tp
    last_index = plan.pp * plan.vpp - 1
    in_flight = in_flight_microbatches(plan, stage, microbatches)
    total = 0.0
    for chunk in range(plan.vpp):
        index = chunk * plan.pp + stage
        total += microbatches * (logits if index == last_index else edge)  # output_chunks
        if index != last_index:  # output-gradient receive buffers
            total += microbatches * edge
        if index != 0:  # input receive buffers beyond the in-flight (saved) ones
            total += max(0.0, microbatches - in_flight) * edge
    return total


def fsdp2_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """FSDP2's extra gathered weights or gradients (module docstring): under pp one
    block's bf16 gradients before accumulation; at pp = 1 with ZeRO-3 the root group's
    gathered embedding, final norm and output weights."""
    if plan.pp > 1:
        return _BF16 * parameters.largest_layer_params_per_gpu(model, plan)
    if plan.sharding != "optim_grads_params":
        return 0.0
    vocab_weights = (1 if model.tied_embeddings else 2) * model.vocab_size * model.hidden_size
    return _BF16 * (vocab_weights / plan.tp + model.norm_params)


def tp_gathered_input_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """The all-gathered inputs of Q/K/V and FC1 the recomputed block keeps beyond their
    sequence-parallel shards, and one full-sequence tensor of its backward (tp > 1,
    sequence parallel, full recompute)."""
    if plan.tp == 1 or not plan.sequence_parallel or plan.recompute != "full":
        return 0.0
    full_sequence = _BF16 * _tokens(training, plan) * model.hidden_size
    return full_sequence * (2 * (1 - 1 / plan.tp) + 1)


def ring_attention_bytes(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """PyTorch ring attention's working set less Megatron's p2p chunks (cp > 1): K and V
    of the whole sequence gathered at the query heads' widths (K ``head_size``, V
    ``v_head_size``), and fp32 dQ, dK (``head_size``) and dV (``v_head_size``), local."""
    if plan.cp == 1:
        return 0.0
    heads = model.num_attention_heads / plan.tp
    qk, v = heads * model.head_size, heads * model.v_head_size
    gathered = _BF16 * training.seq_length * plan.micro_batch_size * (qk + v)
    accumulators = _FP32 * _tokens(training, plan) * (2 * qk + v)
    return gathered + accumulators - cp_temporary_bytes(model, training, plan)


def stage_extra_bytes(
    model: ModelSpec, training: TrainingSpec, plan: Plan, stage: int, microbatches: int
) -> float:
    """Every term of the module docstring for one GPU of ``stage``; 0 for a framework
    outside :data:`PYTORCH_NATIVE`."""
    if not is_pytorch_native(training):
        return 0.0
    return (
        pipeline_buffer_bytes(model, training, plan, stage, microbatches)
        + fsdp2_bytes(model, training, plan)
        + tp_gathered_input_bytes(model, training, plan)
        + ring_attention_bytes(model, training, plan)
    )
