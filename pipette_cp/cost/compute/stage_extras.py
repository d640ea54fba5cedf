"""The first and last pipeline stage's extras: embedding, LM head and loss, and the
multi-token prediction modules.

:func:`boundary_times` times the embedding (chunk 0 of stage 0) and the final norm, LM
head and vocab-parallel loss (the last chunk of the last stage) per micro-batch.

Multi-token prediction (DeepSeek-V3, arXiv:2412.19437 sec. 2.2; Megatron-Core
``MultiTokenPredictionBlock``, ``--mtp-num-layers``): module ``k`` normalises the
previous depth's hidden state and the embedding of the tokens shifted by ``k`` (enorm,
hnorm), projects their concatenation back to ``h`` (``eh_proj``, a column-parallel
``2h x h``, its output gathered along the hidden dimension), runs one transformer block
of the last layer's kind, its final norm, the shared output head and a cross-entropy.
Megatron-Core puts every MTP layer on the last pipeline stage unless a
``pipeline_model_parallel_layout`` says otherwise (Megatron-LM
``docs/user-guide/features/multi_token_prediction.md``, "Pipeline Parallel Layout for
MTP": "By default, all MTP layers sit on the last pipeline stage"), so the modules are
constants of the last virtual stage: :func:`mtp_times` (time) and
:func:`mtp_param_split` (weights, defined with the other parameter counts in
:mod:`pipette_cp.cost.workload.parameters`, which counts them on the last stage: the blocks,
eh_proj, the three norms, and a copy of the word embedding on the last stage when it has
none: Megatron-Core's ``GPTModel`` builds the embedding ``if self.pre_process or
self.mtp_process``).
"""

from __future__ import annotations

import numpy as np

from pipette_cp.cost.compute.gemm import gemm_time_s, hbm_time_s
from pipette_cp.cost.stack.calibration import COLLECTIVE_LATENCY_S, GpuCalibration
from pipette_cp.cost.stack.kernels import CROSS_ENTROPY_BYTES, norm_bytes
from pipette_cp.cost.workload.flops import Gemm
from pipette_cp.cost.workload.parameters import mtp_param_split, padded_vocab_size
from pipette_cp.specs.gpu import GpuSpec
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import TrainingSpec

__all__ = ["boundary_times", "mtp_param_split", "mtp_times", "tp_collective_time_s"]

Times = tuple[float, float, float, float]  # forward, backward, TP comm forward, backward


def tp_collective_time_s(num_bytes: float, tp: int, bandwidth_bytes_per_s: float) -> float:
    """One ring all-gather or reduce-scatter of ``num_bytes`` over ``tp`` ranks.

    ``(t-1)/t x bytes / B`` plus a start-up latency (Patarasuk & Yuan 2009;
    an all-reduce is one of each).
    """
    if tp <= 1:
        return 0.0
    return COLLECTIVE_LATENCY_S + (tp - 1) / tp * num_bytes / bandwidth_bytes_per_s


def boundary_times(
    model: ModelSpec,
    training: TrainingSpec,
    gpu: GpuSpec,
    plan: Plan,
    tp_bandwidth_bytes_per_s: float,
    cal: GpuCalibration,
) -> tuple[Times, Times]:
    """(fwd, bwd, tp comm fwd, tp comm bwd) of the embedding and of LM head + loss
    (over the ``s b / cp`` tokens of a context-parallel rank)."""
    s, b, t = training.seq_length, plan.micro_batch_size, plan.tp
    tokens, h = s * b // plan.cp, model.hidden_size
    vocab = padded_vocab_size(model, t)
    # Vocab-parallel embedding: one all-reduce (two ring halves) of b s h, 2 B each;
    # the LM head gathers its input in forward and reduces its gradient in backward.
    half = tp_collective_time_s(2.0 * tokens * h, t, tp_bandwidth_bytes_per_s)
    # Embedding: gather rows (read + write 2 B), dropout (read, write, mask); backward
    # scatter-adds the gradient into the table (~2 x the traffic), which a frozen table
    # (LoRA, cost.workload.lora) does not need.
    frozen = training.lora is not None
    emb_bytes = tokens * h * (4.0 + 5.0)
    emb_bwd = 0.0 if frozen else hbm_time_s(2 * emb_bytes, gpu, cal)
    emb = (hbm_time_s(emb_bytes, gpu, cal) + 2 * half, emb_bwd)
    head = Gemm("lm_head", tokens, vocab // t, h)
    logits = tokens * vocab / t
    # The vocab-parallel cross-entropy (cost.kernels.CROSS_ENTROPY_BYTES, fused or not);
    # final norm 8 B (forward) and 16 B (backward) per hidden element.
    ce_fwd, ce_bwd = CROSS_ENTROPY_BYTES[training.fused_cross_entropy]
    head_fwd = gemm_time_s(head, gpu, cal) + hbm_time_s(
        ce_fwd * logits + 8.0 * tokens * h, gpu, cal
    )
    head_bwd = sum(gemm_time_s(g, gpu, cal) for g in head.backward(frozen))
    head_bwd += hbm_time_s(ce_bwd * logits + 16.0 * tokens * h, gpu, cal)
    return (*emb, 2 * half, 0.0), (head_fwd + half, head_bwd + half, half, half)


def mtp_times(
    model: ModelSpec,
    training: TrainingSpec,
    gpu: GpuSpec,
    plan: Plan,
    tp_bandwidth_bytes_per_s: float,
    cal: GpuCalibration,
    block: tuple[float, ...],
    boundary: tuple[Times, Times],
) -> np.ndarray:
    """Per micro-batch times of all the multi-token prediction modules, as the rows of
    :class:`~pipette_cp.cost.compute.model_chunks.LayerTimes` (fwd, bwd, tp comm fwd, bwd, recompute,
    cp comm fwd, bwd); zeros without them.

    Each module: ``block`` (the layer times of the last layer's kind, recomputation and
    K/V ring included), the embedding and LM head + loss of :func:`boundary_times`
    (``boundary``), ``eh_proj`` as a bf16 GEMM of ``s b / cp`` rows (its FP8 form under
    fp8 training is not modelled: errs slow), the enorm and hnorm (2 norms of ``h``,
    backward 2 x the traffic, as the layers' element-wise kernels), and the
    sequence-parallel all-gather of its ``2h`` input and the all-gather of its ``h``
    output over the tensor-parallel group (reduce-scatters in backward), not overlapped.
    """
    out = np.zeros(7)
    if not model.mtp_layers:
        return out
    t, h = plan.tp, model.hidden_size
    tokens = training.seq_length * plan.micro_batch_size // plan.cp
    proj = Gemm("eh_proj", tokens, h // t, 2 * h)
    rows = tokens * h / (t if plan.sequence_parallel else 1)
    norms = hbm_time_s(2 * rows * norm_bytes(model, training, plan), gpu, cal)
    act = 2.0 * tokens * h  # bytes of one s b h / cp activation, 2 B each
    comm = tp_collective_time_s(2 * act, t, tp_bandwidth_bytes_per_s)
    comm += tp_collective_time_s(act, t, tp_bandwidth_bytes_per_s)
    fwd = gemm_time_s(proj, gpu, cal) + norms + comm
    bwd = sum(gemm_time_s(g, gpu, cal) for g in proj.backward()) + 2 * norms + comm
    (emb_f, emb_b, emb_cf, emb_cb), (head_f, head_b, head_cf, head_cb) = boundary
    out[:] = block
    out[:4] += (fwd + emb_f + head_f, bwd + emb_b + head_b, comm + emb_cf + head_cf,
                comm + emb_cb + head_cb)  # fmt: skip
    return model.mtp_layers * out
