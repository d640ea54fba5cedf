"""Compute time of one model chunk per micro-batch.

Per layer and tensor-parallel rank: every GEMM (GQA and SwiGLU widths derived)
at a size-dependent achieved FLOP/s capped by the HBM roofline, memory-bound
element-wise work at HBM bandwidth, and the TP collectives over the intra-node
link.  Backward = 2 x the forward GEMMs (FlashAttention 2.5 x; under LoRA the frozen
GEMMs' data gradients alone, plus the adapters': :mod:`pipette_cp.cost.compute.adapters`);
full recompute
adds one forward, selective the attention core (and Megatron-Core's other named modules
their forward: :mod:`pipette_cp.cost.compute.recompute_time`).  Under fp8 training the layer GEMMs
(QKV, projection, FC1, FC2) run at the FP8 ceiling
(:func:`~pipette_cp.cost.compute.gemm.fp8_gemm_time_s`) plus the
HBM traffic of their casts to FP8 (:func:`pipette_cp.cost.stack.kernels.quantization_cast_bytes`);
the attention core, the LM head and the element-wise kernels stay bf16 (Megatron builds
its output layer outside Transformer Engine).  Parameters per GPU type live in
:mod:`pipette_cp.cost.stack.calibration`; a :class:`~pipette_cp.specs.profile.LayerProfile`
of measured per-layer times replaces the estimate.  The GEMMs and FLOP counts live in
:mod:`pipette_cp.cost.workload.flops`.

With context parallelism a GPU processes ``s b / cp`` tokens and 1/cp of the causal
attention, plus the exposed K/V ring (:mod:`pipette_cp.cost.compute.context_ring`).  What a
layer computes and moves, dense or mixture-of-experts, is listed by
:mod:`pipette_cp.cost.compute.layer_work`; :func:`chunk_times` counts each chunk's dense and
MoE layers apart.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, field, fields
from functools import partial

import numpy as np

from pipette_cp.cost.compute.adapters import adapter_times_s
from pipette_cp.cost.compute.context_ring import check_cp_bandwidth, ring_exposed_s
from pipette_cp.cost.compute.gemm import gemm_time_s, quantized_gemm_time_s
from pipette_cp.cost.compute.gemm import hbm_time_s as _hbm_time_s
from pipette_cp.cost.compute.hybrid_work import check_hybrid_plan, hybrid_cast_bytes, hybrid_work
from pipette_cp.cost.compute.layer_work import check_profile, layer_cast_bytes, layer_work
from pipette_cp.cost.compute.recompute_time import module_recompute_s
from pipette_cp.cost.compute.stage_extras import boundary_times as _boundary_times
from pipette_cp.cost.compute.stage_extras import mtp_times, tp_collective_time_s
from pipette_cp.cost.stack.attention_variants import FP8_ATTENTION_SPEEDUP
from pipette_cp.cost.stack.calibration import GpuCalibration, calibration_for, peak_flops
from pipette_cp.cost.stack.frameworks import (
    HOST_LINK_BYTES_PER_S,
    attention_scale,
    framework_calibration,
)
from pipette_cp.cost.stack.kernels import (
    SOFTMAX_BYTES,
    attention_kernel,
    check_precision,
    fused_attention_efficiency,
    uses_quantized_gemms,
)
from pipette_cp.cost.stack.offload import offload_savings
from pipette_cp.cost.workload.bf16_layers import bf16_layers_by_chunk, bf16_training
from pipette_cp.cost.workload.flops import ATTENTION_CORE, layer_gemms
from pipette_cp.cost.workload.hybrid import present_symbols, symbols_by_chunk
from pipette_cp.cost.workload.latent_attention import attention_input_width
from pipette_cp.cost.workload.sliding_window import window_tile_fraction
from pipette_cp.cost.workload.tokens import moe_layers_by_chunk
from pipette_cp.errors import SpecError, UnsupportedError
from pipette_cp.specs.gpu import GpuSpec
from pipette_cp.specs.knobs.recompute import selective_modules
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.profile import LayerProfile
from pipette_cp.specs.training import FUSED_ATTENTION, TrainingSpec


# ------------------------------------------------------------------------- timing
@dataclass(frozen=True)
class LayerTimes:
    """Times of one transformer layer for one micro-batch on one GPU, s.

    ``backward_s`` includes the recomputation; the ``*_comm_*`` fields are the exposed
    communication inside ``forward_s`` and ``backward_s`` (TP collectives, and the
    context-parallel K/V ring: 0 with cp = 1).
    """

    forward_s: float
    backward_s: float
    tp_comm_forward_s: float
    tp_comm_backward_s: float
    recompute_s: float
    cp_comm_forward_s: float = 0.0
    cp_comm_backward_s: float = 0.0


def _attention_core_times(
    model: ModelSpec, training: TrainingSpec, gpu: GpuSpec, plan: Plan, cal: GpuCalibration
) -> tuple[float, float]:
    """(forward, backward) of the attention core: scores, softmax, dropout, context."""
    s, b, t = training.seq_length, plan.micro_batch_size, plan.tp
    gemms = [g for g in layer_gemms(model, s, b, t, plan.cp) if g.name in ATTENTION_CORE]
    kernel = attention_kernel(training, plan, gpu)
    if kernel in FUSED_ATTENTION:
        # FlashAttention (Dao et al. 2022; Dao 2023): causal blocks skipped (half the
        # FLOPs), backward = 2.5 x forward (5 GEMMs instead of 2); a sliding window's
        # layers run their share of the tiles (cost.attention_window).  The scores take
        # the query/key head width, the context the value width (latent attention).
        flops = 0.5 * sum(g.flops for g in gemms) * window_tile_fraction(model, s)
        efficiency = fused_attention_efficiency(
            kernel, gpu, cal.flash_attention_efficiency
        ) * attention_scale(training, cal.gpu_family, plan.cp)
        forward = flops / (efficiency * peak_flops(gpu))
        if training.fp8_attention:  # cuDNN's FP8 attention (cost.stack.attention_variants)
            forward /= FP8_ATTENTION_SPEEDUP
        return forward, 2.5 * forward
    drop = 1.0 if training.dropout else 0.0
    scores = b * model.num_attention_heads / t * s * s / plan.cp
    # The softmax path (cost.kernels.SOFTMAX_BYTES); dropout reads 2, writes 2 + 1 (mask).
    softmax_bytes = scores * (SOFTMAX_BYTES[kernel] + 5.0 * drop)
    forward = sum(gemm_time_s(g, gpu, cal) for g in gemms) + _hbm_time_s(softmax_bytes, gpu, cal)
    backward_gemms = sum(gemm_time_s(x, gpu, cal) for g in gemms for x in g.backward())
    return forward, backward_gemms + 2.0 * _hbm_time_s(softmax_bytes, gpu, cal)


def cp_step_thresholds_s(
    model: ModelSpec, training: TrainingSpec, gpu: GpuSpec, plan: Plan
) -> tuple[float, float]:
    """(forward, backward) attention core per context-parallel ring step, s: the time
    one K/V pass hides behind (:func:`~pipette_cp.cost.compute.context_ring.ring_exposed_s`)."""
    cal = framework_calibration(calibration_for(gpu), training)
    forward, backward = _attention_core_times(model, training, gpu, plan, cal)
    return forward / plan.cp, backward / plan.cp


def _layer_tp_comm_s(
    model: ModelSpec, training: TrainingSpec, plan: Plan, bw: float, collectives: int = 4
) -> float:
    """TP communication of one layer's forward pass (the backward has the same), s."""
    # Megatron TP: 2 all-reduces per layer in forward and 2 in backward, or with SP
    # 2 all-gathers + 2 reduce-scatters each way (Korthikanti et al. 2022 sec. 4.2.2),
    # of the b s h / cp activation, 2 B per element; latent attention's first one
    # moves its latents instead (cost.latent_attention.attention_input_width).
    act_bytes = 2.0 * training.seq_length * plan.micro_batch_size * model.hidden_size / plan.cp
    first = act_bytes * attention_input_width(model) / model.hidden_size
    rest = (collectives - 1) * tp_collective_time_s(act_bytes, plan.tp, bw)
    return tp_collective_time_s(first, plan.tp, bw) + rest


def _combine(compute: float, comm: float, overlap: bool) -> tuple[float, float]:
    """(pass time, exposed communication) with or without overlapping."""
    exposed = max(0.0, comm - compute) if overlap else comm
    return compute + exposed, exposed


def layer_times(
    model: ModelSpec,
    training: TrainingSpec,
    gpu: GpuSpec,
    plan: Plan,
    tp_bandwidth_bytes_per_s: float,
    calibration: GpuCalibration | None = None,
    *,
    cp_bandwidth_bytes_per_s: float = 0.0,
    moe: bool = False,
    symbol: str | None = None,
) -> LayerTimes:
    """Analytic forward/backward/recompute time of one layer for one micro-batch
    (``calibration``, if given, is used as it is; by default the GPU's, scaled by the
    training framework's compute efficiency, :mod:`pipette_cp.cost.stack.frameworks`).

    ``moe``: a mixture-of-experts layer instead of a dense one (without the placement's
    expert-parallel all-to-all); with ``etp > 1`` its routed tokens' all-gather and
    reduce-scatter run at ``tp_bandwidth_bytes_per_s``, not overlapped (the token
    dispatcher issues them).  ``cp_bandwidth_bytes_per_s``: the stage's K/V rings'.
    ``symbol``: a hybrid model's sublayer instead (:mod:`pipette_cp.cost.compute.hybrid_work`).
    """
    cal = calibration or framework_calibration(calibration_for(gpu), training)
    check_cp_bandwidth(plan, cp_bandwidth_bytes_per_s)
    if symbol is None:
        work = layer_work(model, training, plan, moe)
    else:
        work = hybrid_work(model, training, plan, symbol)
    dense = work.gemms  # FP8 under fp8 (the router apart)
    frozen = training.lora is not None  # LoRA: no weight gradient of the layer GEMMs
    core_fwd, core_bwd = (
        _attention_core_times(model, training, gpu, plan, cal) if work.attention else (0.0, 0.0)
    )
    elementwise = _hbm_time_s(work.elementwise_bytes, gpu, cal)
    if uses_quantized_gemms(training):  # the layer GEMMs in FP8 / NVFP4 (TE), plus casts
        check_precision(training, gpu)
        fwd_gemms = sum(quantized_gemm_time_s(g, gpu, cal, training) for g in dense)
        bwd_gemms = sum(
            quantized_gemm_time_s(x, gpu, cal, training) for g in dense for x in g.backward(frozen)
        )
        casts = (layer_cast_bytes(model, training, plan, moe) if symbol is None
                 else hybrid_cast_bytes(model, training, plan, symbol))  # fmt: skip
        cast_fwd, cast_bwd = (_hbm_time_s(x, gpu, cal) for x in casts)
        fwd_gemms, bwd_gemms = fwd_gemms + cast_fwd, bwd_gemms + cast_bwd
    else:
        fwd_gemms = sum(gemm_time_s(g, gpu, cal) for g in dense)
        bwd_gemms = sum(gemm_time_s(x, gpu, cal) for g in dense for x in g.backward(frozen))
    adapter_fwd, adapter_bwd = adapter_times_s(model, training, gpu, plan, cal)  # LoRA's
    fwd_gemms, bwd_gemms = fwd_gemms + adapter_fwd, bwd_gemms + adapter_bwd
    # the router GEMM and a Mamba mixer's scan stay bf16 under FP8
    for gemm in (*((work.router,) if work.router is not None else ()), *work.scan_gemms):
        fwd_gemms += gemm_time_s(gemm, gpu, cal)
        bwd_gemms += sum(gemm_time_s(x, gpu, cal) for x in gemm.backward())
    fwd_compute = fwd_gemms + core_fwd + elementwise
    # Backward of element-wise kernels reads the saved input and the output gradient
    # and writes the input gradient: ~2 x the forward traffic (assumption).
    bwd_compute = bwd_gemms + core_bwd + 2.0 * elementwise
    comm = _layer_tp_comm_s(
        model, training, plan, tp_bandwidth_bytes_per_s, work.activation_collectives
    )
    overlap = training.tp_comm_overlap  # Megatron --tp-comm-overlap: hidden under the GEMMs
    forward, comm_fwd = _combine(fwd_compute, comm, overlap)
    backward, comm_bwd = _combine(bwd_compute, comm, overlap)
    if work.expert_collective_bytes:
        gathered = work.expert_collective_bytes  # etp all-gather + reduce-scatter, exposed
        expert = 2 * tp_collective_time_s(gathered, plan.expert_tp, tp_bandwidth_bytes_per_s)
        forward, backward = forward + expert, backward + expert
        comm_fwd, comm_bwd = comm_fwd + expert, comm_bwd + expert
    cp_fwd, cp_bwd = ring_exposed_s(
        model, training, plan, cp_bandwidth_bytes_per_s, core_fwd, core_bwd
    )
    forward, backward = forward + cp_fwd, backward + cp_bwd
    if plan.offload_modules:  # fine-grained activation offloading: the copies not hidden
        copy = offload_savings(model, training, plan, moe) / HOST_LINK_BYTES_PER_S
        forward += max(0.0, copy - fwd_compute)
        backward += max(0.0, copy - bwd_compute)
    if plan.recompute == "full":
        recompute = forward
        comm_bwd += comm_fwd
        cp_bwd += cp_fwd
    elif plan.recompute_modules is None and plan.recompute == "selective":
        recompute = core_fwd + cp_fwd  # the attention core, with its K/V ring (0 without)
        cp_bwd += cp_fwd
    elif plan.recompute == "selective":  # Megatron-Core's named modules
        attention = "core_attn" in selective_modules(plan)
        recompute = core_fwd + cp_fwd if attention else 0.0
        cp_bwd += cp_fwd if attention else 0.0
        # a hybrid model's Mamba and attention sublayers have no module but core_attn
        extra, extra_comm = (0.0, 0.0) if symbol in ("M", "*") else module_recompute_s(
            model, training, gpu, plan, cal, work, tp_bandwidth_bytes_per_s, moe or symbol == "E"
        )  # fmt: skip
        recompute, comm_bwd = recompute + extra, comm_bwd + extra_comm
    else:
        recompute = 0.0
    return LayerTimes(forward, backward + recompute, comm_fwd, comm_bwd, recompute, cp_fwd, cp_bwd)


def measured_layer_times(
    profile: LayerProfile,
    model: ModelSpec,
    training: TrainingSpec,
    plan: Plan,
    tp_bandwidth_bytes_per_s: float,
) -> LayerTimes:
    """Layer times of ``plan``'s profile entry; a compute-only profile (``includes_tp_comm``
    false, as ``pipette-cp profile`` writes) gets the analytic TP collectives added, which
    a fully recomputed forward repeats inside the backward;
    :class:`~pipette_cp.errors.UnsupportedError` for a MoE model or cp > 1
    (:func:`~pipette_cp.cost.compute.layer_work.check_profile`)."""
    check_profile(model, plan)
    if training.lora is not None:
        raise UnsupportedError("training.lora", "{...}", "a LayerProfile measures the layers "
                               "of full training, not LoRA's: drop the profile to use the "
                               "analytic model")  # fmt: skip
    entry = profile.lookup(plan, training)
    if profile.includes_tp_comm:
        return LayerTimes(entry.forward_s, entry.backward_s, 0.0, 0.0, 0.0)  # all measured
    comm = _layer_tp_comm_s(model, training, plan, tp_bandwidth_bytes_per_s)
    forward, comm_fwd = _combine(entry.forward_s, comm, training.tp_comm_overlap)
    backward, comm_bwd = _combine(entry.backward_s, comm, training.tp_comm_overlap)
    if plan.recompute == "full":
        backward, comm_bwd = backward + comm_fwd, comm_bwd + comm_fwd
    return LayerTimes(forward, backward, comm_fwd, comm_bwd, 0.0)


@dataclass(frozen=True)
class ChunkTimes:
    """Per micro-batch times of every chunk, by virtual stage ``v = chunk * pp + stage``.

    ``forward_s`` and ``backward_s`` (recomputation included; not the placement's
    expert-parallel all-to-all) feed the schedule; the other arrays are parts of them,
    for the breakdown (``cp_comm_*``: the exposed K/V ring, zeros when not given).
    Chunk 0 of stage 0 includes the embedding, the last chunk of the last stage the LM
    head and loss.
    """

    forward_s: np.ndarray
    backward_s: np.ndarray
    tp_comm_forward_s: np.ndarray
    tp_comm_backward_s: np.ndarray
    recompute_s: np.ndarray
    measured: bool = False  # True when the layer times come from a LayerProfile
    cp_comm_forward_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    cp_comm_backward_s: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        for name in (f.name for f in fields(self) if f.name != "measured"):
            array = np.array(getattr(self, name), dtype=np.float64)
            if name.startswith("cp_comm") and not array.size:  # not given: none
                array = np.zeros_like(self.forward_s)
            array.flags.writeable = False
            object.__setattr__(self, name, array)

    def per_stage(self, name: str, pp: int) -> np.ndarray:
        """Array ``name`` summed over the chunks of every stage (length ``pp``)."""
        return getattr(self, name).reshape(-1, pp).sum(axis=0)


def chunk_times(
    model: ModelSpec,
    training: TrainingSpec,
    gpu: GpuSpec,
    plan: Plan,
    tp_bandwidth_bytes_per_s: float,
    profile: LayerProfile | None = None,
    calibration: GpuCalibration | None = None,
    *,
    cp_bandwidth_bytes_per_s: float = 0.0,
) -> ChunkTimes:
    """Forward and backward time per micro-batch of every model chunk.

    Parameters
    ----------
    model, training, gpu, plan
        The job, the GPU type of the stage and the layout.
    tp_bandwidth_bytes_per_s
        Bottleneck of the slowest tensor-parallel group's ring (in NCCL's order,
        :mod:`pipette_cp.cost.network.tp_rings`), bytes/s, also of the expert-tensor groups
        (ignored when ``plan.tp == 1`` and ``etp == 1``).
    profile
        Measured per-layer times; when given, the plan's ``(tp, micro_batch_size)``
        must be in it and its times replace the analytic layer estimate (they
        already contain recomputation, so that part reads 0; TP communication is
        measured too, or added analytically when ``profile.includes_tp_comm`` is
        false, see :func:`measured_layer_times`; dense models without cp only).
    calibration
        Compute parameters (default: the fitted table entry of ``gpu``), scaled by the
        training framework's compute efficiency (:mod:`pipette_cp.cost.stack.frameworks`).
    cp_bandwidth_bytes_per_s
        Bottleneck of the stage's context-parallel rings, bytes/s (0 with cp = 1).

    Raises
    ------
    SpecError
        A non-positive TP bandwidth with ``tp > 1`` (or ``etp > 1``), or a profile
        without the plan (UnsupportedError: a profile with a MoE model or cp > 1).
    InfeasibleError
        A non-positive context-parallel bandwidth with ``cp > 1``.
    """
    cal = framework_calibration(calibration or calibration_for(gpu), training)
    check_precision(training, gpu)  # also where measured layer times replace the model
    etp = plan.expert_tp if model.is_moe else 1
    if max(plan.tp, etp) > 1 and not tp_bandwidth_bytes_per_s > 0:
        group = f"tp={plan.tp}" + (f", etp={etp}" if etp not in (1, plan.tp) else "")
        why = f"must be positive for {group} (a failed link inside a TP group)"
        raise SpecError("tp_bandwidth_bytes_per_s", tp_bandwidth_bytes_per_s, why)
    check_cp_bandwidth(plan, cp_bandwidth_bytes_per_s)
    analytic = partial(
        layer_times, model, training, gpu, plan, tp_bandwidth_bytes_per_s, cal,
        cp_bandwidth_bytes_per_s=cp_bandwidth_bytes_per_s,
    )  # fmt: skip
    check_hybrid_plan(model, training, plan)
    # the layer times of each kind the model has (a hybrid model: by symbol)
    if model.is_hybrid:
        kinds = {k: analytic(symbol=k) for k in present_symbols(model)}
    elif profile is None:
        kinds = {"dense": analytic()}
    else:
        kinds = {"dense": measured_layer_times(profile, model, training, plan, tp_bandwidth_bytes_per_s)}  # fmt: skip
    if model.is_moe and not model.is_hybrid:
        kinds["moe"] = analytic(moe=True)
    emb, head = _boundary_times(model, training, gpu, plan, tp_bandwidth_bytes_per_s, cal)
    layers = np.array(plan.layer_split, dtype=np.float64)
    if model.is_hybrid:  # each symbol's sublayer times its count per chunk
        by_symbol = symbols_by_chunk(model, plan)
        parts = np.sum([np.outer(astuple(t), by_symbol[k]) for k, t in kinds.items()], axis=0)
    elif model.is_moe:
        n_moe = moe_layers_by_chunk(model, plan)
        parts = np.outer(astuple(kinds["dense"]), layers - n_moe)
        parts += np.outer(astuple(kinds["moe"]), n_moe)
    else:
        parts = np.outer(astuple(kinds["dense"]), layers)
    if bf16 := bf16_layers_by_chunk(model, training, plan):  # layers kept in bf16
        plain = partial(
            layer_times, model, bf16_training(training), gpu, plan, tp_bandwidth_bytes_per_s,
            cal, cp_bandwidth_bytes_per_s=cp_bandwidth_bytes_per_s,
        )  # fmt: skip
        for kind, counts in bf16.items():
            kw: dict = {"symbol": kind} if model.is_hybrid else {"moe": kind == "moe"}
            # against the analytic quantised layer (a profile's measured one aside)
            quantised = kinds[kind] if profile is None or kind != "dense" else analytic(**kw)
            parts += np.outer(np.subtract(astuple(plain(**kw)), astuple(quantised)), counts)
    parts[:4, 0] += emb  # rows as LayerTimes: fwd, bwd, tp comm fwd/bwd, recompute, cp comm
    parts[:4, -1] += head
    if model.mtp_layers:  # on the last stage (cost.boundary), a block of the last layer's kind
        if model.is_hybrid:  # the sublayers of mtp_hybrid_pattern
            mtp = model.mtp_hybrid_pattern or ""
            times = [kinds[k] if k in kinds else analytic(symbol=k) for k in mtp]
            block = LayerTimes(*np.sum([astuple(t) for t in times], axis=0))
        else:
            block = kinds["moe" if model.is_moe_layer(model.num_layers - 1) else "dense"]
        mtp_args = (tp_bandwidth_bytes_per_s, cal, astuple(block), (emb, head))
        parts[:, -1] += mtp_times(model, training, gpu, plan, *mtp_args)
    forward, backward, tp_forward, tp_backward, recompute, cp_forward, cp_backward = parts
    return ChunkTimes(
        forward, backward, tp_forward, tp_backward, recompute, measured=profile is not None,
        cp_comm_forward_s=cp_forward, cp_comm_backward_s=cp_backward,
    )  # fmt: skip
