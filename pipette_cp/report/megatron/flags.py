"""Megatron-LM command-line arguments and environment that realise a plan.

Flag names from Megatron-LM ``megatron/training/arguments.py`` (Megatron-Core
0.9+ spelling; older releases used ``--use-flash-attn`` and
``--num-layers-per-virtual-pipeline-stage`` only); every exported flag is
checked against that parser's table by :mod:`pipette_cp.report.megatron.check`.

The flags describe the whole modelled network (widths, heads and query groups,
norm and its epsilon, activation, positions with the RoPE base, fraction and
scaling, biases, tying, dropout; latent attention, experts and multi-token
prediction from :mod:`pipette_cp.report.megatron.moe_flags`; the layer pattern of hybrid
Mamba-Transformer models from :mod:`pipette_cp.report.megatron.hybrid_flags`) and the
plan (parallel sizes, context and expert parallelism included, batch, the interleaving
or the layer split, recomputation, sharding, kernels).  None of them needs the cost
model: only :func:`check_export`'s memory check evaluates the plan.  What the
model spec does not fix is left to the user and said in
:func:`megatron_notes`: data, tokenizer (hence the vocabulary), optimizer
hyper-parameters, checkpoints.
"""

from __future__ import annotations

import shlex

from pipette_cp.cost.evaluator.evaluate import evaluate
from pipette_cp.cost.stack.kernels import attention_kernel, fp8_format, fp8_recipe
from pipette_cp.errors import LayoutError, SpecError, UnsupportedError
from pipette_cp.report.megatron.check import argument_table, check_megatron_argv
from pipette_cp.report.megatron.environment import (
    before_blackwell,
    megatron_environment,
)
from pipette_cp.report.megatron.hybrid_flags import (
    hybrid_model_flags,
    hybrid_notes,
    hybrid_split_flags,
)
from pipette_cp.report.megatron.moe_flags import architecture_flags, moe_notes, parallel_flags
from pipette_cp.solvers.split import megatron_split_args
from pipette_cp.specs import Instance, Plan
from pipette_cp.specs.knobs import KNOBS
from pipette_cp.units import GiB

#: One flag and its value (None for a switch).
Flag = tuple[str, str | None]

#: Megatron's names of the normalisation layers (``--normalization`` choices).
_NORM = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}
#: Megatron's names of the position embeddings (``--position-embedding-type``).
_POSITIONS = {"learned": "learned_absolute", "rope": "rope", "none": "none"}
#: The flag that fixes the virtual stages of an uneven interleaved split.
LAYOUT_FLAG = "--pipeline-model-parallel-layout"


def _values(flag: str, value: str) -> list[str]:
    """A flag's value tokens: one, or the space-separated list of an option that takes
    several (``nargs`` + or * in Megatron's parser: ``--recompute-modules core_attn mlp``)."""
    option = argument_table().get(flag)
    return value.split() if option is not None and option.nargs in ("+", "*") else [value]


def _render(flags: list[Flag]) -> list[str]:
    """``"--flag value"`` strings, the value(s) quoted for the shell."""
    return [
        flag if value is None else " ".join([flag, *map(shlex.quote, _values(flag, value))])
        for flag, value in flags
    ]


def model_flags(instance: Instance) -> list[Flag]:
    """The network: widths, heads, positions, norm, activation, biases, tying, latent
    attention, experts, multi-token prediction, dropout; a hybrid model's layer specs
    and Mamba widths instead of ``--num-layers`` (its :func:`split_flags` give the layers).

    Raises
    ------
    UnsupportedError
        ALiBi positions: Megatron-LM has no ALiBi (``--position-embedding-type``
        offers learned_absolute, rope, yarn, mrope, relative, none).
    """
    m, t = instance.model, instance.training
    if m.position_embedding not in _POSITIONS:
        raise UnsupportedError(
            "model.position_embedding",
            m.position_embedding,
            "Megatron-LM has no such position embedding (learned, rope or none only)",
        )
    flags: list[Flag] = [] if m.is_hybrid else [("--num-layers", str(m.num_layers))]
    flags += [
        ("--hidden-size", str(m.hidden_size)),
        ("--ffn-hidden-size", str(m.ffn_hidden_size)),
        ("--num-attention-heads", str(m.num_attention_heads)),
    ]
    if m.kv_heads != m.num_attention_heads:
        flags += [("--group-query-attention", None), ("--num-query-groups", str(m.kv_heads))]
    if m.head_dim is not None and m.head_dim * m.num_attention_heads != m.hidden_size:
        flags.append(("--kv-channels", str(m.head_dim)))
    flags += [
        ("--seq-length", str(t.seq_length)),
        ("--max-position-embeddings", str(m.max_seq_length)),
        ("--position-embedding-type", _POSITIONS[m.position_embedding]),
    ]
    if m.position_embedding == "rope":
        flags.append(("--rotary-base", str(m.rotary_base)))
        if m.rotary_fraction != 1.0:
            flags.append(("--rotary-percent", repr(m.rotary_fraction)))
        if m.rope_scaling_factor is not None:
            flags += [
                ("--use-rope-scaling", None),
                ("--rope-scaling-factor", repr(float(m.rope_scaling_factor))),
            ]
    flags += [("--normalization", _NORM[m.norm]), ("--norm-epsilon", repr(m.norm_epsilon))]
    if m.activation in ("swiglu", "squared_relu"):
        flags.append((f"--{m.activation.replace('_', '-')}", None))
    if not m.linear_bias:
        flags.append(("--disable-bias-linear", None))
        if m.qkv_bias:
            flags.append(("--add-qkv-bias", None))
    if m.qk_norm:  # RMSNorm on queries and keys (Qwen3)
        flags.append(("--qk-layernorm", None))
    if not m.tied_embeddings:
        flags.append(("--untie-embeddings-and-output-weights", None))
    flags += architecture_flags(instance)  # latent attention, experts, MTP (dense: none)
    flags += hybrid_model_flags(m)  # layer specs, Mamba widths (no pattern: none)
    attention, hidden = dropouts(instance)
    flags += [("--attention-dropout", repr(attention)), ("--hidden-dropout", repr(hidden))]
    flags += [*precision_flags(instance), ("--optimizer", t.optimizer)]
    return flags


#: ``--fp8-amax-history-len`` and ``--fp8-amax-compute-algo`` of delayed scaling: the
#: Megatron-Core low-precision training guide's minimum config (Megatron's own defaults, 1
#: and most_recent, are not the recipe's: TE DelayedScaling defaults to 1024 and max).
DELAYED_AMAX = (("--fp8-amax-history-len", "1024"), ("--fp8-amax-compute-algo", "max"))


def precision_flags(instance: Instance) -> list[Flag]:
    """``--bf16`` / ``--fp16``; for fp8 ``--bf16`` with ``--fp8-format`` and ``--fp8-recipe``
    (Transformer Engine runs the layer GEMMs in FP8, everything else stays bf16) and, for
    delayed scaling, its amax history (:data:`DELAYED_AMAX`); for fp4 ``--bf16`` with
    ``--fp4-format e2m1 --fp4-recipe nvfp4`` (the layer GEMMs in NVFP4); with either, the
    layers kept in bf16 (``--first-last-layers-bf16`` and how many at each end)."""
    t = instance.training
    if t.precision not in ("fp8", "fp4"):
        return [(f"--{t.precision}", None)]
    if t.precision == "fp4":
        flags: list[Flag] = [("--bf16", None), ("--fp4-format", "e2m1"), ("--fp4-recipe", "nvfp4")]
    else:
        recipe = fp8_recipe(t)
        flags = [("--bf16", None), ("--fp8-format", fp8_format(t)), ("--fp8-recipe", recipe)]
        flags += list(DELAYED_AMAX) if recipe == "delayed" else []
    if t.bf16_first_layers + t.bf16_last_layers:
        flags += [
            ("--first-last-layers-bf16", None),
            ("--num-layers-at-start-in-bf16", str(t.bf16_first_layers)),
            ("--num-layers-at-end-in-bf16", str(t.bf16_last_layers)),
        ]
    return flags


def model_args(instance: Instance) -> list[str]:
    """:func:`model_flags` as ``"--flag value"`` strings."""
    return _render(model_flags(instance))


def dropouts(instance: Instance) -> tuple[float, float]:
    """(attention, hidden) dropout probabilities to export: the model's, or 0 and 0
    when ``training.dropout`` is off (the memory model then keeps no dropout masks,
    so the job must not draw any)."""
    if not instance.training.dropout:
        return 0.0, 0.0
    return instance.model.attention_dropout_fraction, instance.model.hidden_dropout_fraction


def split_flags(instance: Instance, plan: Plan) -> list[Flag]:
    """The layer split (:func:`pipette_cp.solvers.split.megatron_split_args`) and the
    interleaving: ``--num-virtual-stages-per-pipeline-rank`` unless the layout string
    already fixes the virtual stages (Megatron takes at most one of the two); for a
    hybrid model its pattern, one segment per virtual stage, which gives both."""
    if instance.model.is_hybrid:
        return hybrid_split_flags(instance, plan)
    tokens = megatron_split_args(plan, instance.model.num_layers)
    flags: list[Flag] = list(zip(tokens[::2], tokens[1::2], strict=True))
    if plan.vpp > 1 and not any(flag == LAYOUT_FLAG for flag, _ in flags):
        flags.insert(0, ("--num-virtual-stages-per-pipeline-rank", str(plan.vpp)))
    return flags


def split_args(instance: Instance, plan: Plan) -> list[str]:
    """The split flags of :func:`pipette_cp.solvers.split.megatron_split_args`, one
    ``"--flag value"`` string each (the layout string quoted for the shell); a hybrid
    model's pattern (:func:`split_flags`)."""
    if instance.model.is_hybrid:
        return _render(split_flags(instance, plan))
    tokens = megatron_split_args(plan, instance.model.num_layers)
    return _render(list(zip(tokens[::2], tokens[1::2], strict=True)))


def megatron_notes(instance: Instance, plan: Plan) -> list[str]:
    """Comments for the user: what the flags encode, version differences, what is left
    to the user, and where the job differs from what was costed."""
    m, t = instance.model, instance.training
    notes = [
        f"pipette-cp plan {plan.layout()}, layers per virtual stage: "
        + " ".join(map(str, plan.layer_split))
    ]
    if plan.vpp > 1 and len(set(plan.layer_split)) == 1 and not m.is_hybrid:
        notes.append(
            "older Megatron-LM: --num-layers-per-virtual-pipeline-stage "
            f"{plan.layer_split[0]} instead of --num-virtual-stages-per-pipeline-rank"
        )
    if any(flag == LAYOUT_FLAG for flag, _ in split_flags(instance, plan)):
        notes.append(
            f"the uneven split needs Megatron-Core's {LAYOUT_FLAG} (experimental), which also "
            "fixes the virtual stages; older releases cannot build it"
        )
    notes.append(
        f"vocabulary: {m.vocab_size} tokens from the tokenizer (add --tokenizer-type and "
        "--tokenizer-model; with --tokenizer-type NullTokenizer give --vocab-size "
        f"{m.vocab_size - 1}, it adds the end-of-document token); Megatron pads it to a "
        f"multiple of --make-vocab-size-divisible-by (128) x tp = {128 * plan.tp}"
    )
    env = megatron_environment(instance, plan)
    if "CUDA_DEVICE_MAX_CONNECTIONS" in env:
        value = env["CUDA_DEVICE_MAX_CONNECTIONS"]
        notes.append(
            "environment: "
            + ("unset CUDA_DEVICE_MAX_CONNECTIONS (Megatron FSDP)" if value is None else
               f"CUDA_DEVICE_MAX_CONNECTIONS={value} ({_parallelism(plan)} before Blackwell)")
            + "; the launch files set it"
        )  # fmt: skip
    if t.dropout and dropouts(instance) == (0.0, 0.0):
        notes.append(
            "the model has no dropout but training.dropout is on: the memory model counts "
            "dropout masks this job does not keep (set training.dropout: false)"
        )
    if t.tp_comm_overlap and plan.tp > 1 and not plan.sequence_parallel:
        notes.append(
            "training.tp_comm_overlap is on but --tp-comm-overlap needs --sequence-parallel, "
            "which the plan does not use: left out, so the job overlaps less than was costed"
        )
    if plan.sequence_parallel and plan.tp == 1:
        notes.append("--sequence-parallel left out: it needs tensor parallelism (tp = 1 here)")
    if t.precision == "fp4":
        notes.append(
            "fp4: costed with every transformer layer's GEMMs in NVFP4 and the output layer, "
            "attention and element-wise kernels in bf16 (Megatron's defaults)"
        )
    if t.precision == "fp8":
        notes.append(
            "fp8: costed with every transformer layer's GEMMs in FP8 and the output layer, "
            "attention and element-wise kernels in bf16 (Megatron's defaults); "
            "--first-last-layers-bf16 would change what was costed (FP8 primary weights, "
            "--fp8-param-gather, are a knob of the plan)"
        )
    return notes + moe_notes(instance, plan) + hybrid_notes(instance, plan)


def _parallelism(plan: Plan) -> str:
    """What needs one CUDA stream: tensor and/or context parallelism."""
    if plan.cp == 1:
        return "tensor parallelism"
    return "tensor and context parallelism" if plan.tp > 1 else "context parallelism"


def attention_args(instance: Instance, plan: Plan) -> list[str]:
    """``--attention-backend`` for the kernel the plan was costed with
    (:func:`pipette_cp.cost.stack.kernels.attention_kernel`): ``flash`` for FlashAttention,
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


def megatron_flags(instance: Instance, plan: Plan) -> list[Flag]:
    """Every flag: parallel sizes (tp, pp, cp, ep, etp), then each knob's (batch, SP,
    recompute, sharding, ...: :attr:`pipette_cp.specs.knobs.Knob.megatron`), kernels,
    overlaps, split with the interleaving, then the model (:func:`model_flags`).

    Raises
    ------
    UnsupportedError
        FP8 attention (``training.fp8_attention``: no option in Megatron-LM's parser), or
        a LoRA job (``training.lora``): Megatron-LM's parser has no LoRA flags (LoRA
        fine-tuning runs in Megatron-Bridge or NeMo), and its arguments alone would
        launch full training.
    """
    t = instance.training
    if t.fp8_attention:
        raise UnsupportedError(
            "training.fp8_attention", True, "Megatron-LM's parser has no FP8 attention option "
            "(NeMo and Megatron-Bridge set fp8_dot_product_attention); export without it"
        )  # fmt: skip
    if (lora := t.lora) is not None:
        raise UnsupportedError(
            "training.lora",
            f"rank {lora.rank} on {', '.join(lora.target_modules)}",
            "Megatron-LM has no LoRA flags (LoRA fine-tuning runs in Megatron-Bridge or "
            "NeMo); its export would launch full training",
        )
    flags: list[Flag] = [
        ("--tensor-model-parallel-size", str(plan.tp)),
        ("--pipeline-model-parallel-size", str(plan.pp)),
        *parallel_flags(instance, plan),  # cp, ep, etp (dense with cp = ep = 1: none)
    ]
    for knob in KNOBS:
        if knob.megatron is not None:
            flags += knob.megatron(t, plan)
    sequence_parallel = plan.sequence_parallel and plan.tp > 1  # Megatron: only with TP
    for text in attention_args(instance, plan) + fusion_args(instance):
        flag, _, value = text.partition(" ")
        flags.append((flag, value or None))
    if t.overlap_grad_reduce:
        flags.append(("--overlap-grad-reduce", None))
    if t.overlap_param_gather and plan.distributed_optimizer:
        flags.append(("--overlap-param-gather", None))
    if t.tp_comm_overlap and sequence_parallel:  # Megatron: TP overlap needs SP
        flags.append(("--tp-comm-overlap", None))
    return flags + split_flags(instance, plan) + model_flags(instance)


def megatron_args(instance: Instance, plan: Plan) -> list[str]:
    """:func:`megatron_flags` as ``"--flag value"`` strings (values quoted for the shell)."""
    return _render(megatron_flags(instance, plan))


def megatron_argv(instance: Instance, plan: Plan) -> list[str]:
    """:func:`megatron_flags` as the argument vector the training script receives."""
    return [token for flag, value in megatron_flags(instance, plan)
            for token in (flag, *(() if value is None else _values(flag, value)))]  # fmt: skip


def check_flags(instance: Instance, plan: Plan) -> None:
    """What ``export --check`` checks, without the cost model: the exported arguments,
    environment and world size against Megatron-LM's parser table and its rules
    (:func:`pipette_cp.report.megatron.check.check_megatron_argv`).

    Raises
    ------
    SpecError
        The first rule the export breaks, naming the flag (or variable) and its value.
    """
    check_megatron_argv(
        megatron_argv(instance, plan),
        megatron_environment(instance, plan),
        before_blackwell=before_blackwell(instance),
        world_size=plan.num_gpus,
    )


def check_export(instance: Instance, plan: Plan, *, flags: bool = True) -> None:
    """Refuse to export a plan Megatron-LM would not run as modelled.

    - a plan that does not fit in memory (its evaluation's ``fits``; the cost model
      raises for what it does not model);
    - a virtual stage without transformer layers (:func:`split_flags` raises);
    - with ``flags``: :func:`check_flags`.

    Raises
    ------
    LayoutError, SpecError
        One line naming the plan (or the flag) and why.
    """
    megatron_argv(instance, plan)  # the split and the model flags raise first
    evaluation = evaluate(instance, plan)
    if not evaluation.fits:
        bounds = evaluation.memory_bound_bytes_by_stage or evaluation.memory_bytes_by_stage
        stage = max(range(len(bounds)), key=bounds.__getitem__)
        raise LayoutError(
            "plan", plan.layout(), f"does not fit in memory: stage {stage} needs "
            f"{bounds[stage] / GiB:.1f} GiB, {evaluation.memory_limit_bytes / GiB:.1f} GiB usable",
        )  # fmt: skip
    if flags:
        try:
            check_flags(instance, plan)
        except SpecError as err:
            raise SpecError(
                f"exported {err.field}", err.value, f"{err.expected} (--no-check writes it anyway)"
            ) from None
