"""Check a Megatron-LM argument list before a job is started with it.

``argument_table.json`` (next to this module) lists every ``--option`` of
Megatron-LM's training argument parser, the one
``megatron.training.arguments.add_megatron_arguments`` builds for
``pretrain_gpt.py``, at NVIDIA/Megatron-LM commit d98e8a6
(``megatron/training/arguments.py``; 877 options, options generated from the
config dataclasses included): for each its argparse ``dest``, ``nargs``,
``type``, ``choices``, whether it is a store-true / store-false switch, and its
default.  Keys are the option strings; several may share one ``dest``
(``--no-x`` / ``--disable-x``).

:func:`parse_megatron_argv` parses an argument vector as that parser would
(exact option names, as Megatron's parser allows no abbreviations; ``--flag
value`` or ``--flag=value``; switches without values; values of the option's
type and among its choices).  :func:`check_megatron_argv` then applies the rules
of Megatron's ``validate_args`` that an exporter must respect (the first four
checked by hand at the same commit; those of context and expert parallelism follow
``validate_args``, ``initialize_model_parallel`` and Megatron-Core's
``TransformerConfig`` of 2025 releases):

- at most one of ``--num-layers-per-virtual-pipeline-stage``,
  ``--num-virtual-stages-per-pipeline-rank`` and
  ``--pipeline-model-parallel-layout`` (the layout string fixes the virtual stages);
- ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``
  not together with ``--pipeline-model-parallel-layout``;
- tensor or context parallelism > 1 on GPUs before Blackwell needs
  ``CUDA_DEVICE_MAX_CONNECTIONS=1`` in the environment (an assertion), unless
  Megatron FSDP / torch FSDP2 or MoE expert-parallel overlap is on; FSDP needs it
  unset or > 1;
- ``--sequence-parallel`` only with tensor parallelism > 1 (Megatron switches it
  off with a warning otherwise), and ``--tp-comm-overlap`` only with
  ``--sequence-parallel``;
- the world size (when given) divisible by tp x pp x cp (``validate_args``) and by
  etp x ep x pp (``initialize_model_parallel``; etp defaults to tp);
- ``--seq-length`` divisible by 2 x cp (context parallelism's load-balanced causal
  chunks) and, with ``--sequence-parallel``, by cp x tp (each rank's tokens split
  over the tensor group);
- mixture of experts (``validate_args`` and Megatron-Core's ``TransformerConfig``):
  ``--expert-model-parallel-size`` > 1 needs ``--num-experts``, a multiple of it, and
  no ``--fp16``; MoE with tensor parallelism needs ``--sequence-parallel``; MoE with
  biases (no ``--disable-bias-linear``) needs expert tensor parallelism 1; a list
  ``--moe-layer-freq`` has one entry per layer; ``--moe-router-enable-expert-bias``
  needs the sigmoid (or sqrtsoftplus) score function; ``--moe-expert-capacity-factor``
  needs an aux_loss, seq_aux_loss, global_aux_loss or none load balancing, and
  ``--moe-pad-expert-input-to-capacity`` a capacity factor; as many
  ``--moe-aux-loss-coeff`` values as load-balancing types.

``--moe-layer-freq`` (type ``moe_freq_type``) is parsed as Megatron does
(:func:`pipette_cp.report.megatron.moe_flags.parse_layer_pattern`); the rules of a
``--hybrid-layer-pattern`` are :func:`pipette_cp.report.megatron.hybrid_flags.check_hybrid_argv`.

Every failure is one :class:`~pipette_cp.errors.SpecError` naming the option and
its value.
"""

from __future__ import annotations

import difflib
import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipette_cp.errors import SpecError
from pipette_cp.report.megatron.hybrid_flags import check_hybrid_argv
from pipette_cp.report.megatron.moe_flags import parse_layer_pattern

#: The Megatron-LM commit the table was read at.
MEGATRON_COMMIT = "d98e8a6"
TABLE_PATH = Path(__file__).with_name("argument_table.json")
ENV_CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"
_VIRTUAL = (
    "--num-layers-per-virtual-pipeline-stage",
    "--num-virtual-stages-per-pipeline-rank",
    "--pipeline-model-parallel-layout",
)
_FIRST_LAST = ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers")


@dataclass(frozen=True)
class MegatronOption:
    """One option of Megatron-LM's training parser (a row of the table)."""

    flag: str
    dest: str
    nargs: int | str | None
    type: str | None
    choices: tuple[str, ...] | None
    store_true: bool
    store_false: bool

    @property
    def switch(self) -> bool:
        """Takes no value (store-true / store-false and other ``nargs=0`` actions)."""
        return self.nargs == 0


@functools.cache
def argument_table() -> dict[str, MegatronOption]:
    """Option string -> :class:`MegatronOption`, read once from the bundled table."""
    raw = json.loads(TABLE_PATH.read_text(encoding="utf-8"))
    return {
        flag: MegatronOption(
            flag=flag,
            dest=row["dest"],
            nargs=row["nargs"],
            type=row["type"],
            choices=None if row["choices"] is None else tuple(map(str, row["choices"])),
            store_true=bool(row["store_true"]),
            store_false=bool(row["store_false"]),
        )
        for flag, row in raw.items()
    }


def _convert(option: MegatronOption, value: str) -> Any:
    """``value`` as the option's type converts it; SpecError if it cannot."""
    kind = option.type
    if kind == "moe_freq_type":
        return parse_layer_pattern(option.flag, value)
    try:
        converted: Any = {"int": int, "float": float}.get(kind or "", str)(value)
    except ValueError:
        raise SpecError(
            option.flag, value, f"expected a{'n' if kind == 'int' else ''} {kind}"
        ) from None
    if option.choices is not None:
        # enum-typed options list enum members ("AttnBackend.flash") and take their names
        names = (
            {c.rsplit(".", 1)[-1] for c in option.choices} if kind == "enum_type_handler" else set()
        )
        text = str(converted)
        if text not in option.choices and text not in names:
            shown = sorted(names) if names else option.choices
            raise SpecError(option.flag, value, f"expected one of {', '.join(shown)}")
    return converted


def _unknown(flag: str) -> SpecError:
    close = difflib.get_close_matches(flag, argument_table(), n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    return SpecError(
        "Megatron-LM option", flag, f"not an option of pretrain_gpt.py at {MEGATRON_COMMIT}{hint}"
    )


def parse_megatron_argv(argv: Sequence[str]) -> dict[str, tuple[str, Any]]:
    """Parse ``argv`` against :func:`argument_table`.

    Returns ``dest -> (option string, value)`` of the options given: True/False for
    switches (as stored), the converted value, or a list for ``nargs`` ``+``/``*``/N.

    Raises
    ------
    SpecError
        A token that is no option, an unknown option, a switch with a value, a
        missing value, a value of the wrong type or outside the choices, an option
        given twice.

    Examples
    --------
    >>> parse_megatron_argv(["--swiglu", "--num-layers", "32"])["num_layers"]
    ('--num-layers', 32)
    >>> parse_megatron_argv(["--num-layers=x"])
    Traceback (most recent call last):
    ...
    pipette_cp.errors.SpecError: --num-layers='x': expected an int
    """
    table = argument_table()
    out: dict[str, tuple[str, Any]] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if not token.startswith("--") or token == "--":
            raise SpecError("Megatron-LM argument", token, "expected an option (--name)")
        flag, eq, inline = token.partition("=")
        option = table.get(flag)
        if option is None:
            raise _unknown(flag)
        values: list[str] = [inline] if eq else []
        if option.switch:
            if eq or (i < len(argv) and not argv[i].startswith("--")):
                raise SpecError(flag, inline if eq else argv[i], "is a switch and takes no value")
        elif not eq:
            while i < len(argv) and not argv[i].startswith("--"):
                values.append(argv[i])
                i += 1
                if option.nargs is None or (
                    isinstance(option.nargs, int) and len(values) == option.nargs
                ):
                    break
        _count(option, values)
        if option.dest in out:
            raise SpecError(
                flag, " ".join(values) or None, f"given twice (also as {out[option.dest][0]})"
            )
        converted = [_convert(option, v) for v in values]
        if option.switch:
            value: Any = not option.store_false
        elif option.nargs is None:
            value = converted[0]
        else:
            value = converted
        out[option.dest] = (flag, value)
    return out


def _count(option: MegatronOption, values: list[str]) -> None:
    """The number of values against ``nargs``."""
    n, nargs = len(values), option.nargs
    ok = {None: n == 1, "+": n >= 1, "*": True, "?": n <= 1}.get(nargs, n == nargs)  # type: ignore[arg-type]
    if option.switch:
        ok = n == 0
    if not ok:
        want = "one value" if nargs is None else f"nargs={nargs} values"
        raise SpecError(option.flag, " ".join(values) or None, f"expects {want}")


def check_megatron_argv(
    argv: Sequence[str],
    env: Mapping[str, str | None] | None = None,
    *,
    before_blackwell: bool = True,
    world_size: int | None = None,
) -> dict[str, tuple[str, Any]]:
    """:func:`parse_megatron_argv`, then the ``validate_args`` rules of the module doc.

    Parameters
    ----------
    argv
        The arguments the training script receives.
    env
        The environment the launcher gives the ranks: a value, or None for a
        variable it unsets; a missing key is left to the caller's environment.
        None skips the environment rule.
    before_blackwell
        Whether the ranks run on GPUs before Blackwell (compute capability < 10).
    world_size
        The number of ranks the job starts; None skips the world-size rules.

    Raises
    ------
    SpecError
        The first violated rule, naming the option (or variable) and its value.
    """
    given = parse_megatron_argv(argv)
    by_flag = {flag: value for flag, value in given.values()}
    virtual = [f for f in _VIRTUAL if f in by_flag]
    if len(virtual) > 1:
        raise SpecError(
            virtual[1], by_flag[virtual[1]], f"cannot be combined with {virtual[0]} (at most one "
            "of the three virtual-pipeline options; the layout string fixes the virtual stages)",
        )  # fmt: skip
    if _VIRTUAL[2] in by_flag:
        for flag in _FIRST_LAST:
            if flag in by_flag:
                raise SpecError(flag, by_flag[flag], f"cannot be combined with {_VIRTUAL[2]}")
    tp = _int(given, "tensor_model_parallel_size")
    if _on(given, "sequence_parallel") and tp == 1:
        raise SpecError("--sequence-parallel", True, "needs --tensor-model-parallel-size > 1")
    if _on(given, "tp_comm_overlap") and not (_on(given, "sequence_parallel") and tp > 1):
        raise SpecError("--tp-comm-overlap", True, "needs --sequence-parallel (and tp > 1)")
    _check_sizes(given, world_size)
    _check_experts(given)
    check_hybrid_argv(given)
    if env is not None:
        _check_connections(given, env, tp, before_blackwell)
    return given


def _check_sizes(given: Mapping[str, tuple[str, Any]], world: int | None) -> None:
    """World size against the parallel sizes; sequence length against cp (and tp with SP)."""
    tp, pp = _int(given, "tensor_model_parallel_size"), _int(given, "pipeline_model_parallel_size")
    cp, ep = _int(given, "context_parallel_size"), _int(given, "expert_model_parallel_size")
    etp = _int(given, "expert_tensor_parallel_size", tp)
    if world is not None and world % (tp * pp * cp):
        raise SpecError("world size", world, f"must be divisible by tp x pp x cp = {tp} x {pp} "
                        f"x {cp} = {tp * pp * cp} (Megatron's validate_args)")  # fmt: skip
    if world is not None and world % (etp * ep * pp):
        raise SpecError("world size", world, f"must be divisible by etp x ep x pp = {etp} x {ep} "
                        f"x {pp} = {etp * ep * pp} (Megatron's expert groups)")  # fmt: skip
    if "seq_length" not in given:
        return
    seq = int(given["seq_length"][1])
    if cp > 1 and seq % (2 * cp):
        raise SpecError("--seq-length", seq, f"must be divisible by 2 x --context-parallel-size "
                        f"= {2 * cp} (load-balanced causal chunks)")  # fmt: skip
    if _on(given, "sequence_parallel") and seq % (cp * tp):
        raise SpecError("--seq-length", seq, f"with --sequence-parallel must be divisible by "
                        f"cp x tp = {cp * tp} (each rank's tokens split over the tensor group)")  # fmt: skip


def _check_experts(given: Mapping[str, tuple[str, Any]]) -> None:
    """The mixture-of-experts rules of the module doc."""
    ep, tp = _int(given, "expert_model_parallel_size"), _int(given, "tensor_model_parallel_size")
    experts = given["num_experts"][1] if "num_experts" in given else None
    if ep > 1 and experts is None:
        raise SpecError("--expert-model-parallel-size", ep, "needs --num-experts (expert "
                        "parallelism splits the experts of a mixture-of-experts model)")  # fmt: skip
    if experts is None:
        return
    if experts % ep:
        raise SpecError("--num-experts", experts,
                        f"must be a multiple of --expert-model-parallel-size {ep}")  # fmt: skip
    if ep > 1 and _on(given, "fp16"):
        raise SpecError("--expert-model-parallel-size", ep, "is not supported with --fp16")
    if tp > 1 and not _on(given, "sequence_parallel"):
        raise SpecError("--num-experts", experts, f"with --tensor-model-parallel-size {tp} needs "
                        "--sequence-parallel (Megatron: MoE with tensor parallelism)")  # fmt: skip
    etp = _int(given, "expert_tensor_parallel_size", tp)
    if etp > 1 and given.get("add_bias_linear", ("", True))[1]:
        raise SpecError("--expert-tensor-parallel-size", etp, "must be 1 for experts with "
                        "biases (give --disable-bias-linear or etp 1; etp defaults to tp)")  # fmt: skip
    _check_router(given)


def _check_router(given: Mapping[str, tuple[str, Any]]) -> None:
    """Layer pattern, expert bias, capacity and aux-loss rules of a MoE argument list."""
    freq = given.get("moe_layer_freq", ("", 1))[1]
    layers = _int(given, "num_layers", 0)
    if isinstance(freq, list) and layers and len(freq) != layers:
        raise SpecError("--moe-layer-freq", given["moe_layer_freq"][1], f"lists {len(freq)} "
                        f"layers, --num-layers is {layers}")  # fmt: skip
    score = given.get("moe_router_score_function", ("", "softmax"))[1]
    if _on(given, "moe_router_enable_expert_bias") and score not in ("sigmoid", "sqrtsoftplus"):
        raise SpecError("--moe-router-enable-expert-bias", True, "needs --moe-router-score-"
                        f"function sigmoid or sqrtsoftplus (got {score})")  # fmt: skip
    types = given.get("moe_router_load_balancing_type", ("", ["aux_loss"]))[1]
    if "moe_expert_capacity_factor" in given and not set(types) <= {
        "aux_loss", "seq_aux_loss", "global_aux_loss", "none"
    }:  # fmt: skip
        raise SpecError("--moe-expert-capacity-factor", given["moe_expert_capacity_factor"][1],
                        "needs --moe-router-load-balancing-type aux_loss, seq_aux_loss, "
                        f"global_aux_loss or none (got {' '.join(types)})")  # fmt: skip
    if _on(given, "moe_pad_expert_input_to_capacity") and "moe_expert_capacity_factor" not in given:
        raise SpecError("--moe-pad-expert-input-to-capacity", True,
                        "needs --moe-expert-capacity-factor")  # fmt: skip
    coeffs = given.get("moe_aux_loss_coeff", ("", None))[1]
    if coeffs is not None and len(types) > 1 and len(coeffs) != len(types):
        raise SpecError("--moe-aux-loss-coeff", " ".join(map(str, coeffs)), f"needs one value "
                        f"per --moe-router-load-balancing-type ({len(types)})")  # fmt: skip


def _int(given: Mapping[str, tuple[str, Any]], dest: str, default: int = 1) -> int:
    return int(given[dest][1]) if dest in given else default


def _on(given: Mapping[str, tuple[str, Any]], dest: str) -> bool:
    return dest in given and given[dest][1] is True


def _check_connections(
    given: Mapping[str, tuple[str, Any]], env: Mapping[str, str | None], tp: int, old_gpu: bool
) -> None:
    """The ``CUDA_DEVICE_MAX_CONNECTIONS`` rule against the launcher's environment."""
    inherited = ENV_CONNECTIONS not in env
    value = env.get(ENV_CONNECTIONS)
    shown = "<inherited>" if inherited else value
    if _on(given, "use_megatron_fsdp") or _on(given, "use_torch_fsdp2"):
        if inherited or (value is not None and not (value.isdigit() and int(value) > 1)):
            raise SpecError(ENV_CONNECTIONS, shown, "must be unset or > 1 with FSDP")
        return
    parallel = tp > 1 or _int(given, "context_parallel_size") > 1
    if parallel and old_gpu and not _on(given, "overlap_moe_expert_parallel_comm") and value != "1":
        raise SpecError(
            ENV_CONNECTIONS, shown, "must be 1 with tensor or context parallelism before Blackwell"
        )
