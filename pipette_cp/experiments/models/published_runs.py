"""Baseline accuracy of today's models on ``published_runs_more.csv``.

``python -m pipette_cp.experiments.models.published_runs_report`` rebuilds every row that the
models can express (dense Megatron-style runs) with
:func:`pipette_cp.experiments.models.accuracy.row_setup` after completing the row with
the assumptions below, predicts it with the :class:`~pipette_cp.cost.evaluator.evaluate.Evaluator`
and prints, per source family and per side of
:func:`~pipette_cp.experiments.models.calibration_split.assign_split`: rows used and
skipped, throughput MAPE, median predicted/measured throughput, the median
within-sweep Spearman rank correlation, and the OOM confusion (runs that ran
out of memory predicted to fit; runs that ran predicted not to fit).  It then
prints :func:`pipette_cp.experiments.models.published_runs_report.format_report`: the
same metrics per attention kernel, recompute, sequence length, GPU type and
family, the model's pick in every sweep scored against the best run, and the
memory error on rows with an nvidia-smi reading.  ``--plot FILE.png`` draws
predicted vs measured throughput, ``--csv FILE`` writes one row per evaluated run.

Like-for-like comparisons (each family's convention):

- Hagemann et al. 2023 and DGX Cloud recipes: measured step time vs predicted
  iteration time (predicted/measured throughput = measured / predicted time),
  so that neither sheet's FLOP formula enters.
- BigScience BLOOM: hardware TFLOP/s per GPU as logged (recompute counted).

Assumptions where a row is silent:

- Hagemann sheets: LLaMA-1 shapes (13B: 40 x 5120, 40 heads, ffn 13824; 30B:
  60 x 6656, 52 heads, ffn 17920), vocabulary 32000, RoPE, RMSNorm, SwiGLU, no
  biases, untied embeddings; sequence 2048 unless stated; global batch 2048
  sequences at 2k and 512 at 8k (the sheets' MFU x step time give the same
  ~4M tokens per step on every row); A100 80GB, 8 per node; ZeRO-1 as the
  distributed optimizer; the sheet's kernel as the stack's attention kernel and norm (HAGEMANN_KERNELS);
  sequence parallel as the sheet says (off where it is silent); no TP
  communication overlap or parameter-gather overlap.
- DGX Cloud rows: the Megatron-Core settings of ``accuracy.py``; Nemotron-4
  heads 48 (15B) and 96 (340B) with 8 KV heads; RoPE and no biases for Llama
  and Nemotron.

Skipped with a counted reason: FSDP rows (llm-foundry), context parallelism,
runs that failed for a reason other than OOM, layouts the specs reject.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.cost.memory.peak import memory_by_stage
from pipette_cp.experiments.models.accuracy import read_rows
from pipette_cp.experiments.models.calibration_split import (
    HELD_OUT,
    assign_split,
    family,
    sweep_key,
)
from pipette_cp.experiments.models.published_runs_setup import (
    TFLOPS_FAMILIES,
    Skip,
    check_expressible,
    complete_row,
    note,
    run_setup,
)
from pipette_cp.io.paths import INSTANCES_DIR
from pipette_cp.units import GiB

#: The bundled copy of the published layout sweeps.
MORE_CSV = INSTANCES_DIR / "calibration" / "published_runs_more.csv"


@dataclass(frozen=True)
class RunResult:
    """One row: measured and predicted throughput (``nan`` for OOM rows), fit.

    The knobs (``kernel``, ``recompute``, ``seq_len``, ``gpu_type``, ``layout``) are
    those of the evaluated (completed) row; ``per_gpu`` turns the throughput into
    a per-GPU one (tokens per second per GPU for step-time families, 1 for BLOOM's
    TFLOP/s per GPU), so that runs of a weak-scaling sweep compare; memory is in
    GiB (nvidia-smi's reading, ``nan`` where the row has none).
    """

    family: str
    sweep: str
    side: str
    oom: bool
    predicted_fits: bool
    measured: float
    predicted: float
    kernel: str = ""
    recompute: str = ""
    seq_len: int = 0
    gpu_type: str = ""
    layout: str = ""
    per_gpu: float = 1.0
    predicted_mem_gib: float = math.nan
    limit_gib: float = math.nan
    measured_mem_gib: float = math.nan
    #: the smallest memory margin (a fraction of the per-micro-batch memory) at which the
    #: row is predicted not to fit: ``min over stages (limit - peak) / dynamic``
    memory_slack: float = math.inf

    @property
    def ratio(self) -> float:
        """Predicted / measured throughput."""
        return self.predicted / self.measured


def _measured(row: dict[str, str], fam: str) -> float:
    """Measured throughput in the family's convention (1/step time, TFLOP/s, tokens/s/GPU)."""
    if fam in TFLOPS_FAMILIES:
        return float(row["measured_tflops_per_gpu"] or "nan")
    if fam == "mpt":
        found = re.search(r"tokens/s/GPU ([\d.]+)", row["notes"])
        return float(found.group(1)) if found else math.nan
    step = note(row["notes"], "step_time_s")
    return 1.0 / float(step) if step else math.nan


def evaluate_row(
    row: dict[str, str],
    side: str,
    compute_efficiency: float | None = None,
    attention_efficiency: float | None = None,
) -> RunResult:
    """Predict one row; raises :class:`Skip` where the models cannot express it."""
    check_expressible(row)
    fam = family(row)
    try:
        setup = run_setup(row, compute_efficiency, attention_efficiency)
        evaluation = Evaluator(setup.instance).evaluate(setup.plan)
    except (ValueError, KeyError) as error:
        raise Skip(f"layout not expressible ({type(error).__name__})") from error
    if fam in TFLOPS_FAMILIES:  # the source's convention (accuracy.py: model or hardware)
        model = setup.metric == "model"
        predicted = evaluation.model_tflops_per_gpu if model else evaluation.hardware_tflops_per_gpu
    elif fam == "mpt":
        predicted = evaluation.tokens_per_s / setup.plan.num_gpus
    else:
        predicted = 1.0 / evaluation.iteration_time_s
    full, plan = complete_row(row), setup.plan
    tokens = int(full["global_batch_size"]) * int(full["seq_len"])
    gpus = int(row["tp"]) * int(row["pp"]) * int(row["dp"])
    memory = row["measured_mem_gb_per_gpu"]
    inst = setup.instance
    stages = memory_by_stage(inst.model, inst.training, plan)
    limit = evaluation.memory_limit_bytes
    slack = min((limit - s.total_bytes) / max(s.dynamic_bytes, 1.0) for s in stages)
    return RunResult(
        fam, sweep_key(row), side, "OOM" in row["notes"], evaluation.fits,
        _measured(row, fam), predicted,
        kernel=_kernel_label(row, plan.flash_attention), recompute=plan.recompute,
        seq_len=int(full["seq_len"]), gpu_type=row["gpu_type"], layout=plan.layout(),
        per_gpu=1.0 if fam == "bloom" else tokens / gpus,
        predicted_mem_gib=evaluation.memory_bytes_max / GiB,
        limit_gib=evaluation.memory_limit_bytes / GiB,
        measured_mem_gib=float(memory) if memory else math.nan, memory_slack=slack,
    )  # fmt: skip


def _kernel_label(row: dict[str, str], flash: bool) -> str:
    """The Hagemann ``kernel=`` note, elsewhere whether FlashAttention is modelled."""
    kernel = note(row["notes"], "kernel") if family(row) == "hagemann" else None
    return kernel or f"flash_attention={'y' if flash else 'n'}"


@dataclass(frozen=True)
class Baseline:
    """Every evaluated row and the skipped rows by (family, side, reason)."""

    results: tuple[RunResult, ...]
    skipped: Counter[tuple[str, str, str]]


def run_baseline(
    path: Path = MORE_CSV,
    limit: int | None = None,
    compute_efficiency: float | None = None,
    attention_efficiency: float | None = None,
    families: tuple[str, ...] | None = None,
    *,
    calibration: bool = False,
) -> Baseline:
    """Evaluate the rows of ``path`` (the first ``limit`` expressible ones if given;
    ``calibration``: the compute calibration's own rows, all on the fit side)."""
    rows = read_rows(path)
    sides = assign_split(rows, calibration=calibration)
    results: list[RunResult] = []
    skipped: Counter[tuple[str, str, str]] = Counter()
    for row, side in zip(rows, sides, strict=True):
        if limit is not None and len(results) >= limit:
            break
        try:
            if families is None or family(row) in families:
                results.append(evaluate_row(row, side, compute_efficiency, attention_efficiency))
        except Skip as reason:
            skipped[(family(row), side, str(reason))] += 1
    return Baseline(tuple(results), skipped)


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


@dataclass(frozen=True)
class Summary:
    """Metrics of one (family, side) cell."""

    used: int
    skipped: int
    ran: int
    mape: float
    median_ratio: float
    rank: float
    oom: int
    oom_predicted_fit: int
    ran_predicted_oom: int


def summarise(results: list[RunResult], skipped: int) -> Summary:
    """MAPE, median ratio, median within-sweep rank correlation, OOM confusion."""
    ran = [r for r in results if not r.oom and math.isfinite(r.measured)]
    ratios = np.array([r.ratio for r in ran])
    sweeps: dict[str, list[RunResult]] = defaultdict(list)
    for r in ran:
        sweeps[r.sweep].append(r)
    ranks = [
        _spearman(np.array([r.measured for r in g]), np.array([r.predicted for r in g]))
        for g in sweeps.values()
        if len(g) >= 3
    ]
    ooms = [r for r in results if r.oom]
    return Summary(
        used=len(results), skipped=skipped, ran=len(ran),
        mape=float(np.mean(np.abs(ratios - 1))) if len(ran) else math.nan,
        median_ratio=float(np.median(ratios)) if len(ran) else math.nan,
        rank=float(np.median(ranks)) if ranks else math.nan,
        oom=len(ooms), oom_predicted_fit=sum(r.predicted_fits for r in ooms),
        ran_predicted_oom=sum(not r.predicted_fits for r in ran),
    )  # fmt: skip


def summaries(baseline: Baseline) -> dict[tuple[str, str], Summary]:
    """One :class:`Summary` per (family, side), families in order of appearance."""
    cells: dict[tuple[str, str], list[RunResult]] = defaultdict(list)
    skips: Counter[tuple[str, str]] = Counter()
    for r in baseline.results:
        cells[(r.family, r.side)].append(r)
    for (fam, side, _), count in baseline.skipped.items():
        skips[(fam, side)] += count
        cells.setdefault((fam, side), [])
    return {key: summarise(cells[key], skips[key]) for key in sorted(cells)}


def format_baseline(baseline: Baseline) -> str:
    """The baseline as plain text (the only printer is :func:`main`)."""
    head = (
        f"{'family':10s} {'side':9s} {'used':>5s} {'skip':>5s} {'ran':>5s} {'MAPE':>7s} "
        f"{'med p/m':>8s} {'rank':>6s} {'OOM':>5s} {'OOM->fit':>8s} {'ran->OOM':>8s}"
    )
    lines = [head]
    for (fam, side), s in summaries(baseline).items():
        lines.append(
            f"{fam:10s} {side:9s} {s.used:5d} {s.skipped:5d} {s.ran:5d} {100 * s.mape:6.1f}% "
            f"{s.median_ratio:8.3f} {s.rank:6.2f} {s.oom:5d} {s.oom_predicted_fit:8d} "
            f"{s.ran_predicted_oom:8d}"
        )
    lines.append("\nskipped rows by reason:")
    reasons: Counter[str] = Counter()
    for (_, _, reason), count in baseline.skipped.items():
        reasons[reason] += count
    lines.extend(f"  {count:4d}  {reason}" for reason, count in reasons.most_common())
    held = sum(1 for r in baseline.results if r.side == HELD_OUT)
    lines.append(f"\n{len(baseline.results)} rows evaluated ({held} held out).")
    return "\n".join(lines)
