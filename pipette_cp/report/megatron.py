"""Megatron-LM command-line arguments that realise a plan.

Flag names from Megatron-LM ``megatron/training/arguments.py`` (Megatron-Core
0.9+ spelling; older releases used ``--use-flash-attn`` and
``--num-layers-per-virtual-pipeline-stage`` only)."""

from __future__ import annotations

import shlex

from pipette_cp.cost.kernels import attention_kernel
from pipette_cp.solvers.split import megatron_split_args
from pipette_cp.specs import Instance, Plan


def model_args(instance: Instance) -> list[str]:
    """Architecture flags of the instance's model."""
    m, t = instance.model, instance.training
    args = [
        f"--num-layers {m.num_layers}",
        f"--hidden-size {m.hidden_size}",
        f"--ffn-hidden-size {m.ffn_hidden_size}",
        f"--num-attention-heads {m.num_attention_heads}",
        f"--seq-length {t.seq_length}",
        f"--max-position-embeddings {m.max_seq_length}",
    ]
    if m.kv_heads != m.num_attention_heads:
        args += ["--group-query-attention", f"--num-query-groups {m.kv_heads}"]
    if m.head_dim is not None and m.head_dim != m.hidden_size // m.num_attention_heads:
        args.append(f"--kv-channels {m.head_dim}")
    if m.activation == "swiglu":
        args.append("--swiglu")
    if m.norm == "rmsnorm":
        args.append("--normalization RMSNorm")
    if m.position_embedding != "learned":
        args.append(f"--position-embedding-type {m.position_embedding}")
    if not m.linear_bias:
        args.append("--disable-bias-linear")
    if not m.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    args.append(f"--{t.precision}")
    return args


def split_args(instance: Instance, plan: Plan) -> list[str]:
    """The split flags of :func:`pipette_cp.solvers.split.megatron_split_args`, one
    ``"--flag value"`` string each (the layout string quoted for the shell)."""
    tokens = megatron_split_args(plan, instance.model.num_layers)
    return [
        f"{flag} {shlex.quote(value)}"
        for flag, value in zip(tokens[::2], tokens[1::2], strict=True)
    ]


def megatron_notes(instance: Instance, plan: Plan) -> list[str]:
    """Comments for the user: version differences and what the flags encode."""
    notes = [
        f"pipette-cp plan {plan.layout()}, layers per virtual stage: {' '.join(map(str, plan.layer_split))}"
    ]
    layers = instance.model.num_layers
    if plan.vpp > 1 and layers % (plan.pp * plan.vpp) == 0:
        per_chunk = layers // (plan.pp * plan.vpp)
        notes.append(
            f"older Megatron-LM: use --num-layers-per-virtual-pipeline-stage {per_chunk} for interleaving"
        )
    if any(a.startswith("--pipeline-model-parallel-layout") for a in split_args(instance, plan)):
        notes.append(
            "the uneven split needs Megatron-Core's --pipeline-model-parallel-layout (experimental)"
        )
    return notes


def attention_args(instance: Instance, plan: Plan) -> list[str]:
    """``--attention-backend`` for the kernel the plan was costed with
    (:func:`pipette_cp.cost.kernels.attention_kernel`): ``flash`` for FlashAttention,
    ``fused`` for cuDNN's fused attention, ``unfused`` otherwise, and
    ``--no-masked-softmax-fusion`` for PyTorch's separate softmax kernels."""
    gpu = instance.cluster.gpu_of_node(0)
    kernel = attention_kernel(instance.training, plan, gpu)
    if kernel == "cudnn":
        return ["--attention-backend fused"]
    if kernel.startswith("flash"):
        return ["--attention-backend flash"]
    extra = [] if kernel == "fused-softmax" else ["--no-masked-softmax-fusion"]
    return ["--attention-backend unfused", *extra]


def fusion_args(instance: Instance) -> list[str]:
    """The fused-kernel switches of the stack: bias-activation (on by default) and the
    cross-entropy fusion (off by default)."""
    model, training = instance.model, instance.training
    args = []
    if not training.fused_bias_activation:
        swiglu = model.activation == "swiglu"
        args.append("--no-bias-swiglu-fusion" if swiglu else "--no-bias-gelu-fusion")
    if training.fused_cross_entropy:
        args.append("--cross-entropy-loss-fusion")
    return args


def megatron_args(instance: Instance, plan: Plan) -> list[str]:
    """Every flag: parallel sizes, batch, interleaving, SP, recompute, optimizer, split."""
    t = instance.training
    args = [
        f"--tensor-model-parallel-size {plan.tp}",
        f"--pipeline-model-parallel-size {plan.pp}",
        f"--micro-batch-size {plan.micro_batch_size}",
        f"--global-batch-size {t.global_batch_size}",
    ]
    if plan.vpp > 1:
        args.append(f"--num-virtual-stages-per-pipeline-rank {plan.vpp}")
    if plan.sequence_parallel:
        args.append("--sequence-parallel")
    if plan.recompute == "selective":
        args.append("--recompute-granularity selective")
    elif plan.recompute == "full":
        args += [
            "--recompute-granularity full",
            "--recompute-method uniform",
            "--recompute-num-layers 1",
        ]
    if plan.distributed_optimizer:
        args.append("--use-distributed-optimizer")
    if plan.sharding in ("optim_grads", "optim_grads_params"):
        # Megatron-FSDP (Megatron-Core >= 0.11) names the ZeRO levels this way
        args += ["--use-megatron-fsdp", f"--data-parallel-sharding-strategy {plan.sharding}"]
    if plan.hybrid:  # HSDP: one copy of the sharded state per group of shard_group DP ranks
        args.append(f"--num-distributed-optimizer-instances {plan.dp // plan.shard_group}")
        if plan.sharding in ("optim_grads", "optim_grads_params"):
            args.append("--outer-dp-sharding-strategy no_shard")
    args += attention_args(instance, plan)
    args += fusion_args(instance)
    if t.overlap_grad_reduce:
        args.append("--overlap-grad-reduce")
    if t.overlap_param_gather and plan.distributed_optimizer:
        args.append("--overlap-param-gather")
    if t.tp_comm_overlap and plan.tp > 1:
        args.append("--tp-comm-overlap")
    return args + split_args(instance, plan) + model_args(instance)
