"""Megatron-LM flags of context and expert parallelism, mixture-of-experts layers,
multi-head latent attention and multi-token prediction.

:mod:`pipette_cp.report.megatron.flags` adds these to its flags; for a dense model with
``cp = ep = 1`` (and no ``etp``) every flag function here returns nothing, so the
export of such a plan is what it was before these features.  None of them needs the
cost model.  :func:`parse_layer_pattern` reads ``--moe-layer-freq`` back as Megatron
does, for the check.  Flag names and types are those of
the bundled argument table (:mod:`pipette_cp.report.megatron.check`, Megatron-LM
d98e8a6); the rules they must obey are checked there.

- context parallelism: ``--context-parallel-size`` and ``--cp-comm-type p2p`` (the
  ring that passes key/value chunks, as the cost model prices it);
- expert parallelism: ``--expert-model-parallel-size`` (every MoE model, and any plan
  with ``ep > 1``, so that the check refuses it on a dense model) and
  ``--expert-tensor-parallel-size`` when the plan gives ``etp`` (Megatron-Core's
  default is tp);
- experts: ``--num-experts``, ``--moe-router-topk``, ``--moe-ffn-hidden-size``, the
  latent width of LatentMoE (``--moe-latent-size``), the
  shared experts (``--moe-shared-expert-intermediate-size``, ``--moe-shared-expert-gate``),
  the dense/MoE layer pattern (``--moe-layer-freq``, see :func:`moe_layer_freq`; not for
  a hybrid model, whose ``--hybrid-layer-pattern`` places its ``E`` layers), the
  router's losses and expert bias, the capacity factor, the token dispatcher and the
  grouped GEMM;
- latent attention: ``--multi-latent-attention`` with its ranks and head widths,
  ``--qk-layernorm`` (in Megatron-Core's MLA it switches on the norms of the query and
  key/value latents, which the model counts) and ``--rope-type`` (MLA's default is
  YaRN, so plain RoPE must be asked for);
- multi-token prediction: ``--mtp-num-layers``.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from pipette_cp.errors import SpecError
from pipette_cp.specs import Instance, ModelSpec, Plan

#: One flag and its value (None for a switch).
Flag = tuple[str, str | None]


def parallel_flags(instance: Instance, plan: Plan) -> list[Flag]:
    """Context- and expert-parallel sizes (nothing for a dense plan with cp = ep = 1)."""
    flags: list[Flag] = []
    if plan.cp > 1:
        flags += [("--context-parallel-size", str(plan.cp)), ("--cp-comm-type", "p2p")]
    if instance.model.is_moe or plan.ep > 1:
        flags.append(("--expert-model-parallel-size", str(plan.ep)))
    if plan.etp is not None:
        flags.append(("--expert-tensor-parallel-size", str(plan.etp)))
    return flags


def moe_layer_freq(model: ModelSpec) -> str:
    """``--moe-layer-freq`` for the model's dense/MoE pattern.

    Megatron's ``moe_freq_type`` takes an int k (layer i has experts when ``i % k == 0``)
    or a Python list expression of 0 (dense) and 1 (experts), one per layer, written
    with digits, ``[]()+*,`` only.  With ``first_k_dense_layers`` the int cannot say
    it, so the list is spelled out.

    >>> from pipette_cp.io.model_file import load_model
    >>> moe_layer_freq(load_model("deepseek-v3"))
    '([0]*3+[1]*58)'
    >>> moe_layer_freq(load_model("deepseek-v3").model_copy(update={"moe_layer_freq": 2}))
    '([0]*3+([1]+[0]*1)*29)'
    >>> moe_layer_freq(load_model("mixtral-8x7b"))
    '1'
    """
    first, freq = model.first_k_dense_layers, model.moe_layer_freq
    if first == 0:
        return str(freq)
    body = model.num_layers - first
    parts = [f"[0]*{first}"]
    if freq == 1:
        parts.append(f"[1]*{body}")
    else:
        whole, rest = divmod(body, freq)
        if whole:
            parts.append(f"([1]+[0]*{freq - 1})*{whole}")
        if rest:
            parts.append("[1]" + (f"+[0]*{rest - 1}" if rest > 1 else ""))
    return "(" + "+".join(parts) + ")"


#: What Megatron's ``_eval_pattern`` allows in a list expression.
_PATTERN_CHARS = re.compile(r"[^,\d\[\]\(\)\+\*]")


def parse_layer_pattern(flag: str, value: str) -> int | list[int]:
    """A ``--moe-layer-freq`` value as Megatron's ``moe_freq_type`` reads it: an int
    k >= 1, or the list a pattern such as ``([0]*3+[1]*58)`` evaluates to (0/1
    entries; digits and ``[](),+*`` only, evaluated here without ``eval``).

    Raises
    ------
    SpecError
        Anything else, naming ``flag`` and the value.

    >>> parse_layer_pattern("--moe-layer-freq", "([0]*1+[1]*2)*2")
    [0, 1, 1, 0, 1, 1]
    """
    if "[" not in value:
        try:
            k = int(value)
        except ValueError:
            raise SpecError(flag, value, "expected an int or a list pattern") from None
        if k < 1:
            raise SpecError(flag, value, "must be at least 1 (every k-th layer has experts)")
        return k
    if _PATTERN_CHARS.search(value):
        raise SpecError(flag, value, "a pattern has digits and [](),+* only (Megatron's rule)")
    try:
        pattern = _evaluate(ast.parse(value, mode="eval").body)
    except (SyntaxError, ValueError, TypeError, RecursionError):
        raise SpecError(flag, value, "not a list expression such as ([0]*3+[1]*58)") from None
    if not isinstance(pattern, list) or any(v not in (0, 1) for v in pattern):
        raise SpecError(flag, value, "must evaluate to a list of 0 (dense) and 1 (experts)")
    return pattern


def _evaluate(node: ast.expr) -> Any:
    """Lists, ints, tuples, + and * of them: the expressions the pattern may hold."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.List | ast.Tuple):
        items = [_evaluate(e) for e in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mult):
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Add):
            return left + right
        seq, times = (left, right) if isinstance(right, int) else (right, left)
        if isinstance(seq, list | tuple) and isinstance(times, int) and len(seq) * times > 10**6:
            raise ValueError("pattern too long")
        return seq * times
    raise ValueError("not a list expression")


def moe_flags(instance: Instance) -> list[Flag]:
    """The mixture-of-experts layers and how the job runs them (nothing for a dense model).

    The load-balancing loss is ``aux_loss`` with the model's coefficient, or ``none``
    when the coefficient is 0; the router's expert bias comes with
    ``--moe-router-score-function sigmoid`` (Megatron-Core refuses the bias with
    softmax scores; DeepSeek-V3 scores with sigmoid); ``--moe-pad-expert-input-to-capacity``
    only with a capacity factor (Megatron needs one).
    """
    m, t = instance.model, instance.training
    if not m.is_moe:
        return []
    flags: list[Flag] = [
        ("--num-experts", str(m.num_experts)),
        ("--moe-router-topk", str(m.moe_top_k)),
        ("--moe-ffn-hidden-size", str(m.expert_width)),
    ]
    if m.moe_latent_size is not None:  # LatentMoE (Nemotron 3 Super)
        flags.append(("--moe-latent-size", str(m.moe_latent_size)))
    if m.num_shared_experts:
        flags.append(("--moe-shared-expert-intermediate-size", str(m.shared_expert_width)))
        if m.shared_expert_gate:
            flags.append(("--moe-shared-expert-gate", None))
    if not m.is_hybrid:  # a hybrid pattern places its E layers itself
        flags.append(("--moe-layer-freq", moe_layer_freq(m)))
    if m.moe_router_aux_loss_coeff > 0:
        flags += [
            ("--moe-router-load-balancing-type", "aux_loss"),
            ("--moe-aux-loss-coeff", repr(float(m.moe_router_aux_loss_coeff))),
        ]
    else:
        flags.append(("--moe-router-load-balancing-type", "none"))
    if m.moe_z_loss_coeff > 0:
        flags.append(("--moe-z-loss-coeff", repr(float(m.moe_z_loss_coeff))))
    if m.moe_router_expert_bias:
        flags += [("--moe-router-score-function", "sigmoid"),
                  ("--moe-router-enable-expert-bias", None)]  # fmt: skip
    if m.moe_capacity_factor is not None:
        flags.append(("--moe-expert-capacity-factor", repr(float(m.moe_capacity_factor))))
        if t.moe_pad_to_capacity:
            flags.append(("--moe-pad-expert-input-to-capacity", None))
    flags.append(("--moe-token-dispatcher-type", t.moe_token_dispatcher))
    if t.moe_token_dispatcher == "flex":  # the node-deduplicating all-to-all the model prices
        flags.append(("--moe-flex-dispatcher-backend", "deepep"))
    if t.moe_grouped_gemm:
        flags.append(("--moe-grouped-gemm", None))
    return flags


def mla_flags(model: ModelSpec) -> list[Flag]:
    """Multi-head latent attention (nothing for ordinary attention)."""
    if not model.is_mla:
        return []
    flags: list[Flag] = [("--multi-latent-attention", None)]
    if model.q_lora_rank is not None:
        flags.append(("--q-lora-rank", str(model.q_lora_rank)))
    flags += [
        ("--kv-lora-rank", str(model.kv_lora_rank)),
        ("--qk-head-dim", str(model.qk_nope_head_dim)),
        ("--qk-pos-emb-head-dim", str(model.qk_rope_head_dim)),
        ("--v-head-dim", str(model.v_head_dim)),
        ("--qk-layernorm", None),  # MLA: the norms of the query and key/value latents
    ]
    if model.yarn_scaling_factor is None:
        return [*flags, ("--rope-type", "rope")]
    return [
        *flags,
        ("--rope-type", "yarn"),
        ("--rotary-scaling-factor", repr(float(model.yarn_scaling_factor))),
    ]


def architecture_flags(instance: Instance) -> list[Flag]:
    """Latent attention, experts and multi-token prediction (nothing for a dense model)."""
    m = instance.model
    mtp: list[Flag] = [("--mtp-num-layers", str(m.mtp_layers))] if m.mtp_layers else []
    return mla_flags(m) + moe_flags(instance) + mtp


def moe_notes(instance: Instance, plan: Plan) -> list[str]:
    """Comments for the user on the flags of this module (none for a dense plan with
    cp = 1)."""
    m, t = instance.model, instance.training
    notes = []
    if plan.cp > 1:
        notes.append(
            f"context parallelism: each sequence of {t.seq_length} tokens is split over "
            f"cp={plan.cp} GPUs in 2 x cp load-balanced chunks; --cp-comm-type p2p is the "
            "key/value ring that was costed (a2a, allgather, a2a+p2p are Megatron's others)"
        )
    if m.is_moe:
        notes.append(
            f"experts: {m.num_experts} routed (top {m.moe_top_k}) over ep={plan.ep} x "
            f"etp={plan.expert_tp} GPUs, expert data parallelism {plan.expert_dp}; "
            f"training.moe_load_imbalance={t.moe_load_imbalance} is a cost-model assumption, "
            "no Megatron flag; router details the model does not record (grouped top-k, "
            "score scaling, router dtype) keep Megatron's defaults"
        )
        if t.moe_pad_to_capacity and m.moe_capacity_factor is None:
            notes.append(
                "training.moe_pad_to_capacity is on but the model is dropless (no capacity "
                "factor): --moe-pad-expert-input-to-capacity left out, Megatron needs one"
            )
        if m.moe_router_expert_bias:
            notes.append(
                "--moe-router-score-function sigmoid: Megatron's expert bias needs sigmoid "
                "scores; --moe-router-bias-update-rate keeps Megatron's default (1e-3)"
            )
    if m.yarn_scaling_factor is not None:
        what = (
            "--rope-type yarn --rotary-scaling-factor are given; check --mscale, "
            "--mscale-all-dim and the YaRN original length (Megatron's MLA default 4096)"
            if m.is_mla
            else "YaRN is not exported: add Megatron's --position-embedding-type yarn flags"
        )
        notes.append(
            f"YaRN x{m.yarn_scaling_factor} over {m.yarn_original_max_seq_length} positions: "
            f"{what} for your release (the model records no attention-scale constants)"
        )
    return notes
