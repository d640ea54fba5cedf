"""Accuracy of the mixture-of-experts and context-parallel cost models on published runs.

``python -m pipette_cp.experiments.models.moe_cp_accuracy`` rebuilds every MoE row and every
row with context parallelism (cp > 1) of ``published_runs_moe_cp.csv``
(:func:`pipette_cp.experiments.models.moe_cp_setup.moe_cp_setup`), predicts each step time with
the :class:`~pipette_cp.cost.evaluator.evaluate.Evaluator` and prints the step-time MAPE per group
(MoE rows, CP rows; a row with both is in both), precision (FP8 flagged) and side of
:func:`~pipette_cp.experiments.models.calibration_split.assign_split`, per source family, every
row (layout, measured, predicted, error, where the predicted time goes, and the share of
it the fused attention takes: what halving its speed adds), the rows skipped and why, the
error of the cp = 1 rows of the torchtitan long-context sweeps beside their cp > 1 rows,
and predicted vs measured peak memory of the torchtitan rows with cp > 1 (their reserved
peaks against the prediction less the runtime constant:
:func:`pipette_cp.experiments.models.torchtitan_rows.reserved_peak_gib`).
``--fit`` fits three parameters on the fit side only and prints them with the held-out
errors (:func:`fit_parameters`): the MoE load imbalance of dropless routing
(``TrainingSpec.moe_load_imbalance``, on the forced-balance / dropless throughput pairs of
the long-context Qwen3 rows), the compute efficiency of NeMo's FP8 MoE runs
(``FrameworkProfile.compute_efficiency`` of the Grok-1 FP8 rows) and the fused
attention's speed under torchtitan's ring attention (``cp_attention_efficiency`` of the
torchtitan profile, on its 8B rows with cp > 1,
:func:`~pipette_cp.experiments.models.torchtitan_rows.fit_cp_attention_efficiency`; the profile
holds the value, the other two are printed only).

Measured step times: the ``step_time_s=`` note (Grok-1, Qwen3 H100 table); else
``tokens_per_s_per_gpu`` (NeMo, torchtitan: GBS x seq / (tokens/s/GPU x GPUs)); else the
printed TFLOP/s per GPU with Megatron-Core's model-FLOP formula
(:func:`~pipette_cp.experiments.models.moe_cp_setup.megatron_flops_per_token`; the report checks it
on the rows that print both).

Assumptions where a row is silent:

- Grok-1 (dgxc-benchmarking, NeMo 24.09): the bundled ``grok-1`` model (tied embeddings,
  gated GeLU as SwiGLU, four norms per layer) at the row's depth and vocabulary 128256; no
  dropout; expert tensor parallelism = tp (the notes); alltoall dispatcher, no grouped GEMM,
  capacity factor 1.0 padded to capacity (``moe_pad_to_capacity``: every expert computes its
  full capacity, so the load imbalance plays no part); no recompute; sequence parallel;
  distributed optimizer with grad reduce and param gather overlapped; TP communication
  overlapped (``ub_tp_comm_overlap``); cuDNN fused attention; the NeMo framework's compute
  efficiency; FP8 rows: Transformer Engine delayed scaling, hybrid format.
- Qwen3-235B-A22B (Megatron-MoE-ModelZoo; model yaml): the bundled ``qwen3-235b-a22b``;
  untied embeddings, no dropout, fused cross-entropy, grouped GEMM, etp 1, distributed
  optimizer with grad reduce and param gather overlapped, no TP communication overlap;
  dropless routing, load imbalance 1.0: the long-context and GB200 rows say the routing was
  forced to balance, and the H100 table's rows are taken as forced too (the readme's
  ``run_h100_235b.sh`` passes ``--moe-router-force-load-balancing``).  DeepEP and HybridEP
  are costed as Megatron's flex dispatcher (a token crosses to each other node holding
  one of its experts once), A2A as the alltoall dispatcher; the EP all-to-all is not overlapped
  (``A2A_OVERLAP=1`` / "1f1b overlap" rows included: the model has no such overlap); CUDA
  graphs and activation offloading are not modelled; the selective recompute modules
  (layernorm, moe_act, moe) are costed as no recompute (the model's ``selective`` is the
  attention core, which these runs do not recompute); blank recompute = none.  GB200:
  ``GB200-NVL72-186GB`` (no fitted calibration: the default one), trays of 4 GPUs, an
  NVLink domain per Slurm segment of the row's command (``SEGMENT=`` 2, 16 and 8 trays),
  NVLink at 0.8 x 900 GB/s, one 40 GB/s NIC per GPU; MXFP8 as Transformer Engine's
  ``mxfp8`` recipe.  The Megatron-FSDP row is skipped (ZeRO-3 with experts is not modelled).
- NeMo 24.07 dense FP8 rows with cp 2 and torchtitan rows with cp > 1: the setup of
  :mod:`pipette_cp.experiments.models.fp8_accuracy` (NeMo's Llama 3: SwiGLU, RMSNorm, RoPE base
  500000, no biases, vocabulary 128256) with the row's cp; torchtitan's FSDP2 shards over
  dp x cp ranks as the plan's replicas do.
- Context parallelism everywhere as Megatron-Core's p2p ring (``--cp-comm-type p2p``, the
  default of NeMo and Megatron-MoE-ModelZoo; torchtitan's PyTorch ring attention is costed
  as the same ring, its attention steps at the profile's fitted
  ``cp_attention_efficiency``), load-balanced causal chunks, each K/V transfer overlapped
  with the attention step on the chunk already held (:mod:`pipette_cp.cost.compute.context_ring`).
- H100 clusters: nominal, 8 GPUs per node on NVLink at 0.8 x the datasheet, 8 NICs at
  40 GB/s each under load (as :mod:`pipette_cp.experiments.models.accuracy`); torchtitan's
  96 GB H100 as in :mod:`pipette_cp.experiments.models.fp8_accuracy`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.cost.stack.frameworks import resolve_framework
from pipette_cp.experiments.models import torchtitan_rows
from pipette_cp.experiments.models.calibration_split import FIT, HELD_OUT, family
from pipette_cp.experiments.models.moe_cp_rows import RowResult, Skipped
from pipette_cp.experiments.models.moe_cp_setup import (
    DroplessPair,
    Skip,
    dropless_pairs,
    is_fp8_row,
    is_moe_row,
    megatron_flops_per_token,
    moe_cp_setup,
    pair_rows,
    row_cp,
    selected_rows,
    with_training,
)
from pipette_cp.specs.plan import TimeBreakdown
from pipette_cp.specs.training import FrameworkProfile
from pipette_cp.units import TFLOPS, GiB

#: Grid of dropless load imbalances (busiest expert-parallel rank over the even share).
IMBALANCE_GRID = tuple(round(1.0 + 0.025 * i, 3) for i in range(81))
#: Grid of compute efficiencies of NeMo's FP8 MoE rows (NeMo's own: 0.926).
EFFICIENCY_GRID = tuple(round(0.60 + 0.005 * i, 3) for i in range(81))
#: The breakdown shares shown per row (the causes of :func:`breakdown_shares`, in order).
SHARES = ("compute", "bubble", "tp_comm", "cp_comm", "ep_comm", "dp_comm", "pp_comm")


def breakdown_shares(parts: TimeBreakdown, total_s: float) -> tuple[float, ...]:
    """The :data:`SHARES` of ``total_s``, in their order."""
    seconds = (parts.compute, parts.bubble, parts.tp_comm, parts.cp_comm, parts.ep_comm,
               parts.dp_comm, parts.pp_comm)  # fmt: skip
    return tuple(s / total_s for s in seconds)


def mape(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Mean absolute percentage error, as a fraction: mean of ``|p / m - 1|``."""
    if len(predicted) != len(measured) or not predicted:
        raise ValueError("mape needs as many predictions as measurements, at least one")
    return float(np.mean([abs(p / m - 1.0) for p, m in zip(predicted, measured, strict=True)]))


def evaluate_row(
    index: int, row: dict[str, str], side: str, fp8_moe_efficiency: float | None = None
) -> RowResult | Skipped:
    """One row predicted (``fp8_moe_efficiency``: see :func:`moe_cp_setup`)."""
    try:
        st = moe_cp_setup(row, fp8_moe_efficiency=fp8_moe_efficiency)
    except Skip as reason:
        return Skipped(index, family(row), row["model_name"], str(reason))
    ev = Evaluator(st.instance).evaluate(st.plan)
    total = ev.iteration_time_s
    framework = st.instance.training.framework
    slow = framework.model_copy(update={
        "attention_efficiency": 0.5 * resolve_framework(framework).attention_efficiency,
    })  # fmt: skip
    halved = Evaluator(with_training(st.instance, framework=slow)).iteration_time(st.plan)
    gpu = next(iter(st.instance.cluster.gpu_types)).split("-")[0]
    peak = ev.memory_bytes_max / GiB  # torchtitan's rows print the reserved peak:
    if st.family == "torchtitan":
        peak = torchtitan_rows.reserved_peak_gib(st.instance, st.plan)
    return RowResult(
        index, st.family, gpu, side, is_moe_row(row), row_cp(row), st.fp8, st.name,
        st.plan.layout(), st.measured_from, st.measured_step_s, total, ev.fits,
        breakdown_shares(ev.breakdown_s, total), halved / total - 1.0,
        st.measured_mem_gib, peak,
    )  # fmt: skip


def run(fp8_moe_efficiency: float | None = None) -> tuple[list[RowResult], list[Skipped]]:
    """Every selected row evaluated, and the rows skipped."""
    results: list[RowResult] = []
    skipped: list[Skipped] = []
    for i, row, side in selected_rows():
        out = evaluate_row(i, row, side, fp8_moe_efficiency)
        if isinstance(out, Skipped):
            skipped.append(out)
        else:
            results.append(out)
    return results, skipped


# -------------------------------------------------------------------------- fit
@dataclass(frozen=True)
class Fit:
    """The fitted values and the fit-side objective (MAPE) of each."""

    imbalance: float
    imbalance_mape: float
    fp8_moe_efficiency: float
    efficiency_mape: float
    cp_attention: float = 1.0
    cp_attention_mape: float = 0.0


def _grid_min(grid: Iterable[float], objective: Callable[[float], float]) -> tuple[float, float]:
    score, best = min((objective(x), x) for x in grid)
    return best, score


def fit_parameters() -> Fit:
    """The three parameters, each by grid search on the fit side only (the third:
    :func:`~pipette_cp.experiments.models.torchtitan_rows.fit_cp_attention_efficiency`):

    - dropless load imbalance (:data:`IMBALANCE_GRID`): minimises the MAPE of the
      predicted over measured dropless / forced-balance slowdown of the fit-side pairs
      (:func:`dropless_pairs`; the ratio cancels what the forced run already mispredicts);
    - compute efficiency of NeMo's FP8 MoE rows (:data:`EFFICIENCY_GRID`): minimises the
      step-time MAPE of the fit-side Grok-1 FP8 rows.
    """
    fit_pairs = [p for p in pair_rows() if p.side == FIT]

    def ratio_mape(x: float) -> float:
        return float(np.mean([abs(p.ratio_error) for p in dropless_pairs(x, fit_pairs)]))

    grok = [moe_cp_setup(r) for _, r, s in selected_rows()
            if s == FIT and family(r) == "dgxc-moe" and is_fp8_row(r)]  # fmt: skip

    def step_mape(x: float) -> float:  # as moe_cp_setup(row, fp8_moe_efficiency=x) sets it
        framework = FrameworkProfile(name="nemo", compute_efficiency=x)
        insts = [with_training(o.instance, framework=framework) for o in grok]
        times = [Evaluator(i).iteration_time(o.plan) for i, o in zip(insts, grok, strict=True)]
        return mape(times, [o.measured_step_s for o in grok])

    imbalance, imbalance_mape = _grid_min(IMBALANCE_GRID, ratio_mape)
    efficiency, efficiency_mape = _grid_min(EFFICIENCY_GRID, step_mape)
    cp_attention, cp_mape, _ = torchtitan_rows.fit_cp_attention_efficiency()
    return Fit(imbalance, imbalance_mape, efficiency, efficiency_mape, cp_attention, cp_mape)


# ----------------------------------------------------------------------- report
_HEAD = f"{'rows':>4s} {'MAPE':>7s} {'worst':>7s} {'med p/m':>7s}"


def _cell(group: list[RowResult]) -> str:
    errors = np.array([r.error for r in group])
    ratios = np.array([r.predicted_s / r.measured_s for r in group])
    return (f"{len(group):4d} {100 * np.mean(np.abs(errors)):6.1f}% "
            f"{100 * np.max(np.abs(errors)):6.1f}% {np.median(ratios):7.3f}")  # fmt: skip


def format_summary(results: list[RowResult]) -> list[str]:
    """Step-time MAPE per group (MoE, CP) x precision x side, then per source family."""
    lines = [f"{'group':5s} {'precision':9s} {'side':8s} {_HEAD}"]
    for group in ("MoE", "CP"):
        for prec in ("all", "bf16", "FP8"):
            for side in (FIT, HELD_OUT, "both"):
                cell = [r for r in results if group in r.groups
                        and prec in ("all", "FP8" if r.fp8 else "bf16")
                        and side in ("both", r.side)]  # fmt: skip
                if cell:
                    lines.append(f"{group:5s} {prec:9s} {side:8s} {_cell(cell)}")
    lines.append(f"\n{'family / GPU':20s} {'precision':9s} {'side':8s} {_HEAD}")
    for fam, gpu in sorted({(r.family, r.gpu) for r in results}):
        for prec in ("bf16", "FP8"):
            for side in (FIT, HELD_OUT):
                cell = [r for r in results if (r.family, r.gpu, r.side) == (fam, gpu, side)
                        and r.fp8 == (prec == "FP8")]  # fmt: skip
                if cell:
                    lines.append(f"{fam + ' / ' + gpu:20s} {prec:9s} {side:8s} {_cell(cell)}")
    return lines


def format_rows(results: list[RowResult]) -> list[str]:
    """Every row: layout, measured and predicted step time, error, whether it fits, the
    shares of the predicted time and the fused attention's share."""
    head = " ".join(f"{s.split('_')[0][:4]:>4s}" for s in SHARES)
    lines = [f"{'#':>2s} {'family':12s} {'side':8s} {'kind':6s} {'prec':4s} {'model':18s} "
             f"{'layout':42s} {'from':11s} {'meas s':>8s} {'pred s':>8s} {'error':>7s} fits "
             f"| {head} | attn"]  # fmt: skip
    for r in results:
        shares = " ".join(f"{s:4.2f}" for s in r.shares)
        lines.append(
            f"{r.index:2d} {r.family:12s} {r.side:8s} {'+'.join(r.groups):6s} "
            f"{'FP8*' if r.fp8 else 'bf16':4s} {r.name[:18]:18s} {r.layout:42s} "
            f"{r.measured_from:11s} {r.measured_s:8.2f} {r.predicted_s:8.2f} "
            f"{100 * r.error:+6.1f}% {'yes' if r.fits else 'no ':4s} | {shares} | {r.attention:4.2f}"
        )
    return lines


def flop_check_rows() -> list[tuple[int, float, float, float]]:
    """(row, printed TFLOP/s, formula FLOPs / step time / GPUs in TFLOP/s, formula FLOPs
    per token) of the rows printing both step time and TFLOP/s."""
    out = []
    for i, row, _ in selected_rows():
        if row["measured_tflops_per_gpu"] and "step_time_s=" in row["notes"]:
            try:
                st = moe_cp_setup(row)
            except Skip:
                continue
            training = st.instance.training
            flops = megatron_flops_per_token(st.instance.model, training.seq_length)
            tokens = training.global_batch_size * training.seq_length
            implied = flops * tokens / st.measured_step_s / st.plan.num_gpus / TFLOPS
            out.append((i, float(row["measured_tflops_per_gpu"]), implied, flops))
    return out


def format_flop_check() -> list[str]:
    """Megatron-Core's FLOP formula against the rows printing step time and TFLOP/s."""
    lines = ["MCore model-FLOP formula on the rows printing step time and TFLOP/s: TFLOP/s "
             "printed, and formula FLOPs / step time / GPUs"]  # fmt: skip
    for i, printed, implied, flops in flop_check_rows():
        lines.append(f"  {i:2d} printed {printed:6.1f}, "
                     f"formula {implied:6.1f} ({flops / 1e9:.1f} GFLOP/token)")  # fmt: skip
    return lines


def format_pairs(pairs: list[DroplessPair], imbalance: float) -> list[str]:
    """The dropless runs predicted with ``imbalance``, per row and per side."""
    lines = [
        f"dropless runs at moe_load_imbalance {imbalance:.3f}: layout, slowdown over "
        "forced balance measured / predicted, dropless step s measured / predicted"
    ]
    for p in pairs:
        lines.append(f"  {p.index:2d} {p.side:8s} {p.layout:42s} {p.measured_ratio:.3f} "
                     f"{p.predicted_ratio:.3f} ({100 * p.ratio_error:+5.1f}%)  {p.measured_s:7.2f} "
                     f"{p.predicted_s:7.2f} ({100 * p.error:+5.1f}%)")  # fmt: skip
    for side in (FIT, HELD_OUT):
        if group := [p for p in pairs if p.side == side]:
            ratio = float(np.mean([abs(p.ratio_error) for p in group]))
            step = mape([p.predicted_s for p in group], [p.measured_s for p in group])
            lines.append(f"  {side}: slowdown MAPE {100 * ratio:.1f}%, dropless step-time "
                         f"MAPE {100 * step:.1f}% ({len(group)} rows)")  # fmt: skip
    return lines


def format_report(results: list[RowResult], skipped: list[Skipped]) -> str:
    """The report as plain text (without the dropless pairs)."""
    lines = [*format_summary(results), "", *format_rows(results), ""]
    lines.append(f"skipped ({len(skipped)}):")
    lines += [f"  {s.index:2d} {s.family:12s} {s.name[:24]:24s} {s.reason}" for s in skipped]
    lines += ["", *torchtitan_rows.format_references(results)]
    lines += ["", *torchtitan_rows.format_memory(results)]
    lines += ["", *format_flop_check()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the report (``--fit``: first fit the three parameters and print them; the
    report then uses them)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="fit the three parameters")
    args = parser.parse_args(argv)
    efficiency, imbalance = None, 1.0
    cp_attention = resolve_framework(FrameworkProfile(name="torchtitan")).cp_attention_efficiency
    if args.fit:
        fit = fit_parameters()
        efficiency, imbalance = fit.fp8_moe_efficiency, fit.imbalance
        print(f"fitted dropless moe_load_imbalance = {fit.imbalance:.3f} (fit-side slowdown "
              f"MAPE {100 * fit.imbalance_mape:.1f}%)")  # fmt: skip
        print(f"fitted compute_efficiency of NeMo FP8 MoE rows = {efficiency:.3f} (NeMo's "
              f"0.926; fit-side step-time MAPE {100 * fit.efficiency_mape:.1f}%)")  # fmt: skip
        print(f"fitted cp_attention_efficiency of torchtitan = {fit.cp_attention:.2f} (the "
              f"profile holds {cp_attention:.2f}; fit-side step-time MAPE "
              f"{100 * fit.cp_attention_mape:.1f}%)\n")  # fmt: skip
        cp_attention = fit.cp_attention
    with torchtitan_rows.cp_attention_efficiency(cp_attention):
        results, skipped = run(efficiency)
        report = format_report(results, skipped)
    print(report)
    print("", *format_pairs(dropless_pairs(imbalance), imbalance), sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
