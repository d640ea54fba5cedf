"""The mixture-of-experts families of Hugging Face configs.

Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3 (multi-head latent attention, shared
experts, leading dense layers, multi-token prediction), Llama 4 (its text model:
interleaved MoE layers, a shared expert) and gpt-oss (biases everywhere, attention
sinks, alternating sliding-window layers).  Each key read is one that family's
released config.json holds; the parameter-free details ModelSpec does not record
are listed under ``_notes`` and end up in the model's ``source``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipette_cp.errors import SpecError, UnsupportedError
from pipette_cp.io.huggingface.dense import llama_core, qwen_attention
from pipette_cp.io.huggingface.reader import Reader, llama_biases

#: The widths of multi-head latent attention, under the same names in config.json and ModelSpec.
_MLA_KEYS = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")


def _top_k(r: Reader, experts_key: str, experts: int) -> int:
    """num_experts_per_tok, at most the experts."""
    top_k = r.integer("num_experts_per_tok")
    if top_k > experts:
        raise SpecError(r.field("num_experts_per_tok"), top_k, f"exceeds {experts_key}={experts}")
    return int(top_k)


def _routed(r: Reader, experts_key: str, aux_default: float) -> dict[str, Any]:
    """Experts, top k and the load-balancing loss weight (router_aux_loss_coef)."""
    experts = r.integer(experts_key)
    if experts == 1:
        return {"num_experts": 1}
    return {
        "num_experts": experts,
        "moe_top_k": _top_k(r, experts_key, experts),
        "moe_router_aux_loss_coeff": r.number("router_aux_loss_coef", aux_default, zero=True),
    }


def _every_kth(step: int) -> dict[str, int]:
    """MoE layers k-1, 2k-1, ... (Qwen's decoder_sparse_step, Llama 4's
    interleave_moe_layer_step: layer i has experts when (i + 1) % k == 0)."""
    return {"first_k_dense_layers": step - 1, "moe_layer_freq": step} if step > 1 else {}


def mixtral(r: Reader) -> dict[str, Any]:
    """Mixtral: Mistral's layers with every MLP replaced by num_local_experts experts of
    intermediate_size (transformers' defaults: rope_theta 1e6, router_aux_loss_coef 0.001)."""
    fields = {**llama_core(r, rope_theta=10**6), "linear_bias": llama_biases(r)}
    return {**fields, "ffn_hidden_size": r.integer("intermediate_size"), **_routed(r, "num_local_experts", 0.001)}  # fmt: skip


def qwen_moe(r: Reader) -> dict[str, Any]:
    """Qwen2-MoE and Qwen3-MoE: num_experts experts of moe_intermediate_size on every
    decoder_sparse_step-th layer (dense layers of intermediate_size between), Qwen2-MoE
    with one gated shared expert of shared_expert_intermediate_size
    (Qwen2MoeSparseMoeBlock's shared_expert and shared_expert_gate)."""
    r.refuse("mlp_only_layers", "dense layers listed by index are not modelled (only "
             "every decoder_sparse_step-th layer with experts)")  # fmt: skip
    fields: dict[str, Any] = {**llama_core(r), **qwen_attention(r)}
    fields["ffn_hidden_size"] = r.integer("intermediate_size")
    fields.update(_routed(r, "num_experts", 0.001))
    if fields["num_experts"] > 1:
        fields["moe_ffn_hidden_size"] = r.integer("moe_intermediate_size")
        fields.update(_every_kth(r.integer("decoder_sparse_step", 1)))
    if r.model_type == "qwen2_moe" and (shared := r.integer("shared_expert_intermediate_size", zero=True)):  # fmt: skip
        fields.update(num_shared_experts=1, shared_expert_ffn_hidden_size=shared,
                      shared_expert_gate=True)  # fmt: skip
    return fields


def deepseek(r: Reader) -> dict[str, Any]:
    """DeepSeek-V2 and V3: multi-head latent attention (q_lora_rank, kv_lora_rank,
    qk_rope_head_dim, qk_nope_head_dim, v_head_dim), n_routed_experts of
    moe_intermediate_size with n_shared_experts, dense layers of intermediate_size
    before first_k_dense_replace, V3's num_nextn_predict_layers and, with topk_method
    'noaux_tc', its e_score_correction_bias; YaRN RoPE scaling."""
    heads = r.integer("num_attention_heads")
    if (kv := r.integer("num_key_value_heads", heads)) != heads:
        raise SpecError(r.field("num_key_value_heads"), kv,
                        f"multi-head latent attention: expected num_attention_heads={heads}")  # fmt: skip
    r.refuse("attention_bias", "biases in multi-head latent attention are not modelled")
    layers = r.integer("num_hidden_layers")
    fields: dict[str, Any] = {**llama_core(r, yarn=True), "num_kv_heads": None, "head_dim": None}
    fields.update(
        linear_bias=False,
        ffn_hidden_size=r.integer("intermediate_size"),
        q_lora_rank=r.integer("q_lora_rank", None),
        **{k: r.integer(k) for k in _MLA_KEYS},
        num_experts=(experts := r.integer("n_routed_experts")),
        moe_top_k=_top_k(r, "n_routed_experts", experts),
        moe_ffn_hidden_size=r.integer("moe_intermediate_size"),
        num_shared_experts=r.integer("n_shared_experts", 0, zero=True),
        moe_router_aux_loss_coeff=r.number("aux_loss_alpha", 0.0, zero=True),
        moe_router_expert_bias=r.text("topk_method", "greedy") == "noaux_tc",
        mtp_layers=r.integer("num_nextn_predict_layers", 0, zero=True),
    )
    # DeepseekV3MoE on layer i when i >= first_k_dense_replace and i % moe_layer_freq == 0
    first, freq = r.integer("first_k_dense_replace", 0, zero=True), r.integer("moe_layer_freq", 1)
    first_moe = -(-first // freq) * freq
    if first_moe >= layers:
        raise SpecError(r.field("first_k_dense_replace"), first,
                        f"leaves no mixture-of-experts layer of num_hidden_layers={layers}")  # fmt: skip
    fields.update(first_k_dense_layers=first_moe, moe_layer_freq=freq)
    fields["_notes"] = ["the routing's expert groups (n_group, topk_group), scoring_func and routed_scaling_factor"]  # fmt: skip
    return fields


def llama4(r: Reader) -> dict[str, Any]:
    """Llama 4's text model (``text_config``, or a ``llama4_text`` config): experts of
    intermediate_size and one shared expert of the same width on every
    interleave_moe_layer_step-th layer, dense layers of intermediate_size_mlp between."""
    if r.model_type == "llama4":
        text = r.get("text_config")
        if not isinstance(text, Mapping):
            raise SpecError(r.field("text_config"), text, "expected an object (Llama 4's text model)")  # fmt: skip
        r = Reader(text, r.where, "llama4", prefix="text_config.")
    fields: dict[str, Any] = {**llama_core(r, rope_theta=500_000, eps=1e-5), "linear_bias": llama_biases(r)}  # fmt: skip
    fields["ffn_hidden_size"] = r.integer("intermediate_size_mlp")
    fields.update(_routed(r, "num_local_experts", 0.001))
    step = r.integer("interleave_moe_layer_step", 1)
    layers = fields["num_layers"]
    moe_layers = r.get("moe_layers", None)
    if moe_layers is not None and moe_layers != list(range(step - 1, layers, step)):
        raise UnsupportedError(r.field("moe_layers"), moe_layers,
                               f"only every interleave_moe_layer_step={step}-th layer is modelled")  # fmt: skip
    if fields["num_experts"] > 1:
        fields.update(moe_ffn_hidden_size=r.integer("intermediate_size"), num_shared_experts=1,
                      **_every_kth(step))  # fmt: skip
    notes = {"attention_chunk_size": "chunked attention of {} tokens (attention_chunk_size)",
             "no_rope_layers": "the layers without RoPE (no_rope_layers)",
             "use_qk_norm": "the q/k L2 norm without weights (use_qk_norm)"}  # fmt: skip
    fields["_notes"] = [note.format(r.data[k]) for k, note in notes.items() if r.data.get(k)]
    return fields


def _sliding_pattern(r: Reader, layers: int) -> dict[str, Any]:
    """gpt-oss's ``layer_types``: every n-th layer 'full_attention', the others
    'sliding_attention' over sliding_window tokens."""
    types = r.get("layer_types", None)
    window = r.integer("sliding_window", None)
    if types is None or window is None:
        return {"sliding_window": window}
    full = [i for i, kind in enumerate(types) if kind == "full_attention"]
    if len(types) != layers or any(k not in ("full_attention", "sliding_attention") for k in types):  # fmt: skip
        raise SpecError(r.field("layer_types"), types,
                        f"expected {layers} of 'full_attention' and 'sliding_attention'")  # fmt: skip
    if not full:
        return {"sliding_window": window}
    if len(full) == layers:
        return {}
    n = full[0] + 1
    if full != list(range(n - 1, layers, n)) or n < 2:
        raise UnsupportedError(r.field("layer_types"), types,
                               "only every n-th layer attending to the whole context is modelled")  # fmt: skip
    return {"sliding_window": window, "sliding_window_pattern": n}


def gpt_oss(r: Reader) -> dict[str, Any]:
    """gpt-oss: biases on q/k/v/o, on every expert (gate_up_proj_bias, down_proj_bias)
    and on the router; one attention sink per head; alternating sliding-window and full
    layers; num_local_experts experts of intermediate_size; YaRN."""
    if not r.flag("attention_bias", True):
        raise UnsupportedError(r.field("attention_bias"), False, "gpt-oss's experts and router "
                               "have biases; an attention without them is not modelled")  # fmt: skip
    per_token = r.integer("experts_per_token", None)
    if per_token is not None and per_token != r.integer("num_experts_per_tok", per_token):
        raise SpecError(r.field("experts_per_token"), per_token, "differs from num_experts_per_tok")
    fields: dict[str, Any] = {
        **llama_core(r, rope_theta=150_000, eps=1e-5, yarn=True),
        "linear_bias": True,
    }
    fields.update(ffn_hidden_size=r.integer("intermediate_size"), attention_sinks=True)
    fields.update(_routed(r, "num_local_experts", 0.9))
    fields.update(_sliding_pattern(r, fields["num_layers"]))
    fields["_notes"] = ["the clamp of its SwiGLU (swiglu_limit)"]
    return fields


#: Hugging Face families that are refused, with what is not modelled.
REFUSED: dict[str, str] = {
    "gemma": "Gemma's GeGLU MLP and its scaled embedding are not modelled",
    "gemma2": "Gemma 2's GeGLU MLP, its logit soft-capping (attn_logit_softcapping, "
    "final_logit_softcapping) and query_pre_attn_scalar are not modelled",
    "gemma3": "Gemma 3's GeGLU MLP and its sliding-window layers with their own RoPE base "
    "(rope_local_base_freq) are not modelled",
    "gemma3_text": "Gemma 3's GeGLU MLP and its sliding-window layers with their own RoPE base "
    "(rope_local_base_freq) are not modelled",
    "mamba": "Mamba's state-space layers are not modelled",
    "mamba2": "Mamba-2's state-space layers are not modelled",
    "jamba": "Jamba's hybrid Mamba / attention layers are not modelled",
    "qwen3_next": "Qwen3-Next's hybrid Gated DeltaNet / attention layers are not modelled",
}
