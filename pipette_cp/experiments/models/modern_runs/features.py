"""What a row of ``modern_runs.csv`` says, read column by column: its source family,
model, GPU family, precision, and the features the models cannot express (the reasons a
row is skipped) or express only approximately (listed beside its prediction)."""

from __future__ import annotations

import csv
from pathlib import Path

from pipette_cp.errors import SpecError
from pipette_cp.experiments.models.calibration_split import modern_model as model_key
from pipette_cp.io.paths import INSTANCES_DIR
from pipette_cp.specs.gpu import GpuSpec, resolve_gpu
from pipette_cp.specs.lora import LoraSpec

#: The bundled copy of the 2024-2026 runs.
MODERN_CSV = INSTANCES_DIR / "calibration" / "modern_runs.csv"

#: Columns the experiment reads (the copy must carry them all).
READ_COLUMNS = (
    "row_id", "round", "source_repo", "kind", "model_name", "num_layers", "hidden_size",
    "ffn_hidden_size", "num_heads", "num_kv_heads", "vocab_size", "seq_len", "gpu_type",
    "num_gpus", "gpus_per_node", "nvlink_domain_gpus", "nvlink_segment_trays",
    "interconnect", "global_batch", "micro_batch", "tp", "pp", "cp", "vp", "ep", "etp",
    "fsdp", "sequence_parallel", "recompute", "precision", "fp8_recipe", "fp8_format",
    "fp4_recipe", "fp8_param_gather", "fp8_attention", "tp_comm_overlap",
    "overlap_grad_reduce", "overlap_param_gather", "distributed_optimizer", "cpu_offload",
    "cuda_graph", "asym_pp_embed_loss", "measured_step_time_s", "tokens_per_s_per_gpu",
    "measured_mem", "duplicate_of", "notes",
)  # fmt: skip

#: GPU families of the report: the catalogue's GPU types by generation and packaging.
GPU_FAMILIES = {"H100": "H100/H200", "H200": "H100/H200", "B200": "B200/B300",
                "B300": "B200/B300", "GB200": "GB200/GB300", "GB300": "GB200/GB300"}  # fmt: skip
#: Report labels of the precisions (FP8 by its scaling recipe).
PRECISIONS = ("bf16", "fp8-delayed", "fp8-tensorwise", "fp8-blockwise", "mxfp8", "nvfp4",
              "unstated")  # fmt: skip
#: Hybrid Mamba-Transformer rows the models cannot express, by normalised model name
#: prefix, and why.
UNPRICED_HYBRIDS = {"nemotron3ultra": "no public configuration of the model"}
#: Bundled models (``pipette-cp list models``) by normalised row model name; GPT-OSS is
#: built from its Hugging Face config (:mod:`.build`).
BUNDLED = {
    "gpt3175b": "gpt3-175b", "llama318b": "llama-3.1-8b", "llama38b": "llama-3-8b",
    "llama31405b": "llama-3.1-405b", "deepseekv3": "deepseek-v3",
    "deepseekv3671b": "deepseek-v3", "qwen3235ba22b": "qwen3-235b-a22b",
    "qwen330ba3b": "qwen3-30b-a3b", "llama270blora": "llama-2-70b",
    "nemotron3nano": "nemotron-3-nano", "nemotron3super": "nemotron-3-super",
}  # fmt: skip
GPT_OSS = "gptoss120b"


#: MLPerf Training's Llama 2 70B LoRA benchmark (mlcommons/training ``llama2_70b_lora``,
#: the settings NVIDIA's NeMo implementation keeps): adapters of rank 16, alpha 32, on
#: the attention's QKV and output projections; sequences of 8,192 tokens.  The rows'
#: logs are not re-read for them.
MLPERF_LORA = LoraSpec(rank=16, alpha=32.0, target_modules=("linear_qkv", "linear_proj"))
MLPERF_LORA_SEQ_LENGTH = 8192


class Skip(Exception):
    """A row the models cannot express; the message names the field and the feature."""


def seq_length(row: dict[str, str]) -> int:
    """The row's sequence length; a LoRA row that states none, the MLPerf benchmark's
    (:data:`MLPERF_LORA_SEQ_LENGTH`)."""
    if row["seq_len"].strip():
        return int(float(row["seq_len"]))
    if row["kind"] == "lora-finetune":
        return MLPERF_LORA_SEQ_LENGTH
    raise Skip("seq_len: not stated")


def lora(row: dict[str, str]) -> LoraSpec | None:
    """The adapters of a LoRA row (:data:`MLPERF_LORA`), None for full training."""
    return MLPERF_LORA if row["kind"] == "lora-finetune" else None


def read_modern_rows(path: Path = MODERN_CSV) -> list[dict[str, str]]:
    """The CSV as a list of dicts (empty cell = '')."""
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def gpu_family(row: dict[str, str]) -> str:
    """``H100/H200``, ``B200/B300`` or ``GB200/GB300``."""
    return GPU_FAMILIES[row["gpu_type"]]


def kind(row: dict[str, str]) -> str:
    """``pretrain``, ``lora`` or ``sft``."""
    return {"lora-finetune": "lora"}.get(row["kind"], row["kind"])


def is_moe(row: dict[str, str]) -> bool:
    """A mixture-of-experts model (every DeepSeek-V3, Qwen3, GPT-OSS and Nemotron 3 row)."""
    return model_key(row).startswith(("deepseek", "qwen3", "gptoss", "nemotron3"))


def is_second_value(row: dict[str, str]) -> bool:
    """The parenthesised value of an ``a (b)`` cell of a Megatron-Bridge table."""
    return "second value of an 'a (b)' cell" in row["notes"]


def first_word(text: str) -> str:
    """The first word of a cell ('' for an empty one)."""
    return text.split()[0] if text.strip() else ""


def precision_label(row: dict[str, str]) -> str:
    """One of :data:`PRECISIONS` (``unstated``: a row that names none, three LoRA logs).
    Rows of release 25.09, whose table states no precision:
    FP8 with current (tensorwise) scaling, and for the parenthesised values the other
    granularity the footnote names (MXFP8 on B200 / GB200, blockwise on H100) -- the same
    layouts of release 25.11 print FP8-CS and MXFP8 within 1 % of these values."""
    precision = row["precision"]
    if precision == "fp4":
        return "nvfp4"
    if precision == "bf16":
        return "bf16"
    if precision == "fp8":
        recipe = first_word(row["fp8_recipe"])
        return "mxfp8" if recipe == "mxfp8" else f"fp8-{recipe or 'delayed'}"
    if "precision not stated" not in row["notes"]:
        return "unstated"
    if not is_second_value(row):
        return "fp8-tensorwise"
    return "fp8-blockwise" if row["gpu_type"].startswith("H") else "mxfp8"


def catalogue_gpu(row: dict[str, str]) -> GpuSpec | None:
    """The row's GPU from the catalogue, None where the catalogue lacks it."""
    try:
        return resolve_gpu(row["gpu_type"].lower())
    except SpecError:
        return None


def true_cell(cell: str) -> bool:
    return first_word(cell).lower() == "true"


def blockers(row: dict[str, str]) -> list[str]:
    """Every reason the models cannot express the row, in order (empty: representable).
    Each names the field and the feature."""
    out = []
    if row["kind"] not in ("pretrain", "lora-finetune"):
        out.append(f"kind={row['kind']}: fine-tuning not modelled")
    key = model_key(row)
    if unpriced := next((v for k, v in UNPRICED_HYBRIDS.items() if key.startswith(k)), None):
        out.append(f"model_name={row['model_name']}: {unpriced}")
    elif key not in BUNDLED and key != GPT_OSS:
        out.append(f"model_name={row['model_name']}: not in the model catalogue")
    if row["precision"] == "fp4" and (row["fp4_recipe"] or "nvfp4") != "nvfp4":
        out.append(f"precision=fp4 ({row['fp4_recipe']}): only NVFP4 modelled")
    if catalogue_gpu(row) is None:
        out.append(f"gpu_type={row['gpu_type']}: not in the GPU catalogue")
    if true_cell(row["cpu_offload"]):
        out.append(f"cpu_offload={row['cpu_offload']}: not modelled")
    if not row["tp"]:
        out.append("tp/pp/cp: layout not stated")
    return out


def check_representable(row: dict[str, str]) -> None:
    """Raise :class:`Skip` with the first of :func:`blockers`."""
    if reasons := blockers(row):
        raise Skip(reasons[0])


def hint(cell: str) -> str:
    """A cell without its ``recipe at HEAD:`` prefix (the setting the repository's recipe
    of the same model, GPU, count and precision has today)."""
    return cell.removeprefix("recipe at HEAD:").strip()


def approximations(row: dict[str, str]) -> tuple[str, ...]:
    """Settings the row states that the models do not cost (kept in the prediction,
    listed beside it): CUDA graphs, the v6.0 DeepSeek-V3 run's overlapped expert
    communication and delayed weight gradients, real (not force-balanced) routing."""
    out = []
    graph = hint(row["cuda_graph"])
    if graph and graph != "off" and not graph.startswith('"none"'):
        out.append(f"cuda_graph={graph}: CUDA graphs not costed")
    notes = row["notes"]
    if "OVERLAP_MOE_EXPERT_PARALLEL_COMM=True" in notes:
        out.append("OVERLAP_MOE_EXPERT_PARALLEL_COMM: expert all-to-all costed unoverlapped")
    if "DELAY_WGRAD_COMPUTE=True" in notes:
        out.append("DELAY_WGRAD_COMPUTE: costed as the plain backward")
    if "MOE_ROUTER_FORCE_LOAD_BALANCING=False" in notes:
        out.append("real routing: costed as balanced (moe_load_imbalance 1.0)")
    if "MOE_PAGED_STASH" in notes:
        out.append("MOE_PAGED_STASH: paged expert activations not modelled")
    return tuple(out)
