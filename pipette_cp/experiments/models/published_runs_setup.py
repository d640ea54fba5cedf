"""Each published run as an instance and a plan (the assumptions where a row is silent
are listed in :mod:`pipette_cp.experiments.models.published_runs`)."""

from __future__ import annotations

import re
from dataclasses import replace

from pipette_cp.experiments.models.accuracy import RowSetup, row_setup
from pipette_cp.experiments.models.calibration_split import family
from pipette_cp.specs.gpu import resolve_gpu
from pipette_cp.specs.instance import Instance
from pipette_cp.specs.layouts import make_plan
from pipette_cp.specs.training import (
    FUSED_ATTENTION,
    AttentionKernel,
    FrameworkProfile,
    Sharding,
)

#: LLaMA-1 shapes assumed for the Hagemann sheets: layers, hidden, heads, ffn.
LLAMA1_SHAPES = {"13": (40, 5120, 40, 13824), "30": (60, 6656, 52, 17920)}

#: Query heads assumed for the Nemotron-4 rows (the recipe tables omit them).
NEMOTRON_HEADS = {"15": 48, "340": 96}

#: Hagemann et al.'s ``kernel=`` values as the stack's (attention kernel, fused norm):
#: PyTorch's own attention, Megatron's fused softmax, FlashAttention 1.0.8 and 2, and
#: FlashAttention 2 with the fused RMSNorm kernel of the FlashAttention repository.
HAGEMANN_KERNELS: dict[str, tuple[AttentionKernel, bool]] = {
    "torch": ("eager", False),
    "fused": ("fused-softmax", False),
    "flash_attentionv1.0.8": ("flash1", False),
    "flash_attention2": ("flash2", False),
    "flash_attention2 + RMS kernel": ("flash2", True),
}


class Skip(Exception):
    """A row today's models cannot express; the message is the counted reason."""


def note(notes: str, key: str) -> str | None:
    """The value of ``key=value`` in a row's notes."""
    found = re.search(rf"{key}=([^;]*)", notes)
    return found.group(1).strip() if found else None


def check_expressible(row: dict[str, str]) -> None:
    """Raise :class:`Skip` (with the counted reason) for a row the models cannot express."""
    fam, notes = family(row), row["notes"]
    if "FSDP" in row["distributed_optimizer_or_zero"] and _fsdp_level(row) is None:
        raise Skip("FSDP strategy not modelled (hybrid sharding)")
    if (note(notes, "context_parallel") or note(notes, "cp") or "1") != "1":
        raise Skip("context parallelism (not modelled)")
    if fam not in FAMILY_FRAMEWORK:
        raise Skip(f"family {fam} (not modelled)")
    if "OOM" not in notes and "Error" in notes:
        raise Skip("run failed, not OOM")


def complete_row(row: dict[str, str]) -> dict[str, str]:
    """The row with the module's assumptions filled in where it is silent."""
    full, fam = dict(row), family(row)
    if fam == "hagemann":
        layers, hidden, heads, ffn = LLAMA1_SHAPES[row["params_b"]]
        seq = int(row["seq_len"] or 2048)
        full.update(
            num_layers=str(layers), hidden_size=str(hidden), num_heads=str(heads),
            ffn_hidden_size=str(ffn), vocab_size="32000", seq_len=str(seq),
            global_batch_size=str(2048 * 2048 // seq), gpu_type="A100-SXM4",
        )  # fmt: skip
    if fam == "dgxc" and not row["num_heads"]:
        full["num_heads"] = str(NEMOTRON_HEADS[row["params_b"]])
        full["num_kv_heads"] = "8"
    if not full["measured_tflops_per_gpu"]:
        full["measured_tflops_per_gpu"] = "nan"
    return full


#: The framework of each source family (:data:`pipette_cp.cost.stack.frameworks.FRAMEWORKS`).
FAMILY_FRAMEWORK = {
    "hagemann": "aleph-alpha",
    "bloom": "megatron-deepspeed",
    "dgxc": "nemo",
    "mpt": "llm-foundry",
    # the 27 calibration rows (published_runs_calibration.csv), set up as accuracy.py does
    "sc21": "megatron-lm",
    "gpt3": "megatron-lm",
    "mcore": "megatron-core",
}
#: Families measured in TFLOP/s per GPU (the setup's model or hardware convention).
TFLOPS_FAMILIES = ("bloom", "sc21", "gpt3", "mcore")
#: PyTorch FSDP sharding strategies as sharding levels (HYBRID_SHARD is not modelled).
FSDP_LEVELS: dict[str, Sharding] = {
    "FULL_SHARD": "optim_grads_params",
    "SHARD_GRAD_OP": "optim_grads",
}


def _fsdp_level(row: dict[str, str]) -> Sharding | None:
    strategy = row["distributed_optimizer_or_zero"].replace("FSDP", "").strip()
    return FSDP_LEVELS.get(strategy)


def run_setup(
    row: dict[str, str],
    compute_efficiency: float | None = None,
    attention_efficiency: float | None = None,
) -> RowSetup:
    """:func:`accuracy.row_setup` of the completed row, adjusted per family
    (the efficiencies override the framework's, to fit them)."""
    setup = row_setup(complete_row(row))
    fam, inst = family(row), setup.instance
    framework = FrameworkProfile(
        name=FAMILY_FRAMEWORK[fam],
        compute_efficiency=compute_efficiency,
        attention_efficiency=attention_efficiency,
    )
    if fam in TFLOPS_FAMILIES:  # Megatron-style runs: accuracy.py's own setup
        training = inst.training.model_copy(update={"framework": framework})
        return replace(setup, instance=inst.model_copy(update={"training": training}))
    if fam == "mpt":
        return _mpt_setup(row, setup, framework)
    model = inst.model.model_copy(update={"linear_bias": False})
    if "Llama" in row["model_name"] or "Nemotron" in row["model_name"]:
        model = model.model_copy(update={"position_embedding": "rope"})
    training, plan = inst.training, setup.plan
    if fam == "hagemann":
        model = model.model_copy(
            update={"activation": "swiglu", "norm": "rmsnorm", "position_embedding": "rope"}
        )
        training = training.model_copy(
            update={"tp_comm_overlap": False, "overlap_param_gather": False}
        )
        kernel, fused_norm = HAGEMANN_KERNELS[(note(row["notes"], "kernel") or "").strip()]
        flash = kernel in FUSED_ATTENTION
        plan = plan.model_copy(
            update={"sequence_parallel": row["sequence_parallel"] == "y" and plan.tp > 1,
                    "flash_attention": flash}
        )  # fmt: skip
        training = training.model_copy(
            update={"flash_attention_available": flash, "attention_kernel": kernel,
                    "fused_norm": fused_norm}
        )  # fmt: skip
    training = training.model_copy(update={"framework": framework})
    instance = Instance(name=inst.name, model=model, cluster=inst.cluster, training=training)
    return replace(setup, instance=instance, plan=plan)


def _mpt_setup(row: dict[str, str], setup: RowSetup, framework: FrameworkProfile) -> RowSetup:
    """llm-foundry MPT runs: ALiBi, no biases, no dropout, tied embeddings, FlashAttention 2, PyTorch
    FSDP (FULL_SHARD = ZeRO-3, SHARD_GRAD_OP = ZeRO-2) with bf16 compute; A100 40 or 80 GB
    as the row says."""
    inst, plan = setup.instance, setup.plan
    model = inst.model.model_copy(
        update={"linear_bias": False, "position_embedding": "alibi", "tied_embeddings": True}
    )
    training = inst.training.model_copy(
        update={"precision": "bf16", "flash_attention_available": True, "attention_kernel": "flash2",
                "overlap_grad_reduce": False, "overlap_param_gather": False,
                "tp_comm_overlap": False, "dropout": False, "framework": framework}
    )  # fmt: skip
    plan = plan.model_copy(
        update={"dp_sharding": _fsdp_level(row), "distributed_optimizer": True,
                "flash_attention": True, "sequence_parallel": False}
    )  # fmt: skip
    cluster = inst.cluster
    if row["gpu_type"].startswith("A100") and row["gpu_mem_gb"] == "40":
        gpu = resolve_gpu("a100-40gb")
        nodes = tuple(gpu.name for _ in cluster.node_gpu_types)
        cluster = cluster.model_copy(update={"gpu_types": {gpu.name: gpu}, "node_gpu_types": nodes})
    instance = Instance(name=inst.name, model=model, cluster=cluster, training=training)
    return replace(setup, instance=instance, plan=plan)


# --------------------------------------------------------------------- FP8 family
#: The dense FP8 families of ``published_runs_moe_cp.csv`` and their frameworks: NeMo 24.07
#: (Megatron-Core with Transformer Engine FP8) and torchtitan (torchao Float8).
FP8_FAMILY_FRAMEWORK = {"nemo": "nemo", "torchtitan": "torchtitan"}
#: torchtitan's H100 (Grand Teton, 96 GB, 500 W power limit): the H100 SXM5 datasheet
#: peaks and NVLink (the power limit is not modelled: the benchmark says the peak lies
#: between SXM and NVL and is not known; the framework's fitted compute efficiency takes
#: it) with 96 GiB of HBM2e at 2.4 TB/s, as the benchmark's "Hardware" section states.
TORCHTITAN_GPU = resolve_gpu("h100").model_copy(
    update={"name": "H100-SXM-96GB-500W", "memory_bytes": 96.0 * 2**30,
            "hbm_bandwidth_bytes_per_s": 2.4e12,
            "source": "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, "
                      "Hardware: H100 (Grand Teton), 96GB HBM2e at 2.4 TB/s, 500 W; peaks "
                      "and NVLink of the H100 SXM5 datasheet"}
)  # fmt: skip
#: Micro-batches per pipeline of torchtitan's pipeline schedules at 9dec370 when the row
#: does not say: as many as pipeline stages of the whole pipeline (``build_pipeline_schedule``
#: with ``experimental.pipeline_parallel_microbatches`` unset: ``pipeline_parallel_degree
#: x len(stages)``, stages on all ranks, so pp x vpp under interleaving); interleaved
#: 1F1B with 2 virtual stages per rank (not stated; ``generate_split_points``' default for
#: multi-stage schedules).
TORCHTITAN_PP_VPP = 2


def is_dense_fp8_family_row(row: dict[str, str]) -> bool:
    """A dense run without context parallelism of an FP8 family (any precision)."""
    kind = note(row["notes"], "kind") or ""
    cp = note(row["notes"], "cp") or "1"
    return kind.startswith("dense") and cp == "1" and family(row) in FP8_FAMILY_FRAMEWORK


def row_precision(row: dict[str, str]) -> str:
    """``fp8`` or ``bf16``: the ``precision=`` note's first word."""
    return (note(row["notes"], "precision") or "bf16").split()[0]


def fp8_family_setup(row: dict[str, str], compute_efficiency: float | None = None) -> RowSetup:
    """A NeMo 24.07 or torchtitan row as an instance and a plan (assumptions in
    :mod:`pipette_cp.experiments.models.fp8_accuracy`)."""
    setup = row_setup(complete_row(row))
    fam, inst = family(row), setup.instance
    framework = FrameworkProfile(
        name=FP8_FAMILY_FRAMEWORK[fam], compute_efficiency=compute_efficiency
    )
    fp8 = row_precision(row) == "fp8"
    precision = {"precision": "fp8" if fp8 else "bf16"}
    if fam == "nemo":
        return replace(setup, instance=_nemo_instance(row, inst, framework, precision))
    return _torchtitan_setup(row, setup, framework, precision)


#: NeMo model families: (activation, norm, positions, vocabulary); Nemotron's squared ReLU
#: is two GEMMs of width f like GeLU.
_NEMO_MODELS = {
    "GPT-3": ("gelu", "layernorm", "learned", 51200),
    "Llama 2": ("swiglu", "rmsnorm", "rope", 32000),
    "Nemotron": ("gelu", "layernorm", "rope", 256000),
}


def _nemo_instance(
    row: dict[str, str], inst: Instance, framework: FrameworkProfile, precision: dict
) -> Instance:
    activation, norm, positions, vocab = next(
        v for k, v in _NEMO_MODELS.items() if row["model_name"].startswith(k)
    )
    model = inst.model.model_copy(
        update={"activation": activation, "norm": norm, "position_embedding": positions,
                "vocab_size": int(row["vocab_size"] or vocab),
                "linear_bias": activation == "gelu" and positions == "learned"}
    )  # fmt: skip
    training = inst.training.model_copy(update={**precision, "framework": framework})
    return inst.model_copy(update={"model": model, "training": training})


def _torchtitan_setup(
    row: dict[str, str], setup: RowSetup, framework: FrameworkProfile, precision: dict
) -> RowSetup:
    """torchtitan Llama 3.1 runs: FSDP2 (ZeRO-3) with TP (sequence parallel) and PP,
    SDPA FlashAttention 2, no dropout, fused kernels only under torch.compile, torchtitan's
    own H100 (:data:`TORCHTITAN_GPU`)."""
    inst, notes = setup.instance, row["notes"]
    model = inst.model.model_copy(
        update={"activation": "swiglu", "norm": "rmsnorm", "position_embedding": "rope",
                "rotary_base": 500000.0, "linear_bias": False}
    )  # fmt: skip
    compiled = (note(notes, "torch.compile") or "n") == "y"
    training = inst.training.model_copy(
        update={**precision, "framework": framework, "attention_kernel": "flash2",
                "flash_attention_available": True, "dropout": False, "fused_norm": compiled,
                "fused_bias_activation": compiled, "tp_comm_overlap": "async TP=y" in notes,
                "overlap_grad_reduce": True, "overlap_param_gather": True}
    )  # fmt: skip
    tp, pp, dp = int(row["tp"]), int(row["pp"]), int(row["dp"])
    local = int(re.search(r"local batch (\d+)", notes).group(1))  # type: ignore[union-attr]
    vpp = TORCHTITAN_PP_VPP if "Interleaved" in notes else 1
    # one micro-batch per stage of the pipeline, pp x vpp (TORCHTITAN_PP_VPP)
    mb = int(row["micro_batch_size"]) if row["micro_batch_size"] else local // (pp * vpp)
    # FSDP2 fully_shard is ZeRO-3; under pipeline parallelism torchtitan does not reshard
    # after forward (parallelize_llama.apply_fsdp), so the gathered weights and unsharded
    # gradients stay for the step: the optimizer state alone is sharded (ZeRO-1).
    sharding: Sharding = "optim_grads_params" if pp == 1 else "optim"
    plan = make_plan(
        num_layers=model.num_layers, dp=dp, pp=pp, tp=tp, micro_batch_size=mb, vpp=vpp,
        sequence_parallel=tp > 1, recompute=row["recompute"],  # type: ignore[arg-type]
        dp_sharding=sharding, flash_attention=True,
    )  # fmt: skip
    training = training.model_copy(update={"global_batch_size": local * dp})
    gpu = TORCHTITAN_GPU
    nodes = tuple(gpu.name for _ in inst.cluster.node_gpu_types)
    cluster = inst.cluster.model_copy(
        update={"gpu_types": {gpu.name: gpu}, "node_gpu_types": nodes}
    )
    instance = Instance(name=inst.name, model=model, cluster=cluster, training=training)
    return replace(setup, instance=instance, plan=plan)
