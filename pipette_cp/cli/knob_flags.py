"""Options spliced into a command's signature: ``solve``'s search-space flags (the sizes'
and the knobs') and ``predict``'s plan flags of the knobs (:attr:`~pipette_cp.specs.knobs.Knob.solve_flags`,
:attr:`~pipette_cp.specs.knobs.Knob.predict_flags`, in the knobs' order), and the
mechanism :func:`pipette_cp.cli.options.instance_options` shares.

A command declares one parameter in place of the generated options (its position is
theirs in ``--help``) and receives their values in it as one mapping.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Annotated, Any

import typer

from pipette_cp.errors import SpecError
from pipette_cp.specs.knobs import KNOBS, PlanFlag, SpaceFlag

#: No generated option given: the default of a command's placeholder parameter.
NO_VALUES: Mapping[str, Any] = MappingProxyType({})


def splice(
    command: Callable[..., Any], placeholder: str, options: list[inspect.Parameter],
    collect: Callable[[dict[str, Any]], Any],
) -> Callable[..., Any]:  # fmt: skip
    """``command`` with ``options`` in place of its parameter ``placeholder``, which
    receives ``collect(values of the options by name)``."""
    signature = inspect.signature(command, eval_str=True)
    params = list(signature.parameters.values())
    at = [p.name for p in params].index(placeholder)
    names = [option.name for option in options]
    spliced = [option.replace(kind=params[at].kind) for option in options]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        values = {name: kwargs.pop(name) for name in names}
        return command(**kwargs, **{placeholder: collect(values)})

    wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*params[:at], *spliced, *params[at + 1 :]]
    )
    return wrapper


# ------------------------------------------------------------------- solve's flags
#: The search space's parallel sizes, before the knobs' flags.
DEGREE_FLAGS: tuple[SpaceFlag, ...] = (
    SpaceFlag("tp", "--tp", "Allowed tp sizes, e.g. 2,4,8.", "ints"),
    SpaceFlag("pp", "--pp", "Allowed pp sizes.", "ints"),
    SpaceFlag("dp", "--dp", "Allowed dp sizes.", "ints"),
    SpaceFlag("cp", "--cp", "Allowed context-parallel sizes.", "ints"),
    SpaceFlag("ep", "--ep", "Allowed expert-parallel sizes.", "ints"),
    SpaceFlag("etp", "--etp", "Allowed expert tensor-parallel sizes.", "ints"),
)
SPACE_FLAGS: tuple[SpaceFlag, ...] = tuple(f for knob in KNOBS for f in knob.solve_flags)


def _param_name(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def parse_ints(option: str, text: str | None) -> tuple[int, ...] | None:
    """A comma list of integers (None: not given); a one-line error naming ``option``."""
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise SpecError(option, text, "expected comma-separated integers, e.g. 1,2,4") from None


def parse_space(texts: Mapping[str, str | None]) -> dict[str, Any]:
    """The search-space fields the texts of :func:`space_options` set (None: not given),
    parsed in the options' order; a one-line error naming the option."""
    out: dict[str, Any] = {}
    for flag in (*DEGREE_FLAGS, *SPACE_FLAGS):
        text = texts.get(_param_name(flag.flag))
        if flag.parse == "ints":
            out[flag.field] = parse_ints(flag.flag, text)
        else:
            out[flag.field] = None if text is None else tuple(text.split(","))
    return out


def space_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Give ``command`` the search-space options of the sizes (``--tp``, ...,
    :data:`DEGREE_FLAGS`) and of the knobs (``--mb``, ``--vpp``, ``--dp-sharding``, ...)
    in place of its ``space_texts`` parameter, which receives their texts by option
    (:func:`parse_space` reads them where the command checks its options)."""
    options = [
        inspect.Parameter(
            _param_name(flag.flag),
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[str | None, typer.Option(flag.flag, help=flag.help)],
        )
        for flag in (*DEGREE_FLAGS, *SPACE_FLAGS)
    ]
    return splice(command, "space_texts", options, dict)


# ----------------------------------------------------------------- predict's flags
PLAN_FLAGS: tuple[PlanFlag, ...] = tuple(f for knob in KNOBS for f in knob.predict_flags)


def _choice(flag: PlanFlag) -> type[StrEnum]:
    assert isinstance(flag.kind, tuple)
    members = [(name.replace("-", "_"), name) for name in flag.kind]
    return StrEnum(f"{flag.param.title().replace('_', '')}Choice", members)  # type: ignore[return-value]


_CHOICES = {flag.param: _choice(flag) for flag in PLAN_FLAGS if isinstance(flag.kind, tuple)}


def _plan_option(flag: PlanFlag) -> inspect.Parameter:
    option = typer.Option(*flag.decls, help=flag.help)
    kind: Any = _CHOICES.get(flag.param, flag.kind)
    default = flag.default if flag.default is None or kind in (bool, int) else kind(flag.default)
    annotation = kind if flag.default is not None else kind | None
    return inspect.Parameter(flag.param, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[annotation, option])  # fmt: skip


def _plan_values(values: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for flag in PLAN_FLAGS:
        value = values[flag.param]
        out[flag.field] = value.value if isinstance(value, StrEnum) else value
    return out


def resolve_plan_defaults(knobs: Mapping[str, Any], degrees: Mapping[str, int]) -> dict[str, Any]:
    """``knobs`` with each option left unset that has an ``auto`` rule set by it from the
    layout's ``degrees`` (``--sp``: on where tp > 1)."""
    out = dict(knobs)
    for flag in PLAN_FLAGS:
        if flag.auto is not None and out.get(flag.field) is None:
            out[flag.field] = flag.auto(degrees)
    return out


def plan_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Give ``command`` the knobs' plan options (``--sp/--no-sp``, ``--recompute``,
    ``--dist-opt``, ...) in place of its ``knobs`` parameter, which receives
    ``{plan field: value}`` of every one."""
    return splice(command, "knobs", [_plan_option(f) for f in PLAN_FLAGS], _plan_values)
