"""The mixture-of-experts and context-parallel rows of ``published_runs_moe_cp.csv`` as
instances and plans (the assumptions where a row is silent are listed in
:mod:`pipette_cp.experiments.models.moe_cp_accuracy`)."""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipette_cp.clusters.expand import cluster_from_node_matrix
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.experiments.models.accuracy import read_rows, row_setup
from pipette_cp.experiments.models.calibration_split import assign_split, family
from pipette_cp.experiments.models.published_runs_setup import (
    TORCHTITAN_GPU,
    Skip,
    complete_row,
    fp8_family_setup,
    note,
    row_precision,
)
from pipette_cp.io.model_file import load_model
from pipette_cp.io.paths import INSTANCES_DIR
from pipette_cp.specs.cluster import ClusterSpec
from pipette_cp.specs.gpu import GpuSpec, resolve_gpu
from pipette_cp.specs.instance import Instance
from pipette_cp.specs.layouts import make_plan
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import Dispatcher, FrameworkProfile, Recompute, TrainingSpec
from pipette_cp.units import GB, TFLOPS

#: The bundled copy of the runs with experts, context parallelism or FP8.
MOE_CP_CSV = INSTANCES_DIR / "calibration" / "published_runs_moe_cp.csv"
#: Nominal fabric (as :func:`pipette_cp.experiments.models.accuracy.row_setup` builds for
#: Megatron-Core rows): NVLink at this share of the GPU's per-direction datasheet value ...
NVLINK_SHARE = 0.8
#: ... and one 400 Gb/s NIC per GPU delivering this much under load, bytes/s.
NIC_BYTES_PER_S = 40 * GB
#: GB200 compute trays per NVLink domain of each GB200 run, keyed by (precision, sequence
#: length): the ``SEGMENT=`` of the readme's commands (Slurm segments of trays inside one
#: NVL72 rack; the rest of a rack is not counted on).
GB200_SEGMENTS = {("bf16", 4096): 2, ("mxfp8", 4096): 16, ("mxfp8", 131072): 8}


def is_moe_row(row: dict[str, str]) -> bool:
    """A run with experts (``kind=moe...``)."""
    return (note(row["notes"], "kind") or "").startswith("moe")


def row_cp(row: dict[str, str]) -> int:
    """The row's context-parallel size (``cp=`` note, 1 when absent)."""
    return int(note(row["notes"], "cp") or "1")


def is_moe_cp_row(row: dict[str, str]) -> bool:
    """A row this experiment rebuilds: experts, or context parallelism (cp > 1)."""
    return is_moe_row(row) or row_cp(row) > 1


def is_fp8_row(row: dict[str, str]) -> bool:
    """FP8 (or MXFP8) training."""
    return row_precision(row) in ("fp8", "mxfp8")


def selected_rows(path: Path = MOE_CP_CSV) -> list[tuple[int, dict[str, str], str]]:
    """(index, row, side of the split) of every MoE row and every row with cp > 1."""
    rows = read_rows(path)
    sides = assign_split(rows)
    return [(i, r, s) for i, (r, s) in enumerate(zip(rows, sides, strict=True)) if is_moe_cp_row(r)]  # fmt: skip


_PAIR = re.compile(r"= (\d+(?:\.\d+)?) with forced expert balance, (\d+(?:\.\d+)?) dropless")


def forced_and_dropless(row: dict[str, str]) -> tuple[float, float] | None:
    """The TFLOP/s per GPU printed with routing forced to balance and dropless, if both."""
    found = _PAIR.search(row["notes"])
    return (float(found.group(1)), float(found.group(2))) if found else None


@dataclass(frozen=True)
class MoeCpSetup:
    """One row rebuilt: the instance, the plan and the measured step time (s) and peak
    memory (GiB, ``nan`` where the row prints none)."""

    family: str
    name: str
    instance: Instance
    plan: Plan
    fp8: bool
    measured_step_s: float
    measured_from: str
    measured_mem_gib: float


# ----------------------------------------------------------------------- clusters
@functools.lru_cache(maxsize=64)
def nominal_cluster(gpu: GpuSpec, num_gpus: int, gpus_per_node: int = 8) -> ClusterSpec:
    """Nodes of ``gpus_per_node`` GPUs on NVLink, a NIC of :data:`NIC_BYTES_PER_S` per GPU
    (cached: the clusters are read-only)."""
    nodes = -(-num_gpus // gpus_per_node)
    return cluster_from_node_matrix(
        node_bandwidth=np.full((nodes, nodes), NIC_BYTES_PER_S),
        intra_node=NVLINK_SHARE * gpu.nvlink_bandwidth_bytes_per_s,
        gpus_per_node=gpus_per_node, gpu=gpu, nics_per_node=gpus_per_node,
        nic_bandwidth_bytes_per_s=NIC_BYTES_PER_S, name=f"nominal-{nodes}x{gpus_per_node}",
        source="nominal (pipette_cp.experiments.models.moe_cp_setup)",
    )  # fmt: skip


@functools.lru_cache(maxsize=16)
def gb200_cluster(num_gpus: int, per: int) -> ClusterSpec:
    """GB200 NVL72: trays of 4 GPUs, ``per`` trays per NVLink domain (NVLink between every
    pair of a domain), one NIC per GPU across domains."""
    gpu = resolve_gpu("gb200")
    trays = -(-num_gpus // 4)
    trays = -(-trays // per) * per
    domain = np.arange(trays) // per
    nvlink = NVLINK_SHARE * gpu.nvlink_bandwidth_bytes_per_s
    matrix = np.where(domain[:, None] == domain[None, :], nvlink, NIC_BYTES_PER_S)
    return cluster_from_node_matrix(
        node_bandwidth=matrix, intra_node=nvlink, gpus_per_node=4, gpu=gpu, nics_per_node=4,
        nic_bandwidth_bytes_per_s=NIC_BYTES_PER_S, name=f"nominal-gb200-{trays}x4",
        source="nominal GB200 NVL72 (pipette_cp.experiments.models.moe_cp_setup)",
        nodes_per_nvlink_domain=per,
    )  # fmt: skip


# --------------------------------------------------------------- measured values
def megatron_flops_per_token(model: ModelSpec, seq: int) -> float:
    """Model FLOPs per token as Megatron-Core's ``--log-throughput`` counts them
    (``num_floating_point_operations``): 12 L h^2 ((1 + g/a + s/2h) q/h) for attention
    (causal half), 12 h x topk x moe_ffn x 3/2 (SwiGLU) per MoE layer, 6 V h for the
    logits; no router, no norms."""
    h, layers = model.hidden_size, model.num_layers
    q = model.num_attention_heads * model.head_size
    gated = 1.5 if model.activation == "swiglu" else 1.0
    attention = (1 + model.kv_heads / model.num_attention_heads + seq / h / 2) * q / h
    attention *= 12 * layers * h * h
    mlp_width = model.moe_top_k * model.expert_width if model.is_moe else model.ffn_hidden_size
    mlp = 12 * layers * h * mlp_width * gated
    return attention + mlp + 6 * model.vocab_size * h


def _first_number(text: str | None) -> float | None:
    return float(text.split()[0]) if text else None


def measured_step_s(row: dict[str, str], instance: Instance, plan: Plan) -> tuple[float, str]:
    """The row's step time, s, and where it comes from: the ``step_time_s=`` note; else
    ``tokens_per_s_per_gpu``; else the printed TFLOP/s per GPU with
    :func:`megatron_flops_per_token` (Megatron-MoE-ModelZoo prints MCore model FLOPs)."""
    training = instance.training
    tokens = training.global_batch_size * training.seq_length
    if (step := _first_number(note(row["notes"], "step_time_s"))) is not None:
        return step, "step_time_s"
    if (tps := _first_number(note(row["notes"], "tokens_per_s_per_gpu"))) is not None:
        return tokens / (tps * plan.num_gpus), "tokens/s"
    tflops = float(row["measured_tflops_per_gpu"])
    flops = megatron_flops_per_token(instance.model, training.seq_length) * tokens
    return flops / (tflops * TFLOPS * plan.num_gpus), "TFLOP/s"


# -------------------------------------------------------------------------- rows
def moe_cp_setup(
    row: dict[str, str], *, load_imbalance: float = 1.0, fp8_moe_efficiency: float | None = None
) -> MoeCpSetup:
    """The row as an instance and a plan; :class:`Skip` for a row the models cannot
    express.  ``load_imbalance``: ``TrainingSpec.moe_load_imbalance`` of the dropless
    (Megatron-MoE-ModelZoo) rows; ``fp8_moe_efficiency``: the framework's
    ``compute_efficiency`` of NeMo's FP8 MoE (Grok-1) rows (None: NeMo's)."""
    fam = family(row)
    if fam == "dgxc-moe":
        instance, plan = _grok(row, fp8_moe_efficiency)
    elif fam == "megatron-moe":
        instance, plan = _qwen(row, load_imbalance)
    elif fam in ("nemo", "torchtitan"):
        instance, plan = _dense_cp(row)
    else:
        raise Skip(f"family {fam} (no setup)")
    step, source = measured_step_s(row, instance, plan)
    memory = row["measured_mem_gb_per_gpu"]
    return MoeCpSetup(
        fam, row["model_name"], instance, plan, is_fp8_row(row), step, source,
        float(memory) if memory else math.nan,
    )  # fmt: skip


def _layout(row: dict[str, str]) -> dict:
    return {
        "tp": int(row["tp"]), "pp": int(row["pp"]), "dp": int(row["dp"]), "cp": row_cp(row),
        "ep": int(note(row["notes"], "ep") or "1"),
        "micro_batch_size": int(row["micro_batch_size"] or 1),
        "vpp": int(row["virtual_pp"] or 1),
    }  # fmt: skip


@functools.lru_cache(maxsize=8)
def _bundled(name: str) -> ModelSpec:
    return load_model(name)


def _model(name: str, row: dict[str, str], **update: object) -> ModelSpec:
    base = _bundled(name)
    seq = int(row["seq_len"])
    fields = {**base.model_dump(), "max_seq_length": max(seq, base.max_seq_length), **update}
    return ModelSpec.model_validate(fields)


def _grok(row: dict[str, str], fp8_efficiency: float | None) -> tuple[Instance, Plan]:
    """NeMo's Grok-1 recipe (dgxc-benchmarking): the bundled grok-1 at the row's depth and
    vocabulary, capacity factor 1.0 padded to capacity, no grouped GEMM, etp = tp."""
    model = _model("grok-1", row, num_layers=int(row["num_layers"]),
                   vocab_size=int(row["vocab_size"]), moe_capacity_factor=1.0)  # fmt: skip
    fp8 = is_fp8_row(row)
    training = TrainingSpec(
        global_batch_size=int(row["global_batch_size"]), seq_length=int(row["seq_len"]),
        precision="fp8" if fp8 else "bf16", fp8_recipe="delayed" if fp8 else None,
        fp8_format="hybrid" if fp8 else None, overlap_grad_reduce=True,
        overlap_param_gather=True, tp_comm_overlap=True, dropout=False,
        moe_token_dispatcher="alltoall", moe_grouped_gemm=False, moe_pad_to_capacity=True,
        framework=FrameworkProfile(name="nemo", compute_efficiency=fp8_efficiency if fp8 else None),
    )  # fmt: skip
    layout = _layout(row)
    plan = make_plan(
        num_layers=model.num_layers, **layout, etp=layout["tp"], sequence_parallel=True,
        recompute="none", distributed_optimizer=True, flash_attention=True,
    )  # fmt: skip
    cluster = nominal_cluster(resolve_gpu("h100"), plan.num_gpus)
    return Instance(name=row["model_name"], model=model, cluster=cluster, training=training), plan


#: Megatron-MoE-ModelZoo recompute columns as the cost model's granularity: only ``full``
#: is Megatron's full recomputation; the selective modules (layernorm, moe_act, moe) are
#: not the attention core that the model's ``selective`` recomputes.
_QWEN_RECOMPUTE: dict[str, Recompute] = {"full": "full", "selective": "none", "": "none",
                                         "none": "none"}  # fmt: skip


def _dispatcher(row: dict[str, str]) -> Dispatcher:
    """The notes' dispatcher: DeepEP and HybridEP as Megatron's flex dispatcher (node
    de-duplication), A2A as alltoall."""
    name = note(row["notes"], "dispatcher") or "A2A"
    return "flex" if name.lower() in ("deepep", "hybridep") else "alltoall"


def _qwen(row: dict[str, str], imbalance: float) -> tuple[Instance, Plan]:
    """Megatron-MoE-ModelZoo's Qwen3-235B-A22B runs (model yaml: distributed optimizer,
    overlapped grad reduce and param gather, SP, flash attention, no dropout, fused
    cross-entropy, grouped GEMM, etp 1)."""
    if "FSDP" in row["distributed_optimizer_or_zero"]:
        raise Skip("Megatron-FSDP (parameters and gradients sharded) of a mixture-of-experts "
                   "model is not modelled (layout_check refuses ZeRO-2/3 with experts)")  # fmt: skip
    model = _model("qwen3-235b-a22b", row)
    gb200 = row["gpu_type"].startswith("GB200")
    fp8 = is_fp8_row(row)
    if fp8 and not gb200:
        raise Skip("MXFP8 needs a Blackwell GPU")
    training = TrainingSpec(
        global_batch_size=int(row["global_batch_size"]), seq_length=int(row["seq_len"]),
        precision="fp8" if fp8 else "bf16", fp8_recipe="mxfp8" if fp8 else None,
        overlap_grad_reduce=True, overlap_param_gather=True, tp_comm_overlap=False,
        dropout=False, fused_cross_entropy=True, moe_token_dispatcher=_dispatcher(row),
        moe_grouped_gemm=True, moe_load_imbalance=imbalance,
        framework=FrameworkProfile(name="megatron-core"),
    )  # fmt: skip
    layout = _layout(row)
    plan = make_plan(
        num_layers=model.num_layers, **layout, etp=1, sequence_parallel=layout["tp"] > 1,
        recompute=_QWEN_RECOMPUTE[row["recompute"]], distributed_optimizer=True,
        flash_attention=True,
    )  # fmt: skip
    if gb200:
        segment = GB200_SEGMENTS[(row_precision(row), training.seq_length)]
        cluster = gb200_cluster(plan.num_gpus, segment)
    else:
        cluster = nominal_cluster(resolve_gpu("h100"), plan.num_gpus)
    return Instance(name=row["model_name"], model=model, cluster=cluster, training=training), plan


def _dense_cp(row: dict[str, str]) -> tuple[Instance, Plan]:
    """A NeMo 24.07 or torchtitan dense row with cp > 1: the FP8 experiment's setup
    (:func:`~pipette_cp.experiments.models.published_runs_setup.fp8_family_setup`) with the
    row's cp and a cluster of ``tp x pp x dp x cp`` GPUs."""
    if family(row) == "nemo" and row["model_name"].startswith("Llama 3"):
        inst, base = _nemo_llama3(row)
    else:
        setup = fp8_family_setup(row)
        inst, base = setup.instance, setup.plan
    plan = make_plan(
        num_layers=inst.model.num_layers, dp=base.dp, pp=base.pp, tp=base.tp,
        micro_batch_size=base.micro_batch_size, cp=row_cp(row), vpp=base.vpp,
        sequence_parallel=base.sequence_parallel, recompute=base.recompute,
        distributed_optimizer=base.distributed_optimizer, flash_attention=base.flash_attention,
        dp_sharding=base.dp_sharding, attention_kernel=base.attention_kernel,
        fused_norm=base.fused_norm,
    )  # fmt: skip
    gpu = TORCHTITAN_GPU if family(row) == "torchtitan" else resolve_gpu("h100")
    cluster = nominal_cluster(gpu, plan.num_gpus)
    instance = Instance(name=inst.name, model=inst.model, cluster=cluster, training=inst.training)
    return instance, plan


def _nemo_llama3(row: dict[str, str]) -> tuple[Instance, Plan]:
    """A NeMo 24.07 Llama 3 row as the FP8 experiment sets up NeMo's other rows
    (:func:`~pipette_cp.experiments.models.accuracy.row_setup`'s Megatron-Core settings, FP8 with
    Transformer Engine's delayed scaling) with Llama 3's SwiGLU, RMSNorm, RoPE (base
    500000), no biases and the row's vocabulary; cp = 1 here."""
    setup = row_setup(complete_row(row))
    inst = setup.instance
    model = inst.model.model_copy(
        update={"activation": "swiglu", "norm": "rmsnorm", "position_embedding": "rope",
                "rotary_base": 500000.0, "linear_bias": False,
                "vocab_size": int(row["vocab_size"])}
    )  # fmt: skip
    precision = "fp8" if is_fp8_row(row) else "bf16"
    training = inst.training.model_copy(
        update={"precision": precision, "framework": FrameworkProfile(name="nemo")}
    )
    instance = Instance(name=inst.name, model=model, cluster=inst.cluster, training=training)
    return instance, setup.plan


# ----------------------------------------------------------------- dropless pairs
@dataclass(frozen=True)
class DroplessPair:
    """A run measured with routing forced to balance and dropless: the dropless step time
    (s) and its slowdown over the forced run, measured and predicted."""

    index: int
    side: str
    layout: str
    measured_s: float
    predicted_s: float
    measured_ratio: float
    predicted_ratio: float

    @property
    def ratio_error(self) -> float:
        """(predicted - measured) / measured slowdown."""
        return self.predicted_ratio / self.measured_ratio - 1.0

    @property
    def error(self) -> float:
        """(predicted - measured) / measured dropless step time."""
        return self.predicted_s / self.measured_s - 1.0


@dataclass(frozen=True)
class PairRow:
    """A row printing forced-balance and dropless throughput: its forced-balance setup,
    predicted step time (s) and measured dropless slowdown (forced / dropless TFLOP/s)."""

    index: int
    side: str
    setup: MoeCpSetup
    forced_s: float
    slowdown: float


def with_training(instance: Instance, **update: object) -> Instance:
    """``instance`` with training fields replaced, the same cluster object (so that the
    evaluators share its fabric)."""
    return instance.model_copy(update={"training": instance.training.model_copy(update=update)})


def pair_rows() -> list[PairRow]:
    """Every selected row printing forced-balance and dropless throughput."""
    out = []
    for i, row, side in selected_rows():
        if found := forced_and_dropless(row):
            st = moe_cp_setup(row)
            forced_s = Evaluator(st.instance).iteration_time(st.plan)
            out.append(PairRow(i, side, st, forced_s, found[0] / found[1]))
    return out


def dropless_pairs(imbalance: float, rows: list[PairRow] | None = None) -> list[DroplessPair]:
    """The dropless runs predicted with ``moe_load_imbalance = imbalance`` (``rows``:
    :func:`pair_rows`, computed if not given)."""
    pairs = []
    for p in rows if rows is not None else pair_rows():
        inst = with_training(p.setup.instance, moe_load_imbalance=imbalance)
        t = Evaluator(inst).iteration_time(p.setup.plan)
        measured = p.setup.measured_step_s * p.slowdown
        pairs.append(DroplessPair(p.index, p.side, p.setup.plan.layout(), measured, t,
                                  p.slowdown, t / p.forced_s))  # fmt: skip
    return pairs
