"""Each representable row of ``modern_runs.csv`` as an instance and a plan (the assumptions
where a row is silent are listed in :mod:`pipette_cp.experiments.models.modern_runs`)."""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

import numpy as np

from pipette_cp.clusters.expand import cluster_from_node_matrix
from pipette_cp.errors import SpecError
from pipette_cp.experiments.models.calibration_split import modern_source as source_family
from pipette_cp.experiments.models.modern_runs.features import (
    BUNDLED,
    GPT_OSS,
    Skip,
    approximations,
    catalogue_gpu,
    check_representable,
    first_word,
    hint,
    is_moe,
    lora,
    model_key,
    precision_label,
    seq_length,
    true_cell,
)
from pipette_cp.io.huggingface.config import model_from_hf_config
from pipette_cp.io.model_file import load_model
from pipette_cp.specs.cluster import ClusterSpec
from pipette_cp.specs.gpu import GpuSpec
from pipette_cp.specs.instance import Instance
from pipette_cp.specs.layouts import even_split, make_plan
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import FrameworkProfile, Recompute, TrainingSpec
from pipette_cp.units import GB

#: Largest cluster built for a row: larger runs keep their micro-batches per pipeline on
#: fewer data-parallel replicas (as :data:`pipette_cp.experiments.models.accuracy.MAX_GPUS`).
MAX_GPUS = 2048
#: NVLink at this share of the GPU's per-direction datasheet value (as the other sets).
NVLINK_SHARE = 0.8
#: A NIC's share of its line rate under load (400 Gb/s -> 40 GB/s, as the other sets).
NIC_SHARE = 0.8
#: Compute NIC line rate, Gb/s, where the row's ``interconnect`` is blank: ConnectX-7
#: (400 Gb/s) on DGX H100 / H200 / B200 / GB200, ConnectX-8 (800 Gb/s) on B300 / GB300.
DEFAULT_NIC_GBPS = {"H100": 400, "H200": 400, "B200": 400, "GB200": 400, "B300": 800,
                    "GB300": 800}  # fmt: skip
#: Frameworks (:data:`pipette_cp.cost.stack.frameworks.FRAMEWORKS`): MLPerf's NVIDIA
#: implementations run NeMo; Megatron-Bridge drives the Megatron-Core of its release.
FRAMEWORK = {"mlperf": "nemo", "bridge": "megatron-bridge"}
#: FP8 recipes whose Megatron-Bridge mixed-precision preset turns FP8 primary weights on
#: (``fp8_param_gather=True`` in ``bf16_with_fp8_delayed_scaling_mixed``,
#: ``bf16_with_fp8_current_scaling_mixed`` and ``bf16_with_mxfp8_mixed`` of
#: ``src/megatron/bridge/training/mixed_precision.py``; the subchannel (blockwise) preset
#: leaves it off).
BRIDGE_FP8_PARAM_RECIPES = frozenset({"delayed", "tensorwise", "mxfp8"})

#: openai/gpt-oss-120b ``config.json`` (quantization_config left out): the public model
#: the Megatron-Bridge GPT-OSS 120B recipe loads.
GPT_OSS_120B_CONFIG = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
    "initial_context_length": 4096, "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
    "num_experts_per_tok": 4, "num_hidden_layers": 36, "num_key_value_heads": 8,
    "num_local_experts": 128, "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn",
                     "truncate": False},
    "rope_theta": 150000, "sliding_window": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": False, "vocab_size": 201088,
}  # fmt: skip

#: Row shape columns and the ModelSpec fields they set.
SHAPE_COLUMNS = {"num_layers": "num_layers", "hidden_size": "hidden_size",
                 "ffn_hidden_size": "ffn_hidden_size", "num_heads": "num_attention_heads",
                 "num_kv_heads": "num_kv_heads", "vocab_size": "vocab_size"}  # fmt: skip


@dataclass(frozen=True)
class ModernSetup:
    """One row rebuilt: instance and plan (``dp_scale``: the row's dp over the plan's,
    > 1 where the run was larger than :data:`MAX_GPUS`), the measured step time (s),
    tokens/s/GPU and memory (GiB as logged, ``nan`` where not), and what is approximated."""

    row_id: str
    instance: Instance
    plan: Plan
    num_gpus: int
    dp_scale: float
    measured_step_s: float
    measured_tokens_per_gpu: float
    measured_mem_gib: float
    approximations: tuple[str, ...]


def _int(cell: str, default: int) -> int:
    return int(float(cell)) if cell.strip() else default


def _flag(cell: str, default: bool) -> bool:
    word = first_word(hint(cell)).lower()
    return {"true": True, "false": False}.get(word, default)


# ------------------------------------------------------------------------ model
@functools.lru_cache(maxsize=16)
def _base_model(key: str) -> ModelSpec:
    if key == GPT_OSS:
        return model_from_hf_config(GPT_OSS_120B_CONFIG, "gpt-oss-120b", "openai/gpt-oss-120b")
    return load_model(BUNDLED[key])


def row_model(row: dict[str, str]) -> ModelSpec:
    """The catalogue model the row names with the row's shape columns where given (the
    MLPerf Llama 3.1 405B vocabulary), its sequence length, no MTP module for a model
    named "w/o MTP", and capacity factor 1.0 for a "tokendrop" model."""
    base = _base_model(model_key(row))
    update: dict[str, object] = {
        field: int(row[col]) for col, field in SHAPE_COLUMNS.items() if row[col].strip()
    }
    update["max_seq_length"] = max(base.max_seq_length, seq_length(row))
    if "w/o MTP" in row["model_name"]:
        update["mtp_layers"] = 0
    if "tokendrop" in row["model_name"]:
        update["moe_capacity_factor"] = 1.0
    return ModelSpec.model_validate({**base.model_dump(), **update})


# ---------------------------------------------------------------------- cluster
def nic_bytes_per_s(row: dict[str, str]) -> float:
    """One compute NIC per GPU at :data:`NIC_SHARE` of the line rate the row's
    ``interconnect`` names (``Compute: 8x ... 400Gb/s``, ``4x ConnectX-7 ... 400 Gb/s``),
    else :data:`DEFAULT_NIC_GBPS`."""
    text = row["interconnect"]
    text = text.split("Compute:", 1)[1] if "Compute:" in text else text.split("|")[-1]
    rates = [int(g) for g in re.findall(r"(\d+)\s*Gb/s", text)]
    gbps = max(rates) if rates else DEFAULT_NIC_GBPS[row["gpu_type"]]
    return NIC_SHARE * gbps / 8 * GB


@functools.lru_cache(maxsize=64)
def _cluster(gpu: GpuSpec, num_gpus: int, per_node: int, domain_nodes: int,
             nic: float) -> ClusterSpec:  # fmt: skip
    nodes = -(-num_gpus // per_node)
    nodes = -(-nodes // domain_nodes) * domain_nodes
    domain = np.arange(nodes) // domain_nodes
    nvlink = NVLINK_SHARE * gpu.nvlink_bandwidth_bytes_per_s
    matrix = np.where(domain[:, None] == domain[None, :], nvlink, nic)
    return cluster_from_node_matrix(
        node_bandwidth=matrix, intra_node=nvlink, gpus_per_node=per_node, gpu=gpu,
        nics_per_node=per_node, nic_bandwidth_bytes_per_s=nic,
        name=f"nominal-{gpu.name}-{nodes}x{per_node}",
        source="nominal (pipette_cp.experiments.models.modern_runs)",
        nodes_per_nvlink_domain=domain_nodes,
    )  # fmt: skip


def segment_trays(row: dict[str, str]) -> int:
    """Nodes (trays) per NVLink domain of the row's job: the ``nvlink_segment_trays`` the
    config sets (a Slurm segment); else, on a rack of ``nvlink_domain_gpus``, the job's
    trays spread evenly over as few racks as hold them (the largest divisor of the job's
    trays that a rack holds: 16 of 18 for the 256-GPU jobs, as the MLPerf configs'
    ``SEGMENT=16`` does); 1 on 8-GPU nodes."""
    per_node = _int(row["gpus_per_node"], 8)
    rack = _int(row["nvlink_domain_gpus"], per_node) // per_node
    if row["nvlink_segment_trays"].strip():
        return int(row["nvlink_segment_trays"])
    trays = -(-int(row["num_gpus"]) // per_node)
    return max(d for d in range(1, min(rack, trays) + 1) if trays % d == 0)


def row_cluster(row: dict[str, str], gpu: GpuSpec, num_gpus: int) -> ClusterSpec:
    """Nodes of ``gpus_per_node`` GPUs in NVLink domains of :func:`segment_trays` nodes
    (``num_gpus``: the GPUs built, see :data:`MAX_GPUS`); one NIC per GPU
    (:func:`nic_bytes_per_s`)."""
    per_node = _int(row["gpus_per_node"], 8)
    return _cluster(gpu, num_gpus, per_node, segment_trays(row), nic_bytes_per_s(row))


# --------------------------------------------------------------------- training
def is_bridge(row: dict[str, str]) -> bool:
    """A Megatron-Bridge performance-table row (its performance scripts set what the
    table leaves unsaid: :func:`row_recompute`, :func:`bridge_fp8_param_gather`,
    :func:`row_setup`'s bf16 gradient reduction)."""
    return source_family(row) == "bridge"


def bridge_fp8_param_gather(row: dict[str, str]) -> bool:
    """FP8 primary weights: as the row states, else on for a Megatron-Bridge row whose FP8
    recipe's preset turns them on (:data:`BRIDGE_FP8_PARAM_RECIPES`) and that runs the
    distributed optimizer (the knob's rule; a Megatron-FSDP row keeps bf16 weights, as
    the model has no FP8 primary weights under ZeRO-3), else off."""
    if row["fp8_param_gather"].strip():
        return _flag(row["fp8_param_gather"], False)
    fsdp = _int(row["fsdp"], 0) > 0
    return is_bridge(row) and row_fp8_recipe(row) in BRIDGE_FP8_PARAM_RECIPES and not fsdp


def row_fp8_recipe(row: dict[str, str]) -> str:
    """The FP8 recipe of the row's precision label (``mxfp8``, or ``fp8-delayed`` ->
    ``delayed``); the label itself for bf16 and NVFP4 rows."""
    label = precision_label(row)
    return label if label == "mxfp8" else label.removeprefix("fp8-")


def row_training(row: dict[str, str], global_batch: int) -> TrainingSpec:
    """The row's precision (NVFP4 rows as ``fp4``) and FP8 recipe, overlap flags (stated,
    else on), dispatcher;
    Transformer Engine's cuDNN fused attention on every GPU, in FP8 where the row says so
    (MLPerf's ``FP8_DPA``); the layers kept in bf16 as the row states them
    (:func:`bf16_end_layers`); LoRA rows with the MLPerf benchmark's adapters
    (:data:`.features.MLPERF_LORA`)."""
    label = precision_label(row)
    fp8 = label not in ("bf16", "nvfp4")
    recipe = row_fp8_recipe(row)
    fmt = first_word(row["fp8_format"]) or None
    tp = _int(row["tp"], 1)
    flex = "flex" in row["notes"].lower()
    first, last = bf16_end_layers(row) if fp8 or label == "nvfp4" else (0, 0)
    return TrainingSpec(
        global_batch_size=global_batch, seq_length=seq_length(row), lora=lora(row),
        precision="fp8" if fp8 else "fp4" if label == "nvfp4" else "bf16",
        fp8_recipe=recipe if fp8 else None,  # type: ignore[arg-type]
        fp8_format=fmt if fp8 else None,  # type: ignore[arg-type]
        overlap_grad_reduce=_flag(row["overlap_grad_reduce"], True),
        overlap_param_gather=_flag(row["overlap_param_gather"], True),
        tp_comm_overlap=_flag(row["tp_comm_overlap"], tp > 1), dropout=False,
        fused_cross_entropy=True, moe_token_dispatcher="flex" if flex else "alltoall",
        moe_grouped_gemm=True, moe_pad_to_capacity="tokendrop" in row["model_name"],
        attention_kernel="cudnn", fp8_attention=true_cell(row["fp8_attention"]),
        bf16_first_layers=first, bf16_last_layers=last,
        framework=FrameworkProfile(name=FRAMEWORK[source_family(row)]),
    )  # fmt: skip


#: Megatron-Bridge's Nemotron-H providers keep the first and last layer in bf16 under
#: FP8 and NVFP4 (``NemotronHModelProvider.first_last_layers_bf16 = True``,
#: ``src/megatron/bridge/models/nemotronh/nemotron_h_provider.py``, with Megatron's
#: ``num_layers_at_start_in_bf16`` and ``num_layers_at_end_in_bf16`` of 1).
NEMOTRON_BF16_END_LAYERS = (1, 1)


def bf16_end_layers(row: dict[str, str]) -> tuple[int, int]:
    """The layers kept in bf16 at the start and the end: as the row states them
    (``first/last``), else Nemotron-H's provider default on a Megatron-Bridge Nemotron row
    (:data:`NEMOTRON_BF16_END_LAYERS`), else none."""
    stated = re.fullmatch(r"(\d+)/(\d+)", first_word(row["bf16_first_last_layers"]))
    if stated:
        return int(stated.group(1)), int(stated.group(2))
    if is_bridge(row) and model_key(row).startswith("nemotron"):
        return NEMOTRON_BF16_END_LAYERS
    return 0, 0


# ------------------------------------------------------------------------- plan
def row_recompute(row: dict[str, str]) -> tuple[Recompute, tuple[str, ...] | None]:
    """The recomputation and its modules (Megatron-Core's ``--recompute-modules``): ``full``
    where the row (or its recipe hint) says granularity full; ``selective`` with the
    modules it names (``selective modules 'mlp'``, ``granularity "selective", modules
    ["layernorm", "moe_act"]``), and on a Megatron-Bridge row with modules and the
    granularity unset (its performance scripts' ``_set_recompute_overrides`` sets
    ``recompute_granularity = "selective"`` with the workload's ``recompute_modules``,
    ``scripts/performance/utils/overrides.py``); else none: elsewhere a granularity left
    unset leaves Megatron's recomputation off whatever modules are listed, and a
    selective one with no module recomputes nothing."""
    cell = hint(row["recompute"])
    if not cell and (preset := bridge_preset_modules(row)):
        return "selective", preset
    if cell == "full" or 'granularity "full"' in cell:
        return "full", None
    found = re.search(r"modules (\[[^\]]*\]|'[^']+')", cell)
    names = tuple(re.findall(r"\w+", found.group(1))) if found else ()
    selective = (cell.startswith("selective") or 'granularity "selective"' in cell
                 or (is_bridge(row) and "granularity unset" in cell))  # fmt: skip
    return ("selective", names) if selective and names else ("none", None)


#: Megatron-Bridge's Nemotron 3 performance presets that recompute named modules
#: (``scripts/performance/configs/nemotronh/nemotron_3_workload_base_configs.py`` at
#: commit 06e8da4e), by (model, GPU, precision), with the layout each states (GPUs,
#: global batch, micro-batch, ep): a row silent on recomputation whose layout is the
#: preset's gets its modules.  The other presets recompute nothing, or state another
#: layout than the tables (B200 FP8: ep 8 there, 64 in the tables).
BRIDGE_RECOMPUTE_PRESETS = {
    ("nemotron3nano", "H100", "fp8"): ((16, 1024, 1, 8), ("moe", "layernorm", "core_attn", "moe_act")),
    ("nemotron3nano", "H100", "bf16"): ((16, 1024, 1, 8), ("moe", "layernorm")),
}  # fmt: skip


def bridge_preset_modules(row: dict[str, str]) -> tuple[str, ...] | None:
    """The recompute modules of the row's Bridge preset (:data:`BRIDGE_RECOMPUTE_PRESETS`)
    when the row states the preset's layout; None otherwise."""
    if not is_bridge(row):
        return None
    key = (model_key(row), row["gpu_type"], row["precision"])
    if key not in BRIDGE_RECOMPUTE_PRESETS:
        return None
    layout, modules = BRIDGE_RECOMPUTE_PRESETS[key]
    stated = (_int(row["num_gpus"], 0), _int(row["global_batch"], 0),
              _int(row["micro_batch"], 1), _int(row["ep"], 1))  # fmt: skip
    return modules if stated == layout else None


def pipeline_layout_split(layout: str) -> tuple[int, ...]:
    """Layers per model chunk of a Megatron ``--pipeline-model-parallel-layout`` string
    (``t`` = a transformer layer, ``|`` ends a chunk, ``(x)*n`` and ``t*n`` repeat).

    >>> pipeline_layout_split("Et*4|(t*4|)*2tmL")
    (4, 4, 4, 1)
    """
    while (found := re.search(r"\(([^()]*)\)\*(\d+)", layout)) is not None:
        layout = layout[: found.start()] + found.group(1) * int(found.group(2)) + layout[found.end() :]  # fmt: skip
    layout = re.sub(r"t\*(\d+)", lambda m: "t" * int(m.group(1)), layout)
    return tuple(chunk.count("t") for chunk in layout.rstrip("|").split("|"))


def row_layer_split(row: dict[str, str], layers: int, pp: int, vpp: int) -> tuple[int, ...]:
    """The notes' ``PIPELINE_LAYOUT``; with ``asym_pp_embed_loss`` True/True the embedding
    and the loss each counted as a layer (the first and last chunk hold one layer fewer);
    else Megatron's even split."""
    if found := re.search(r"PIPELINE_LAYOUT '([^']+)'", row["notes"]):
        return pipeline_layout_split(found.group(1))
    if row["asym_pp_embed_loss"].startswith("True") and pp > 1:
        split = list(even_split(layers + 2, pp, vpp))
        split[0] -= 1
        split[-1] -= 1
        return tuple(split)
    return even_split(layers, pp, vpp)


def _model_dp(dp: int, tp: int, pp: int, cp: int, ep: int) -> int:
    """Data-parallel replicas built: the row's, or the most that fit :data:`MAX_GPUS` and
    keep the expert groups whole (etp 1: ep divides dp x cp x tp)."""
    if dp * tp * pp * cp <= MAX_GPUS:
        return dp
    fits = [d for d in range(1, dp + 1) if d * tp * pp * cp <= MAX_GPUS and d * cp * tp % ep == 0]
    if not fits:
        raise Skip(f"num_gpus={dp * tp * pp * cp}: no smaller model keeps ep={ep} whole")
    return max(fits)


def row_setup(row: dict[str, str]) -> ModernSetup:
    """The row as an instance and a plan; :class:`Skip` names what cannot be expressed."""
    check_representable(row)
    gpu = catalogue_gpu(row)
    assert gpu is not None  # check_representable skipped the rest
    model = row_model(row)
    tp, pp, cp = (_int(row[c], 1) for c in ("tp", "pp", "cp"))
    vpp, ep, mb = _int(row["vp"], 1), _int(row["ep"], 1), _int(row["micro_batch"], 1)
    num_gpus = int(row["num_gpus"])
    dp = num_gpus // (tp * pp * cp)
    gbs = int(row["global_batch"])
    if gbs % (dp * mb):
        raise Skip(f"global_batch={gbs}: not a multiple of dp x micro_batch = {dp * mb}")
    dp_model = _model_dp(dp, tp, pp, cp, ep)
    sharding = "optim_grads_params" if _int(row["fsdp"], 0) > 0 else None
    recompute, modules = row_recompute(row)
    try:
        plan = make_plan(
            num_layers=model.num_layers, dp=dp_model, pp=pp, tp=tp, cp=cp,
            ep=ep, etp=1 if is_moe(row) else None, vpp=vpp, micro_batch_size=mb,
            sequence_parallel=_flag(row["sequence_parallel"], tp > 1) and tp > 1,
            recompute=recompute, recompute_modules=modules, flash_attention=True,
            fp8_param_gather=bridge_fp8_param_gather(row),
            # Megatron-Bridge's performance scripts reduce gradients in bf16
            # (``grad_reduce_in_fp32 = False`` in the Llama 3 / 3.1, DeepSeek-V3 and
            # Qwen3 configs of ``scripts/performance/configs``, GPT-OSS's recipe).
            grad_reduce_in_bf16=is_bridge(row),
            layer_split=row_layer_split(row, model.num_layers, pp, vpp),
            **({"dp_sharding": sharding} if sharding else
               {"distributed_optimizer": _flag(row["distributed_optimizer"], True)}),
        )  # fmt: skip
        training = row_training(row, gbs // dp * dp_model)
        cluster = row_cluster(row, gpu, plan.num_gpus)
        instance = Instance(name=row["model_name"], model=model, cluster=cluster,
                            training=training)  # fmt: skip
    except (SpecError, ValueError) as error:
        raise Skip(f"layout not expressible: {str(error).splitlines()[0][:120]}") from error
    step = float(row["measured_step_time_s"])
    tokens = gbs * seq_length(row)
    per_gpu = float(row["tokens_per_s_per_gpu"] or tokens / (step * num_gpus))
    memory = row["measured_mem"]
    return ModernSetup(
        row["row_id"], instance, plan, num_gpus, dp / dp_model, step, per_gpu,
        float(memory) if memory else math.nan, approximations(row),
    )  # fmt: skip
