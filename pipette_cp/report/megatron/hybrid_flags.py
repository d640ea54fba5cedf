"""Megatron-LM flags of hybrid Mamba-Transformer models (Nemotron-H, Nemotron 3).

Megatron-LM builds a hybrid model (Megatron-Core's ``MambaModel``, since 2026 releases
``HybridModel``) from one symbol per layer, ``--hybrid-layer-pattern``
(``megatron/core/ssm/mamba_hybrid_layer_allocation.py``, now
``megatron/core/models/hybrid/hybrid_layer_allocation.py``; the older
``--hybrid-override-pattern`` is deprecated), and runs it from its own training
script, ``pretrain_hybrid.py`` (``pretrain_mamba.py`` before ``HybridModel``), not
``pretrain_gpt.py`` (``docs/user-guide/hybrid-model-migration.md``):

- the pattern gives the layers: the parser derives ``--num-layers`` from it, so that
  flag is left out;
- ``|`` in the pattern marks the pipeline segments, segment ``chunk x pp + stage``
  going to pipeline rank ``stage`` as its virtual stage ``chunk``
  (``select_pipeline_segment``): any split, even or not, interleaved or not, is one
  segment per entry of ``plan.layer_split``, and the pattern replaces
  ``--num-virtual-stages-per-pipeline-rank``, ``--pipeline-model-parallel-layout`` and
  ``--decoder-first/last-pipeline-num-layers``;
- ``--spec megatron.core.models.mamba.mamba_layer_specs mamba_stack_spec``: the layer
  specs the hybrid builders require (``mamba_layer_specs`` re-exports the hybrid stack
  spec in ``HybridModel`` releases);
- a multi-token prediction block (``mtp_hybrid_pattern``, Nemotron 3 Super's ``*E``):
  the unified pattern's ``/`` suffix, the block once per depth (``parse_hybrid_pattern``;
  ``--mtp-hybrid-override-pattern`` is deprecated), besides ``--mtp-num-layers``;
- the Mamba-2 widths: ``--mamba-num-heads`` always (Megatron's default derives it from
  ``expand``), ``--mamba-head-dim``, ``--mamba-state-dim`` and ``--mamba-num-groups``
  where they differ from Megatron's defaults (64, 128, 8); the convolution width is
  Megatron's fixed ``d_conv`` 4.

The mixture-of-experts flags of ``E`` layers come from
:mod:`pipette_cp.report.megatron.moe_flags`, without ``--moe-layer-freq`` (the pattern
places the experts).  None of this needs the cost model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipette_cp.errors import SpecError, UnsupportedError
from pipette_cp.solvers.split import megatron_split_args
from pipette_cp.specs import Instance, ModelSpec, Plan
from pipette_cp.specs.model_hybrid import MAMBA_DEFAULTS

#: One flag and its value (None for a switch).
Flag = tuple[str, str | None]

PATTERN_FLAG = "--hybrid-layer-pattern"
#: Megatron-LM's training script of hybrid models, and its name before ``HybridModel``.
HYBRID_SCRIPT, LEGACY_HYBRID_SCRIPT = "pretrain_hybrid.py", "pretrain_mamba.py"
#: ``--spec``: the module and the name of the hybrid stack's layer specs.
STACK_SPEC = "megatron.core.models.mamba.mamba_layer_specs mamba_stack_spec"
#: The Mamba-2 width flags given where the model differs from Megatron's default.
_WIDTH_FLAGS = {"mamba_head_dim": "--mamba-head-dim", "mamba_state_dim": "--mamba-state-dim",
                "mamba_num_groups": "--mamba-num-groups"}  # fmt: skip


def train_script(model: ModelSpec) -> str:
    """The Megatron-LM script that trains ``model``."""
    return HYBRID_SCRIPT if model.is_hybrid else "pretrain_gpt.py"


def pipeline_pattern(model: ModelSpec, plan: Plan) -> str:
    """The hybrid pattern with a ``|`` between the plan's virtual stages (none when the
    plan has one), and its multi-token prediction block after a ``/`` per depth.

    Raises
    ------
    SpecError, LayoutError
        As :func:`pipette_cp.solvers.split.megatron_split_args`: a split that does not
        sum to the layers, or a virtual stage without layers.

    >>> from pipette_cp.io.model_file import load_model
    >>> from pipette_cp.specs.layouts import make_plan
    >>> m = load_model("nemotron-h-8b").model_copy(update={"hybrid_pattern": "M-M*", "num_layers": 4})
    >>> pipeline_pattern(m, make_plan(num_layers=4, dp=1, pp=2, tp=1, micro_batch_size=1))
    'M-|M*'
    """
    assert model.hybrid_pattern is not None
    megatron_split_args(plan, model.num_layers)  # raises for a split Megatron cannot build
    segments, start = [], 0
    for n in plan.layer_split:
        segments.append(model.hybrid_pattern[start : start + n])
        start += n
    mtp = [model.mtp_hybrid_pattern] * model.mtp_layers if model.mtp_hybrid_pattern else []
    return "/".join(["|".join(segments), *mtp])


def hybrid_split_flags(instance: Instance, plan: Plan) -> list[Flag]:
    """The layers and their split: ``--hybrid-layer-pattern`` with its pipeline segments."""
    return [(PATTERN_FLAG, pipeline_pattern(instance.model, plan))]


def hybrid_model_flags(model: ModelSpec) -> list[Flag]:
    """The layer specs and the Mamba-2 widths (nothing for a model without a pattern).

    Raises
    ------
    UnsupportedError
        A convolution of other than 4 taps (Megatron-Core's Mamba-2 mixer fixes it).
    """
    if not model.is_hybrid:
        return []
    if "M" in (model.hybrid_pattern or "") and model.mamba_conv_kernel != 4:
        raise UnsupportedError("model.mamba_conv_kernel", model.mamba_conv_kernel,
                               "Megatron-Core's Mamba-2 mixer has a fixed d_conv of 4")  # fmt: skip
    flags: list[Flag] = [("--spec", STACK_SPEC)]
    if model.mamba_num_heads is not None:
        flags.append(("--mamba-num-heads", str(model.mamba_num_heads)))
        flags += [(flag, str(getattr(model, field))) for field, flag in _WIDTH_FLAGS.items()
                  if getattr(model, field) != MAMBA_DEFAULTS[field]]  # fmt: skip
    return flags


def hybrid_notes(instance: Instance, plan: Plan) -> list[str]:
    """Comments for the user on a hybrid model's export (none for other models)."""
    m = instance.model
    if not m.is_hybrid:
        return []
    notes = [
        f"hybrid model: the launch files run Megatron-LM's {HYBRID_SCRIPT} (releases before "
        f"HybridModel: set PIPETTE_CP_TRAIN_SCRIPT={LEGACY_HYBRID_SCRIPT})",
        f"{PATTERN_FLAG} gives the {m.num_layers} layers (Megatron derives --num-layers from it)"
        + (f" and, one '|'-separated segment per virtual stage, the split over pp={plan.pp} x "
           f"vpp={plan.vpp}; it replaces Megatron's layout and virtual-stage flags"
           if plan.pp * plan.vpp > 1 else ""),
    ]  # fmt: skip
    return notes


def check_hybrid_argv(given: Mapping[str, tuple[str, Any]]) -> None:
    """The rules of a ``--hybrid-layer-pattern`` argument list (``dest -> (flag, value)``
    as :func:`pipette_cp.report.megatron.check.parse_megatron_argv` returns it): its
    ``|`` segments a multiple of pp and no other split flag beside them
    (``docs/user-guide/hybrid-model-migration.md``), ``--num-layers`` (if given) its
    layer count and ``--mtp-num-layers`` its ``/`` depths, ``--num-experts`` for ``E``
    layers, and tensor parallelism dividing the Mamba heads and groups (``MambaMixer``'s
    assertions).

    Raises
    ------
    SpecError
        The first rule broken, naming the flag and its value.
    """
    if "hybrid_layer_pattern" not in given:
        return
    flag, pattern = given["hybrid_layer_pattern"]
    main, *mtp = str(pattern).split("/")
    segments, layers = main.count("|") + 1, len(main.replace("|", ""))
    pp = int(given.get("pipeline_model_parallel_size", ("", 1))[1])
    tp = int(given.get("tensor_model_parallel_size", ("", 1))[1])
    if segments > 1 and segments % pp:
        raise SpecError(flag, pattern, f"has {segments} pipeline segments ('|'), not a multiple "
                        f"of --pipeline-model-parallel-size {pp}")  # fmt: skip
    clash = next(((f, v) for d, (f, v) in given.items() if d in _SPLIT_DESTS), None)
    if segments > 1 and clash is not None:
        raise SpecError(clash[0], clash[1], f"cannot be combined with '|' segments in {flag} "
                        "(the pattern gives the pipeline split)")  # fmt: skip
    if "num_layers" in given and int(given["num_layers"][1]) != layers:
        raise SpecError("--num-layers", given["num_layers"][1], f"{flag} has {layers} layers")
    depths = given.get("mtp_num_layers", ("", len(mtp)))[1]
    if mtp and depths != len(mtp):
        raise SpecError("--mtp-num-layers", depths, f"{flag} has {len(mtp)} depths after '/'")
    if "E" in str(pattern) and "num_experts" not in given:
        raise SpecError(flag, pattern, "has mixture-of-experts layers (E): needs --num-experts")
    if "M" in main:
        for dest, default in (("mamba_num_heads", None), ("mamba_num_groups", 8)):
            value = given.get(dest, ("", default))[1]
            if value is not None and int(value) % tp:
                raise SpecError(f"--{dest.replace('_', '-')}", value, f"must be divisible by "
                                f"--tensor-model-parallel-size {tp} (Mamba-2 mixer)")  # fmt: skip


#: The ``dest`` of the split flags a ``|``-segmented hybrid pattern replaces.
_SPLIT_DESTS = frozenset({
    "num_layers_per_virtual_pipeline_stage", "num_virtual_stages_per_pipeline_rank",
    "pipeline_model_parallel_layout", "decoder_first_pipeline_num_layers",
    "decoder_last_pipeline_num_layers", "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split",
})  # fmt: skip
