"""Options and inputs shared by several commands.

An instance bundles model, cluster and training; the options of
:func:`instance_options` (``predict``, ``solve``) replace a part of it, so a
measured cluster or another model can be used without writing an instance file::

    pipette-cp solve --model llama-2-7b --cluster cluster.yaml --global-batch 512

A plan file (``solve --out``) is read by :func:`read_plan`; with its instance
(``--instance``, :data:`PlanInstanceOption`) by :func:`load_plan` (``export``,
``plot``, ``explain``).
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any, get_type_hints

import typer
import yaml

from pipette_cp.cost.evaluator.layout_rules import validate_layout
from pipette_cp.errors import InputFileError, SpecError
from pipette_cp.io.cluster_file import read_cluster_file
from pipette_cp.io.files import load_json, read_text
from pipette_cp.io.instance_file import load_instance
from pipette_cp.io.model_file import load_model
from pipette_cp.io.profile_file import load_layer_profile
from pipette_cp.io.yaml_safe import safe_load
from pipette_cp.report.plan_file import read_plan_document
from pipette_cp.solvers.milp_engine import DEFAULT_ENGINE, ENGINES, check_engine, require_engine
from pipette_cp.solvers.registry import MILP_METHODS
from pipette_cp.specs import Instance, Plan, TrainingSpec, validate_spec

InstanceArgument = Annotated[str, typer.Argument(help="Bundled instance name or instance file.")]
ModelOption = Annotated[
    str | None,
    typer.Option(
        "--model", help="Replace the instance's model: bundled name, YAML, or HF config.json."
    ),
]
ClusterOption = Annotated[
    Path | None,
    typer.Option(
        "--cluster", help="Replace the instance's cluster: a cluster file (e.g. from import)."
    ),
]
ProfileOption = Annotated[
    Path | None,
    typer.Option("--profile", help="Measured layer times (pipette-cp profile) for the compute."),
]
GlobalBatchOption = Annotated[
    int | None, typer.Option("--global-batch", help="Replace the global batch (sequences).")
]
SeqLengthOption = Annotated[
    int | None, typer.Option("--seq-length", help="Replace the sequence length (tokens).")
]
FrameworkOption = Annotated[
    str | None,
    typer.Option(
        "--framework",
        help="Replace the training framework: megatron-core, megatron-lm, nemo, "
        "megatron-deepspeed, megatron-deepspeed-bf16, aleph-alpha, llm-foundry, torchtitan, "
        "megatron-bridge.",
    ),
]
TrainingSetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--training",
        help="Set a training field, KEY=VALUE (repeatable), e.g. fused_norm=false, "
        "attention_kernel=flash2, fused_cross_entropy=true, framework=nemo.",
    ),
]
MemoryHeadroomOption = Annotated[
    str | None,
    typer.Option(
        "--memory-headroom",
        help="Memory kept free per GPU: GiB (e.g. 4 or 4GiB), GB (4GB) or a fraction or percentage "
        "of its memory (0.05, 5%) [default: 2%, at least 1 GiB].",
    ),
]

RayAddressOption = Annotated[
    str | None,
    typer.Option(
        "--ray-address",
        help="host:port of a running Ray cluster (--executor ray) [default: RAY_ADDRESS, "
        "else a local Ray].",
    ),
]

MilpSolverOption = Annotated[
    str | None,
    typer.Option(
        "--milp-solver",
        help=f"MILP engine of --method milp and split-milp: {', '.join(ENGINES)} "
        f"(commercial ones where PuLP can start them) [default: {DEFAULT_ENGINE}].",
    ),
]


def check_deterministic(method: str, snapshots: bool) -> None:
    """``--deterministic`` only where the search can be: one line naming the option else."""
    if method in MILP_METHODS:
        raise SpecError(
            "--method",
            method,
            "cannot run with --deterministic: its MILP engines stop by "
            "wall time only; use cpsat or split-cpsat",
        )
    if snapshots:
        raise SpecError(
            "--deterministic", True, "the robust search (--snapshots) is budgeted by wall time"
        )


def milp_solver_of(value: str | None, method: str) -> str:
    """The engine ``--milp-solver`` names (default :data:`DEFAULT_ENGINE`): a one-line
    SpecError for an unknown one, one PuLP cannot start, or a method without MILP."""
    if value is None:
        return DEFAULT_ENGINE
    check_engine(value, "--milp-solver")
    if method not in MILP_METHODS:
        methods = " and ".join(sorted(MILP_METHODS))
        raise SpecError("--milp-solver", value, f"applies to --method {methods} only; give one")
    require_engine(value, "--milp-solver")
    return value


def parse_assignments(option: str, items: list[str]) -> dict[str, object]:
    """``KEY=VALUE`` items as a mapping, each value read as a YAML scalar (``true``,
    ``2``, ``flash2``); the spec validates the keys and values.

    >>> parse_assignments("--training", ["fused_norm=false", "framework=nemo"])
    {'fused_norm': False, 'framework': 'nemo'}
    """
    out: dict[str, object] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise SpecError(option, item, "expected KEY=VALUE, e.g. fused_norm=false")
        try:
            out[key.strip().replace("-", "_")] = safe_load(raw)
        except yaml.YAMLError:
            raise SpecError(option, item, "the value is not a YAML scalar") from None
    return out


def parse_headroom(text: str) -> dict[str, float | None]:
    """``--memory-headroom`` as the training fields it sets: ``4`` / ``4GiB`` -> 4 GiB in
    bytes, ``4GB`` -> 4e9 bytes, ``0.05`` / ``5%`` -> the fraction 0.05.

    >>> parse_headroom("4GiB")["memory_headroom_bytes"] == 4 * 2**30
    True
    >>> parse_headroom("5GB")["memory_headroom_bytes"]
    5000000000.0
    >>> parse_headroom("5%"), parse_headroom("0.1")["memory_headroom_fraction"]
    ({'memory_headroom_bytes': None, 'memory_headroom_fraction': 0.05}, 0.1)
    """
    raw = text.strip()
    lowered = raw.lower()
    percent = lowered.endswith("%")
    number = lowered.removesuffix("%").removesuffix("gib").removesuffix("gb").strip()
    try:
        value = float(number)
    except ValueError:
        value = float("nan")
    unit = 2**30 if lowered.endswith("gib") else 1e9 if lowered.endswith("gb") else None
    if not value > 0 or value == float("inf") or (percent and value >= 100) or (unit and value < 1):
        raise SpecError(
            "--memory-headroom", raw,
            "expected GiB from 1 up (4, 4GiB), GB (4GB = 4e9 bytes), a fraction below 1 "
            "(0.05) or a percentage (5%)",
        )  # fmt: skip
    if percent or (unit is None and value < 1):
        return {"memory_headroom_bytes": None, "memory_headroom_fraction": value / 100 if percent else value}  # fmt: skip
    return {"memory_headroom_bytes": value * (unit or 2**30), "memory_headroom_fraction": None}


@dataclass(frozen=True)
class Replacements:
    """The parts of an instance replaced on the command line (``None``: the instance's own);
    each field's annotation is its option, in the order ``--help`` lists them."""

    model: ModelOption = None
    cluster: ClusterOption = None
    profile: ProfileOption = None
    global_batch: GlobalBatchOption = None
    seq_length: SeqLengthOption = None
    framework: FrameworkOption = None
    memory_headroom: MemoryHeadroomOption = None
    training: TrainingSetOption = None

    def any(self) -> bool:
        """Whether anything is replaced (the instance file no longer describes the job)."""
        return any(getattr(self, f.name) is not None for f in fields(self))


#: Nothing replaced: the default of a command's ``replace`` parameter.
NO_REPLACEMENTS = Replacements()


def instance_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Give ``command`` the options of :class:`Replacements` (``--model``, ``--cluster``,
    ``--profile``, ``--global-batch``, ``--seq-length``, ``--framework``,
    ``--memory-headroom``) in place of its ``replace``
    parameter, which receives them as one :class:`Replacements`."""
    signature = inspect.signature(command, eval_str=True)
    params = list(signature.parameters.values())
    at = [p.name for p in params].index("replace")
    hints = get_type_hints(Replacements, include_extras=True)  # the Annotated options
    names = [f.name for f in fields(Replacements)]
    options = [
        inspect.Parameter(name, params[at].kind, default=None, annotation=hints[name])
        for name in names
    ]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        replace = Replacements(**{name: kwargs.pop(name) for name in names})
        return command(**kwargs, replace=replace)

    wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*params[:at], *options, *params[at + 1 :]]
    )
    return wrapper


def resolve_instance(instance: str, replace: Replacements) -> Instance:
    """Load ``instance`` and apply the command-line replacements (validated)."""
    model, cluster, profile = replace.model, replace.cluster, replace.profile
    global_batch, seq_length = replace.global_batch, replace.seq_length
    inst = load_instance(instance)
    update: dict = {}
    if model is not None:
        update["model"] = load_model(model)
    if cluster is not None:
        update["cluster"] = read_cluster_file(cluster)
    if profile is not None:
        update["profile"] = load_layer_profile(profile)
    framework = None if replace.framework is None else {"name": replace.framework}
    pairs = (("global_batch_size", global_batch), ("seq_length", seq_length),
             ("framework", framework))  # fmt: skip
    training: dict[str, object] = {k: v for k, v in pairs if v is not None}
    if replace.memory_headroom is not None:  # replaces either headroom field
        training.update(parse_headroom(replace.memory_headroom))
    training.update(parse_assignments("--training", replace.training or []))
    if training:
        update["training"] = validate_spec(
            TrainingSpec, {**inst.training.model_dump(), **training}, "training"
        )
    if not update:
        return inst
    if model is not None or cluster is not None:
        update["best_known"] = None  # it belonged to the original pair
        model_name = update["model"].name if model is not None else inst.model.name
        update["name"] = f"{model_name}-on-{cluster.stem if cluster is not None else inst.name}"
    return validate_spec(Instance, {**dict(inst), **update}, "instance")


def assumptions(inst: Instance, replace: Replacements) -> str:
    """One line: the job's global batch and sequence length, and where each came from
    (an option, or the instance, whose values a replaced model or cluster inherits)."""
    t = inst.training

    def source(option: str, given: object) -> str:
        return f"from {option}" if given is not None else f"from the instance {inst.name}"

    return (
        f"assuming a global batch of {t.global_batch_size} sequences "
        f"({source('--global-batch', replace.global_batch)}) of {t.seq_length} tokens "
        f"({source('--seq-length', replace.seq_length)}), framework {t.framework.name}"
    )


PlanInstanceOption = Annotated[
    str | None,
    typer.Option(
        "--instance", help="Instance the plan is for [default: the one recorded in the plan]."
    ),
]


def read_plan(path: Path) -> Plan:
    """A plan file; a malformed one is an error naming the file."""
    try:
        return read_plan_document(load_json(read_text(path), path))
    except json.JSONDecodeError as exc:
        raise InputFileError(
            path, f"malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    except SpecError as exc:
        raise InputFileError(path, str(exc)) from None


def _recorded_instance(path: Path, plan: Plan, given: str | None = None) -> str | None:
    """The plan's own instance: a bundled name, or an instance file (``.yaml``) in the
    plan's folder, named relative to it; None when it records none.  A recorded file
    elsewhere is never opened (a plan is no key to other files): refused, or ignored when
    ``given`` (``--instance``) stands in for it."""
    name = plan.instance
    if not name:
        return None
    if not name.endswith((".yaml", ".yml")):
        return name  # a bundled instance name (load_instance says if there is none)
    folder = path.parent.resolve()
    beside = (path.parent / name).resolve()
    if not beside.is_relative_to(folder):
        if given is not None:
            return None
        raise SpecError("plan.instance", name, f"an instance file must be in the plan's folder "
                        f"({folder}); pass --instance to name another")  # fmt: skip
    return str(path.parent / name)


def load_plan(path: Path, instance: str | None) -> tuple[Plan, Instance]:
    """A plan file and its instance (from ``--instance`` or the plan's own record).

    The plan's record is a bundled instance name or an instance file in the plan's
    folder (no other file is opened for it);
    another ``--instance`` is accepted only for the same model and GPU count (the plan
    moved, or its instance was renamed), and a plan that does not fit the instance's
    layout rules is refused."""
    plan = read_plan(path)
    recorded = _recorded_instance(path, plan, instance)
    if recorded is not None and not recorded.endswith((".yaml", ".yml")) and "/" in recorded:
        raise SpecError("plan.instance", recorded, "expected a bundled instance name or an instance .yaml file")  # fmt: skip
    name = instance or recorded
    if not name:
        raise SpecError("--instance", None, f"{path} does not record its instance; pass --instance")
    inst = load_instance(name)
    if instance is not None and recorded is not None and instance != recorded:
        try:
            own = load_instance(recorded)
        except (InputFileError, SpecError):
            own = None  # the plan's own instance is gone: the given one stands in
        if own is not None and (
            own.model != inst.model or own.cluster.num_gpus != inst.cluster.num_gpus
        ):
            raise SpecError(
                "--instance", instance,
                f"the plan was made for {recorded} ({own.model.name} on {own.cluster.num_gpus} GPUs), "
                f"not {inst.model.name} on {inst.cluster.num_gpus} GPUs",
            )  # fmt: skip
    validate_layout(inst, plan)  # a plan made for another instance (or edited by hand)
    return plan, inst
