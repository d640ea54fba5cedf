"""FLOP counts: the GEMMs of one transformer layer on one tensor-parallel (and
context-parallel) rank, the model FLOPs of an iteration (for MFU) and the executed ones
with recomputation (for HFU).

Mixture-of-experts models count what a token activates (the MFU convention of
Megatron-Core MoE and DeepSeek-V3: FLOPs of the activated parameters): the router,
its ``top_k`` routed experts and the shared experts of every MoE layer, the dense MLP of
every dense layer; capacity padding, dropped tokens and load imbalance are not model
FLOPs.  Context parallelism splits the work of a sequence without changing it.  A hybrid
model's sublayers count their own GEMMs: a Mamba-2 mixer its projections and the
batched products of its SSD scan (:func:`mamba_projection_gemms`, :func:`ssd_gemms`;
the mixer is described in :mod:`pipette_cp.cost.workload.hybrid`).

Their timing lives in :mod:`pipette_cp.cost.compute.model_chunks`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipette_cp.cost.workload.sliding_window import window_flops_fraction
from pipette_cp.specs.knobs.recompute import selective_modules
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import TrainingSpec

#: The GEMMs of the attention core (what selective recomputation redoes).
ATTENTION_CORE = ("scores", "context")
#: The attention's projections: QKV and output, or those of multi-head latent attention.
ATTENTION_PROJECTIONS = ("qkv", "q_down", "q_up", "q_proj", "kv_down", "kv_up", "proj")
#: The latent attention's down-projections, duplicated on every tensor-parallel rank.
DUPLICATED = ("q_down", "kv_down")
_ALL = (*ATTENTION_PROJECTIONS, *ATTENTION_CORE, "fc1", "fc2")
#: Tokens per chunk of the SSD scan (``chunk_size`` 128 in Megatron-Core's MambaMixer).
SSD_CHUNK = 128
#: The symbols of a hybrid pattern in the order costs are listed
#: (:mod:`pipette_cp.cost.workload.hybrid`).
SYMBOLS = ("M", "*", "-", "E")


@dataclass(frozen=True)
class Gemm:
    """One (possibly batched) matrix product ``[m x k] @ [k x n]`` in 2-byte elements."""

    name: str
    m: int
    n: int
    k: int
    batch: int = 1

    @property
    def flops(self) -> float:
        """2 m n k per product (a multiply and an add)."""
        return 2.0 * self.m * self.n * self.k * self.batch

    def backward(self, frozen: bool = False) -> tuple[Gemm, ...]:
        """Data-gradient and weight-gradient products (same FLOPs each); ``frozen``: the
        weight is not trained (LoRA's base weights), the data gradient alone."""
        dgrad = Gemm(f"{self.name}.dgrad", self.m, self.k, self.n, self.batch)
        if frozen:
            return (dgrad,)
        return dgrad, Gemm(f"{self.name}.wgrad", self.k, self.n, self.m, self.batch)


def qkv_widths(model: ModelSpec) -> tuple[int, int, int]:
    """Widths of one token's queries, keys and values over all heads, whole (not split
    over tp): ``heads x d``, ``kv heads x d`` and ``kv heads x d_v`` (latent attention's
    query/key and value head widths, :attr:`ModelSpec.head_size`,
    :attr:`ModelSpec.v_head_size`)."""
    return (model.num_attention_heads * model.head_size, model.kv_heads * model.head_size,
            model.kv_heads * model.v_head_size)  # fmt: skip


def fc1_factor(model: ModelSpec) -> int:
    """Output columns of FC1 per unit of MLP width: 2 for SwiGLU (gate and up), else 1."""
    return 2 if model.activation == "swiglu" else 1


def attention_projection_gemms(
    model: ModelSpec, tokens: int, tp: int, sequence_parallel: bool = False
) -> tuple[Gemm, ...]:
    """Forward projection GEMMs of one layer's attention on one tensor-parallel rank over
    ``tokens`` rows: QKV (column-parallel) and the output projection (row-parallel).

    Multi-head latent attention (Megatron-Core ``MLASelfAttention``, DeepSeek-V2 sec.
    2.1.2): the down-projections ``linear_q_down_proj`` (h x q_lora_rank) and
    ``linear_kv_down_proj`` (h x (kv_lora_rank + rope)) are Transformer Engine ``TELinear``
    with ``parallel_mode='duplicated'`` (the TE layer spec): unsplit on every rank, over
    the rank's ``tokens / tp`` sequence-parallel rows, else over all ``tokens`` (the
    work duplicated); the up-projections ``linear_q_up_proj`` (q_lora_rank x heads (nope
    + rope); ``linear_q_proj`` from h without q_lora_rank) and ``linear_kv_up_proj``
    (kv_lora_rank x heads (nope + v)) are column-parallel, ``linear_proj`` (heads v x h)
    row-parallel.
    """
    h, heads = model.hidden_size, model.num_attention_heads
    if not model.is_mla:
        q_width, kv_width = heads * model.head_size, model.kv_heads * model.head_size
        return (
            Gemm("qkv", tokens, (q_width + 2 * kv_width) // tp, h),
            Gemm("proj", tokens, h, q_width // tp),
        )
    assert model.kv_lora_rank is not None and model.qk_rope_head_dim is not None
    assert model.qk_nope_head_dim is not None
    local = tokens // tp if sequence_parallel else tokens  # rows of a duplicated GEMM
    qk, v = model.head_size, model.v_head_size
    if model.q_lora_rank is None:
        queries: tuple[Gemm, ...] = (Gemm("q_proj", tokens, heads * qk // tp, h),)
    else:
        rank = model.q_lora_rank
        queries = (Gemm("q_down", local, rank, h), Gemm("q_up", tokens, heads * qk // tp, rank))
    latent = model.kv_lora_rank + model.qk_rope_head_dim
    up = heads * (model.qk_nope_head_dim + v) // tp
    return (
        *queries,
        Gemm("kv_down", local, latent, h),
        Gemm("kv_up", tokens, up, model.kv_lora_rank),
        Gemm("proj", tokens, h, heads * v // tp),
    )


def layer_gemms(
    model: ModelSpec,
    seq_length: int,
    micro_batch_size: int,
    tp: int,
    cp: int = 1,
    sequence_parallel: bool = False,
) -> tuple[Gemm, ...]:
    """Forward GEMMs of one transformer layer on one tensor-parallel rank.

    Megatron's layer: the attention projections (:func:`attention_projection_gemms`),
    scores ``Q K^T`` (query/key head width) and context ``P V`` (value head width: they
    differ with latent attention) per head (batched over ``b a / t`` heads), FC1
    (column-parallel; SwiGLU doubles its width) and FC2 (row-parallel).  With
    context parallelism (``cp``) a rank holds ``s / cp`` of every sequence: the
    projections run over ``s b / cp`` rows, and its queries attend over the whole
    sequence's keys (``s / cp x s`` scores: 1/cp of the attention; Megatron's
    load-balanced chunks give each rank 1/cp of the causal work too).  The core is the
    full ``s x s`` product (a sliding window's share: :func:`core_flops`).
    """
    h, f, s = model.hidden_size, model.ffn_hidden_size, seq_length
    d, dv = model.head_size, model.v_head_size
    tokens, queries = s * micro_batch_size // cp, s // cp
    heads = micro_batch_size * model.num_attention_heads // tp
    fc1_width = fc1_factor(model) * f
    *projections, proj = attention_projection_gemms(model, tokens, tp, sequence_parallel)
    return (
        *projections,
        Gemm("scores", queries, s, d, heads),
        Gemm("context", queries, dv, s, heads),
        proj,
        Gemm("fc1", tokens, fc1_width // tp, h),
        Gemm("fc2", tokens, h, f // tp),
    )


def core_flops(model: ModelSpec, seq_length: int, gemms: tuple[Gemm, ...], names: tuple) -> float:
    """FLOPs of the ``gemms`` named in ``names``, the attention core's at the share a
    sliding window leaves (:func:`~pipette_cp.cost.workload.sliding_window.window_flops_fraction`)."""
    window = window_flops_fraction(model, seq_length)
    return sum(
        g.flops * (window if g.name in ATTENTION_CORE else 1.0) for g in gemms if g.name in names
    )


def layer_forward_flops(
    model: ModelSpec, seq_length: int, micro_batch_size: int = 1, tp: int = 1
) -> float:
    """Forward FLOPs of one layer on one rank; ``24 b s h^2 + 4 b s^2 h`` for GPT.

    Narayanan et al. 2021 sec. 5.1 (ffn = 4h, MHA); attention counted in full
    (no causal halving), as Megatron's FLOP counters do; a sliding window's layers at
    their share of it (:func:`core_flops`).
    """
    gemms = layer_gemms(model, seq_length, micro_batch_size, tp)
    return core_flops(model, seq_length, gemms, _ALL)


def moe_mlp_active_flops(model: ModelSpec, seq_length: int) -> float:
    """Forward FLOPs per sequence of one mixture-of-experts MLP as a token activates it:
    the router (``2 s h E``), ``top_k`` routed experts and the shared experts (``2 s``
    per weight of each, SwiGLU's three matrices or GeLU's two), the shared-expert gate
    (``2 s h``)."""
    s, h = seq_length, model.hidden_size
    per_width = (fc1_factor(model) + 1) * h  # weights per unit of MLP width
    router = 2.0 * s * h * model.num_experts
    latent = 2.0 * s * 2 * h * (model.moe_latent_size or 0)  # LatentMoE's projections
    expert_per_width = (fc1_factor(model) + 1) * model.expert_hidden_size
    routed = 2.0 * s * model.moe_top_k * model.expert_width * expert_per_width + latent
    shared = 2.0 * s * model.shared_expert_width * per_width
    gate = 2.0 * s * h if model.shared_expert_gate else 0.0
    return router + routed + shared + gate


def moe_layer_forward_flops(model: ModelSpec, seq_length: int) -> float:
    """Forward FLOPs per sequence of one mixture-of-experts layer (active parameters):
    attention as in a dense layer plus :func:`moe_mlp_active_flops`."""
    attention = (*ATTENTION_PROJECTIONS, *ATTENTION_CORE)
    gemms = layer_gemms(model, seq_length, 1, 1)
    return core_flops(model, seq_length, gemms, attention) + moe_mlp_active_flops(model, seq_length)


def _layers_forward_flops(model: ModelSpec, seq_length: int) -> float:
    """Forward FLOPs per sequence of every transformer layer (MoE layers active)."""
    dense = model.num_dense_layers * layer_forward_flops(model, seq_length)
    return dense + model.num_moe_layers * moe_layer_forward_flops(model, seq_length)


def mtp_forward_flops(model: ModelSpec, seq_length: int) -> float:
    """Forward FLOPs per sequence of the multi-token prediction modules (DeepSeek-V3 sec.
    2.2): each a block of the last layer's kind, its ``eh_proj`` (``2 s 2h h``) and a
    logits GEMM of the shared output head (``2 s h V``); 0 without them."""
    if not model.mtp_layers:
        return 0.0
    s, h = seq_length, model.hidden_size
    last = model.num_layers - 1
    if model.is_hybrid:  # the sublayers of mtp_hybrid_pattern
        block = sum(hybrid_forward_flops(model, s, k) for k in model.mtp_hybrid_pattern or "")
    else:
        kind = moe_layer_forward_flops if model.is_moe_layer(last) else layer_forward_flops
        block = kind(model, s)
    return model.mtp_layers * (block + 2.0 * s * 2 * h * h + 2.0 * s * h * model.vocab_size)


def model_flops_per_iteration(model: ModelSpec, training: TrainingSpec) -> float:
    """Model FLOPs of one iteration (for MFU): forward + backward, no recompute.

    ``3 x (L x layer forward + logits)`` per sequence; for GPT this is
    ``72 B s L h^2 (1 + s/(6h) + V/(12 L h))`` (Narayanan et al. 2021, eq. 3
    without recomputation), i.e. ~6 N FLOPs per token plus attention.  A
    mixture-of-experts model: ~6 N_active per token plus attention (its MoE layers by
    :func:`moe_layer_forward_flops`, its dense layers as a dense model's).  The
    multi-token prediction modules are model FLOPs too (:func:`mtp_forward_flops`).
    """
    s = training.seq_length
    # Logits GEMM, 2 s h V per sequence (Narayanan et al. 2021).
    logits = 2.0 * s * model.hidden_size * model.vocab_size
    if model.is_hybrid:
        per_seq = hybrid_layers_forward_flops(model, s) + logits
    elif model.is_moe:
        per_seq = _layers_forward_flops(model, s) + logits
    else:
        per_seq = model.num_layers * layer_forward_flops(model, s) + logits
    per_seq += mtp_forward_flops(model, s)
    return 3.0 * per_seq * training.global_batch_size


def hardware_flops_per_iteration(model: ModelSpec, training: TrainingSpec, plan: Plan) -> float:
    """Executed FLOPs of one iteration (for HFU): model FLOPs plus recomputation.

    Full recompute adds one layer forward, ``96 B s L h^2 (1 + s/(6h) + V/(16 L h))``
    for GPT (Narayanan et al. 2021, eq. 3); selective adds the attention core, or with
    Megatron-Core's named modules the GEMMs they redo (:data:`MODULE_GEMMS`).  A
    mixture-of-experts model's full recompute redoes its layers' active FLOPs.  The
    multi-token prediction blocks are recomputed like the others (not counted here).
    """
    s = training.seq_length
    gemms = layer_gemms(model, s, 1, 1)
    if model.is_hybrid:
        extra = hybrid_recompute_flops(model, s, plan)
    elif plan.recompute == "full":
        extra = _layers_forward_flops(model, s) if model.is_moe else core_flops(
            model, s, gemms, _ALL) * model.num_layers  # fmt: skip
    elif plan.recompute == "selective" and plan.recompute_modules is not None:
        extra = _module_recompute_flops(model, s, gemms, plan.recompute_modules)
    elif plan.recompute == "selective":  # Megatron's default: the attention core
        extra = core_flops(model, s, gemms, ATTENTION_CORE) * model.num_layers
    else:
        extra = 0.0
    return model_flops_per_iteration(model, training) + extra * training.global_batch_size


#: The GEMMs (by name) each of Megatron-Core's recompute modules redoes beyond the
#: attention core (``core_attn``: :data:`ATTENTION_CORE`); ``layernorm`` and ``moe_act``
#: redo element-wise kernels only.
MODULE_GEMMS: dict[str, tuple[str, ...]] = {
    "mlp": ("fc1", "fc2"),
    "moe": ("expert_fc1", "expert_fc2", "shared_fc1", "shared_fc2", "latent_down", "latent_up"),
    "shared_experts": ("shared_fc1", "shared_fc2"),
    "mla_up_proj": ("q_up", "kv_up"),
}


def _module_recompute_flops(
    model: ModelSpec, seq_length: int, gemms: tuple[Gemm, ...], modules: tuple[str, ...]
) -> float:
    """Forward FLOPs per sequence that the named modules redo over every layer: the
    attention core and latent up-projections in every layer, the dense MLP in the dense
    layers, and in the mixture-of-experts layers the routed and shared experts (``moe``:
    the whole block, router included) or the shared experts alone (``shared_experts``)."""
    attention = (ATTENTION_CORE if "core_attn" in modules else ()) + (
        MODULE_GEMMS["mla_up_proj"] if "mla_up_proj" in modules else ()
    )
    total = core_flops(model, seq_length, gemms, attention) * model.num_layers
    if "mlp" in modules:
        total += core_flops(model, seq_length, gemms, MODULE_GEMMS["mlp"]) * model.num_dense_layers
    if model.is_moe and "moe" in modules:
        total += moe_mlp_active_flops(model, seq_length) * model.num_moe_layers
    elif model.is_moe and "shared_experts" in modules:
        per_width = (fc1_factor(model) + 1) * model.hidden_size
        shared = 2.0 * seq_length * model.shared_expert_width * per_width
        total += shared * model.num_moe_layers
    return total


# ------------------------------------------------------------------ hybrid models
def mamba_projection_gemms(model: ModelSpec, tokens: int, tp: int) -> tuple[Gemm, Gemm]:
    """``in_proj`` and ``out_proj`` of one Mamba-2 mixer on one rank over ``tokens`` rows."""
    h, inner = model.hidden_size, model.mamba_inner
    return (
        Gemm("in_proj", tokens, model.mamba_in_proj_width // tp, h),
        Gemm("out_proj", tokens, h, inner // tp),
    )


def ssd_gemms(
    model: ModelSpec, seq_length: int, micro_batch_size: int, tp: int
) -> tuple[Gemm, ...]:
    """The batched products of the chunked SSD scan on one rank (module docstring)."""
    q, n, p = SSD_CHUNK, model.mamba_state_dim, model.mamba_head_dim
    chunks = micro_batch_size * -(-seq_length // q)
    heads = chunks * (model.mamba_num_heads or 0) // tp
    groups = chunks * max(model.mamba_num_groups // tp, 1)
    return (
        Gemm("ssd_cb", q, q, n, groups),
        Gemm("ssd_diag", q, p, q, heads),
        Gemm("ssd_states", n, p, q, heads),
        Gemm("ssd_off", q, p, n, heads),
    )


def mamba_elementwise_elements(model: ModelSpec, tokens: int, tp: int) -> tuple[float, float]:
    """Elements per micro-batch of the convolution (``x, B, C``) and of the gated norm
    (``d_inner``) on one rank."""
    return tokens * model.mamba_conv_width / tp, tokens * model.mamba_inner / tp


def hybrid_forward_flops(model: ModelSpec, seq_length: int, symbol: str) -> float:
    """Forward model FLOPs per sequence of one sublayer (active parameters for ``E``)."""
    s = seq_length
    if symbol == "M":
        gemms = (*mamba_projection_gemms(model, s, 1), *ssd_gemms(model, s, 1, 1))
        return sum(g.flops for g in gemms)
    if symbol == "E":
        return moe_mlp_active_flops(model, s)
    gemms = layer_gemms(model, s, 1, 1)
    names = ("fc1", "fc2") if symbol == "-" else tuple(
        g.name for g in gemms if g.name not in ("fc1", "fc2"))  # fmt: skip
    return core_flops(model, s, gemms, names)


def hybrid_layers_forward_flops(model: ModelSpec, seq_length: int) -> float:
    """Forward model FLOPs per sequence of every sublayer of a hybrid model."""
    pattern = model.hybrid_pattern or ""
    return sum(pattern.count(k) * hybrid_forward_flops(model, seq_length, k) for k in SYMBOLS)


def hybrid_attention_core_flops(model: ModelSpec, seq_length: int) -> float:
    """Forward FLOPs per sequence of the attention cores (what selective recompute redoes)."""
    gemms = layer_gemms(model, seq_length, 1, 1)
    per_layer = core_flops(model, seq_length, gemms, ATTENTION_CORE)
    return (model.hybrid_pattern or "").count("*") * per_layer


def hybrid_recompute_flops(model: ModelSpec, seq_length: int, plan: Plan) -> float:
    """Forward FLOPs per sequence a hybrid model's recomputation redoes: every sublayer
    (full); the attention cores (``core_attn``, Megatron's default), the MLP sublayers
    (``mlp``) and the expert sublayers' active FLOPs (``moe``) or shared experts
    (``shared_experts``) under selective recomputation."""
    if plan.recompute == "full":
        return hybrid_layers_forward_flops(model, seq_length)
    modules = selective_modules(plan)
    pattern = model.hybrid_pattern or ""
    total = hybrid_attention_core_flops(model, seq_length) if "core_attn" in modules else 0.0
    if "mlp" in modules:
        total += pattern.count("-") * hybrid_forward_flops(model, seq_length, "-")
    if "moe" in modules:
        total += pattern.count("E") * moe_mlp_active_flops(model, seq_length)
    elif "shared_experts" in modules:
        per_width = (fc1_factor(model) + 1) * model.hidden_size
        total += pattern.count("E") * 2.0 * seq_length * model.shared_expert_width * per_width
    return total
