"""Accuracy of the cost models on published training runs.

``python -m pipette_cp.experiments.models.accuracy`` reads
``instances/calibration/published_runs_calibration.csv``, rebuilds every row's
model, a nominal cluster, the training job and the row's layout, evaluates it
and prints measured vs predicted TFLOP/s per GPU (hardware FLOPs, recompute
counted, for the SC21, GPT-3 and BLOOM rows; model FLOPs for the Megatron-Core
H100 rows, as each row's notes say), the error of each row, the MAPE and the
worst row, then the BLOOM memory rows.  ``--fit`` re-fits the calibration
table (:mod:`pipette_cp.cost.stack.calibration`) and prints it.

Assumptions where a row is silent (each is applied in :func:`row_setup`):

- vocabulary: 51200 for Megatron GPT runs (GPT-2 BPE padded), 250880 for BLOOM;
  ffn = 4h; tied embeddings except the Megatron-Core H100 models, whose
  published sizes match untied ones (e.g. 7.1B = 30 x 12 h^2 + 2 V h).
- Megatron-Core H100 rows: micro-batch 1, bf16, no interleaving, sequence
  parallel when tp > 1 (``--tp-comm-overlap`` requires it), no recompute,
  FlashAttention (Transformer Engine), distributed optimizer (required by
  ``--overlap-param-gather``), DP and TP communication overlapped.
- SC21 / GPT-3 rows (2021): fp16, full recompute, no SP, no FlashAttention,
  no distributed optimizer; DP gradient reduction overlapped for the torch DDP
  rows only.  BLOOM rows (Megatron-DeepSpeed, 2022): full activation
  checkpointing (the logged TFLOP/s use the 4-pass formula, which Megatron-
  DeepSpeed applies only with ``--checkpoint-activations``), ZeRO-1 modelled as
  the distributed optimizer, no SP, no FlashAttention, ALiBi.
- Nominal clusters: 8 GPUs per node, NVLink at 0.8 x the per-direction
  datasheet value (nccl-tests bus bandwidth on DGX A100/H100), InfiniBand HDR
  18.8 GB/s or NDR 40 GB/s per GPU under load (docs/design.md, section 5, G1/G2),
  Omni-Path 4 x 100 Gb/s per node at 0.75 efficiency for BLOOM.
- Rows larger than :data:`MAX_GPUS` are evaluated with fewer DP replicas and the
  same micro-batches per pipeline (TFLOP/s per GPU are then unchanged up to the
  DP ring's ``(d - 1)/d``).
- BLOOM memory figures ("29GB") are read as GiB (nvidia-smi MiB / 1024): the
  larger reading, so that the fitted model errs high.
"""

from __future__ import annotations

import csv
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from unittest.mock import patch

import numpy as np

from pipette_cp.clusters.expand import cluster_from_node_matrix
from pipette_cp.cost.memory.peak import memory_by_stage
from pipette_cp.cost.stack import calibration as calib
from pipette_cp.experiments.models.calibration_split import family as source_family
from pipette_cp.io.paths import INSTANCES_DIR
from pipette_cp.specs.gpu import resolve_gpu
from pipette_cp.specs.instance import Instance
from pipette_cp.specs.layouts import make_plan
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import TrainingSpec
from pipette_cp.units import GB, GiB

#: The bundled copy of the calibration rows.
CALIBRATION_CSV = INSTANCES_DIR / "calibration" / "published_runs_calibration.csv"

#: Largest cluster built for a row (a GPU x GPU matrix of 2048^2 floats is 32 MB).
MAX_GPUS = 2048

#: Accuracy targets: throughput MAPE, worst throughput row, worst memory row.
TARGET_MAPE = 0.08
TARGET_WORST = 0.20
TARGET_MEMORY = 0.10


def relative_error(predicted: float, measured: float) -> float:
    """(predicted - measured) / measured: > 0 where the model predicts too much."""
    return predicted / measured - 1.0


@dataclass(frozen=True)
class RowSetup:
    """One calibration row rebuilt as specs."""

    name: str
    kind: str
    instance: Instance
    plan: Plan
    metric: str
    measured_tflops: float
    measured_memory_bytes: float | None


@dataclass(frozen=True)
class AccuracyRow:
    """Measured vs predicted throughput of one row."""

    name: str
    kind: str
    layout: str
    metric: str
    measured_tflops: float
    predicted_tflops: float

    @property
    def error(self) -> float:
        """(predicted - measured) / measured."""
        return relative_error(self.predicted_tflops, self.measured_tflops)


@dataclass(frozen=True)
class MemoryRow:
    """Measured vs predicted peak memory (max over first and last stage)."""

    name: str
    layout: str
    measured_bytes: float
    predicted_bytes: float

    @property
    def error(self) -> float:
        """(predicted - measured) / measured."""
        return relative_error(self.predicted_bytes, self.measured_bytes)


@dataclass(frozen=True)
class AccuracyReport:
    """Every row, the throughput MAPE and worst row, and the memory rows."""

    rows: tuple[AccuracyRow, ...]
    memory_rows: tuple[MemoryRow, ...]

    @property
    def mape(self) -> float:
        """Mean absolute relative throughput error."""
        return float(np.mean([abs(r.error) for r in self.rows]))

    @property
    def worst(self) -> AccuracyRow:
        """The row with the largest absolute throughput error."""
        return max(self.rows, key=lambda r: abs(r.error))

    @property
    def memory_worst(self) -> MemoryRow:
        """The memory row with the largest absolute error."""
        return max(self.memory_rows, key=lambda r: abs(r.error))


# ------------------------------------------------------------------------ rows
def read_rows(path: Path = CALIBRATION_CSV) -> list[dict[str, str]]:
    """The calibration CSV as a list of dicts (empty cell = '')."""
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _kind(row: dict[str, str]) -> str:
    """How a row is set up: its source family where it has its own conventions (SC21,
    the GPT-3 example, BigScience), Megatron-Core's settings otherwise."""
    fam = source_family(row)
    return fam if fam in ("sc21", "gpt3", "bloom") else "mcore"


def _int(value: str, default: int) -> int:
    return int(float(value)) if value.strip() else default


def row_setup(row: dict[str, str], max_gpus: int = MAX_GPUS) -> RowSetup:
    """Model, nominal cluster, training and plan of one CSV row (see module notes)."""
    kind = _kind(row)
    h, layers = int(row["hidden_size"]), int(row["num_layers"])
    seq = int(row["seq_len"])
    mcore, bloom = kind == "mcore", kind == "bloom"
    model = ModelSpec(
        name=row["model_name"],
        num_layers=layers,
        hidden_size=h,
        num_attention_heads=int(row["num_heads"]),
        num_kv_heads=_int(row["num_kv_heads"], 0) or None,
        ffn_hidden_size=_int(row["ffn_hidden_size"], 4 * h),
        vocab_size=_int(row["vocab_size"], 250880 if bloom else 51200),
        position_embedding="alibi" if bloom else "learned",
        tied_embeddings=not mcore,
        max_seq_length=seq,
        source=row["source"],
    )
    tp, pp, dp = int(row["tp"]), int(row["pp"]), int(row["dp"])
    mb = _int(row["micro_batch_size"], 1)
    microbatches = int(row["global_batch_size"]) // (dp * mb)
    dp_model = max(1, min(dp, max_gpus // (tp * pp)))
    recompute = row["recompute"] or ("full" if bloom else "none")
    torch_ddp = "torch" in row["distributed_optimizer_or_zero"]
    fields = {
        "global_batch_size": microbatches * mb * dp_model,
        "seq_length": seq,
        "precision": "bf16" if (mcore or bloom) else "fp16",
        "flash_attention_available": mcore,
        "overlap_grad_reduce": mcore or torch_ddp,
        "overlap_param_gather": mcore,
    }
    training = TrainingSpec(**fields, tp_comm_overlap=mcore)
    plan = make_plan(
        num_layers=layers,
        dp=dp_model,
        pp=pp,
        tp=tp,
        micro_batch_size=mb,
        vpp=_int(row["virtual_pp"], 1),
        sequence_parallel=mcore and tp > 1,
        recompute=recompute,  # type: ignore[arg-type]
        distributed_optimizer=mcore or bloom,
        flash_attention=mcore,
    )
    gpu = resolve_gpu("h100" if row["gpu_type"].startswith("H100") else "a100-80gb")
    per_node = _int(row["gpus_per_node"], 8)
    nodes = -(-plan.num_gpus // per_node)
    if bloom:
        nics, nic_bw = 4, 0.75 * 12.5 * GB
    elif mcore:
        nics, nic_bw = 8, 40 * GB
    else:
        nics, nic_bw = 8, 18.8 * GB
    cluster = cluster_from_node_matrix(
        node_bandwidth=np.full((nodes, nodes), nic_bw),
        intra_node=0.8 * gpu.nvlink_bandwidth_bytes_per_s,
        gpus_per_node=per_node,
        gpu=gpu,
        nics_per_node=nics,
        nic_bandwidth_bytes_per_s=nic_bw,
        name=f"nominal-{nodes}x{per_node}",
        source="nominal (pipette_cp.experiments.models.accuracy)",
    )
    instance = Instance(name=row["model_name"], model=model, cluster=cluster, training=training)
    memory = row["measured_mem_gb_per_gpu"]
    return RowSetup(
        name=f"{row['model_name']} {plan.layout()}",
        kind=kind,
        instance=instance,
        plan=plan,
        metric="model" if mcore else "hardware",
        measured_tflops=float(row["measured_tflops_per_gpu"]),
        measured_memory_bytes=float(memory) * GiB if memory else None,
    )


# ------------------------------------------------------------------ evaluation
def _evaluate(setup: RowSetup) -> float:
    """Predicted TFLOP/s per GPU of one row, in the row's convention."""
    from pipette_cp.cost.evaluator.evaluate import evaluate

    evaluation = evaluate(setup.instance, setup.plan)
    if setup.metric == "model":
        return evaluation.model_tflops_per_gpu
    return evaluation.hardware_tflops_per_gpu


def predicted_memory_bytes(setup: RowSetup) -> float:
    """Predicted peak memory, max over the first and last stage (as BLOOM measured)."""
    inst = setup.instance
    stages = memory_by_stage(inst.model, inst.training, setup.plan)
    return max(stages[0].total_bytes, stages[-1].total_bytes)


def run_accuracy(path: Path = CALIBRATION_CSV) -> AccuracyReport:
    """Evaluate every calibration row; see the module notes for the assumptions."""
    setups = [row_setup(row) for row in read_rows(path)]
    rows = tuple(
        AccuracyRow(s.name, s.kind, s.plan.layout(), s.metric, s.measured_tflops, _evaluate(s))
        for s in setups
    )
    memory_rows = tuple(
        MemoryRow(s.name, s.plan.layout(), s.measured_memory_bytes, predicted_memory_bytes(s))
        for s in setups
        if s.measured_memory_bytes is not None
    )
    return AccuracyReport(rows, memory_rows)


# --------------------------------------------------------------------- fitting
def _family(setup: RowSetup) -> str:
    return calib.gpu_family(next(iter(setup.instance.cluster.gpu_types.values())))


def fit_compute(setups: list[RowSetup]) -> dict[str, calib.GpuCalibration]:
    """Re-fit ``(eta_max, W_half)`` of every GPU family on its rows (grid search).

    The evaluator reads :data:`pipette_cp.cost.stack.calibration.GPU_CALIBRATION` at call
    time, so each trial patches that table for the duration of the trial only.
    """
    fitted = {}
    for family, base in calib.GPU_CALIBRATION.items():
        rows = [s for s in setups if _family(s) == family]
        if not rows:
            continue

        def errors(ceiling: float, half: float, rows=rows, base=base, family=family) -> np.ndarray:
            trial = replace(base, gemm_efficiency_max=ceiling, gemm_half_saturation_flops=half)
            with patch.dict(calib.GPU_CALIBRATION, {family: trial}):
                return np.array([relative_error(_evaluate(s), s.measured_tflops) for s in rows])

        coarse = np.round(np.arange(0.50, 0.9001, 0.02), 4).tolist()
        halves = (0.0, 1e9, 3e9, 1e10, 3e10, 1e11)
        ceiling, half, _ = calib.fit_gemm_efficiency(errors, coarse, halves)
        fine = np.round(np.arange(ceiling - 0.02, ceiling + 0.0201, 0.005), 4).tolist()
        ceiling, half, _ = calib.fit_gemm_efficiency(errors, fine, (half,))
        fitted[family] = replace(
            base, gemm_efficiency_max=float(ceiling), gemm_half_saturation_flops=half
        )
    return fitted


def fit_memory(setups: list[RowSetup]) -> calib.MemoryCalibration:
    """Re-fit the runtime constant and allocator fraction on the rows with memory."""
    zero = calib.MemoryCalibration(0.0, 0.0, "")
    tensors, dynamic, measured = [], [], []
    for s in setups:
        if s.measured_memory_bytes is None:
            continue
        inst = s.instance
        stages = memory_by_stage(inst.model, inst.training, s.plan, zero)
        peak = max((stages[0], stages[-1]), key=lambda b: b.total_bytes)
        tensors.append(peak.total_bytes)
        dynamic.append(peak.activations + peak.logits + peak.temporary)
        measured.append(s.measured_memory_bytes)
    runtime, fraction, _ = calib.fit_memory_runtime(tensors, dynamic, measured)
    return calib.MemoryCalibration(runtime, fraction, calib.MEMORY_CALIBRATION.provenance)


# ------------------------------------------------------------------------ report
def format_report(report: AccuracyReport) -> str:
    """The report as plain text (the only printer is :func:`main`)."""
    lines = [f"{'row':58s} {'metric':8s} {'measured':>9s} {'predicted':>9s} {'error':>7s}"]
    for r in report.rows:
        lines.append(
            f"{r.name[:58]:58s} {r.metric:8s} {r.measured_tflops:9.1f} "
            f"{r.predicted_tflops:9.1f} {100 * r.error:+6.1f}%"
        )
    worst = report.worst
    lines.append(
        f"TFLOP/s per GPU: MAPE {100 * report.mape:.2f}% (target <= {100 * TARGET_MAPE:.0f}%), "
        f"worst {100 * worst.error:+.1f}% {worst.name} (target <= {100 * TARGET_WORST:.0f}%)"
    )
    lines.append(
        f"\n{'memory row (GiB, max of first/last stage)':58s} {'measured':>9s} {'predicted':>9s} {'error':>7s}"
    )
    for m in report.memory_rows:
        lines.append(
            f"{m.name[:58]:58s} {m.measured_bytes / GiB:9.1f} {m.predicted_bytes / GiB:9.1f} "
            f"{100 * m.error:+6.1f}%"
        )
    if report.memory_rows:
        lines.append(f"memory: worst {100 * report.memory_worst.error:+.1f}% (target within 10%)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m pipette_cp.experiments.models.accuracy [--fit]``."""
    argv = sys.argv[1:] if argv is None else argv
    if "--fit" in argv:
        setups = [row_setup(row) for row in read_rows()]
        for family, cal in fit_compute(setups).items():
            print(
                f"{family}: gemm_efficiency_max={cal.gemm_efficiency_max:.4f}, "
                f"gemm_half_saturation_flops={cal.gemm_half_saturation_flops:.3g}"
            )
        mem = fit_memory(setups)
        print(
            f"memory: runtime_bytes={mem.runtime_bytes / GiB:.3f} GiB, "
            f"allocator_fraction={mem.allocator_fraction:.3f}"
        )
        return 0
    print(format_report(run_accuracy()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
