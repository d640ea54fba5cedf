"""What a layout knob is: one declaration from which the package derives the rest.

A :class:`Knob` names its plan field(s) and search-space field(s), the values a search
tries given the job and what was chosen before it (:attr:`Knob.choices`), its validity
rules (:class:`Rule`, each raising the :class:`~pipette_cp.errors.LayoutError` the user
sees), its part of a plan's label, which of the plan's values its costs read (the cost
cache key), its Megatron-LM arguments and its command-line options.  The functions take
the plan (or the layout being enumerated) as a small Protocol of the values they read,
so this module and the declarations never import :mod:`pipette_cp.specs.plan`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Generic, Literal, NamedTuple, Protocol, TypeVar

from pipette_cp.errors import LayoutError
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.search_space import SearchSpace
from pipette_cp.specs.training import Sharding, TrainingSpec

#: One Megatron-LM flag and its value (None for a switch).
Flag = tuple[str, str | None]


class Job(NamedTuple):
    """What a knob's choices and rules may read besides the layout."""

    model: ModelSpec
    training: TrainingSpec
    space: SearchSpace


class Degrees(Protocol):
    """The parallel degrees of a plan (or of a layout being enumerated)."""

    @property
    def dp(self) -> int: ...
    @property
    def pp(self) -> int: ...
    @property
    def tp(self) -> int: ...
    @property
    def cp(self) -> int: ...
    @property
    def ep(self) -> int: ...
    @property
    def etp(self) -> int | None: ...


class Phase(IntEnum):
    """Where a knob's rule runs among the layout checks
    (:func:`~pipette_cp.cost.evaluator.layout_rules.check_knobs`), between the degrees'
    own rules; within a phase the rules run in the knobs' order."""

    #: right after context parallelism's own rule (2 cp dividing the sequence)
    CONTEXT = 1
    #: for mixture-of-experts models, after the expert degrees' rules: their state
    EXPERT_STATE = 2
    #: then what tensor parallelism with experts needs
    EXPERT_TENSOR = 3
    #: after the degrees' rules (tensor sizes, heads, GPU count)
    BATCH = 4
    #: after the layer split's rule
    SCHEDULE = 5


V = TypeVar("V", contravariant=True)


@dataclass(frozen=True)
class Rule(Generic[V]):
    """A validity rule: ``check(job, plan)`` raises the LayoutError naming the plan
    field, its value and why, else returns None."""

    phase: Phase
    check: Callable[[Job, V], None]


@dataclass(frozen=True)
class SpaceFlag:
    """A ``pipette-cp solve`` option that sets a search-space field from a comma list
    (``ints``: sizes, ``words``: names; the space validates the values)."""

    field: str
    flag: str
    help: str
    parse: Literal["ints", "words"]


@dataclass(frozen=True)
class PlanFlag:
    """A ``pipette-cp predict`` option that sets a plan field: ``kind`` is ``bool`` (a
    ``--x/--no-x`` switch), ``int``, or the tuple of names a choice takes.  ``auto``: the
    value when the option is not given, from the layout's degrees (``{"tp": 2, ...}``),
    what ``solve`` tries first there (``default`` is then None)."""

    field: str
    param: str
    decls: tuple[str, ...]
    help: str
    kind: type | tuple[str, ...]
    default: Any = None
    auto: Callable[[Mapping[str, int]], Any] | None = None


def _no_label(_: Any) -> tuple[str, ...]:
    return ()


@dataclass(frozen=True)
class Knob(Generic[V]):
    """One layout knob (see the module docstring).

    ``choices(job, layout)``: the values to try, best-first as the search wants them,
    given the degrees and the knobs before this one in :data:`~pipette_cp.specs.knobs.KNOBS`
    (``layout`` has those as attributes); a value is the field's value, or a tuple in
    the order of ``fields`` for a knob of several fields.  ``key``: the plan attributes
    (fields or properties) its costs depend on; plans equal in them and in everything
    else of :func:`~pipette_cp.specs.knobs.knobs_key` cost the same (default: ``fields``).
    ``lightest(space)``: the values the whole-model memory bound
    (:mod:`~pipette_cp.search.capacity`) must try, for a knob that can lower the memory of
    a layout (None: the field's default is as light as any value).
    ``megatron(training, plan)``: its Megatron-LM flags (None: exported elsewhere, see the
    declaration).  ``fields`` defaults to ``(name,)``, ``space_fields`` to ``fields``.
    """

    name: str
    choices: Callable[[Job, Any], Sequence[Any]]
    fields: tuple[str, ...] = ()
    space_fields: tuple[str, ...] = ()
    rules: tuple[Rule[V], ...] = ()
    label: Callable[[V], tuple[str, ...]] = _no_label
    key: tuple[str, ...] = ()
    megatron: Callable[[TrainingSpec, V], list[Flag]] | None = None
    lightest: Callable[[SearchSpace], Sequence[Any]] | None = None
    solve_flags: tuple[SpaceFlag, ...] = ()
    predict_flags: tuple[PlanFlag, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", self.fields or (self.name,))
        object.__setattr__(self, "space_fields", self.space_fields or self.fields)

    @property
    def cost_key(self) -> tuple[str, ...]:
        """The plan attributes its costs read (``key``, else ``fields``)."""
        return self.key or self.fields

    def values(self, plan: Any) -> dict[str, Any]:
        """Its fields' values in ``plan``."""
        return {name: getattr(plan, name) for name in self.fields}

    def assignment(self, value: Any) -> dict[str, Any]:
        """The fields ``value`` (one of :attr:`choices`) sets."""
        if len(self.fields) == 1:
            return {self.fields[0]: value}
        return dict(zip(self.fields, value, strict=True))


#: The choices of a switch the space leaves off (shared: the search only reads it).
OFF: list[bool] = [False]


def switch(
    name: str,
    *,
    refusal: Callable[[Job, Sharding], str | None],
    megatron: Sequence[Flag],
    label: str,
    solve_flag: tuple[str, str],
    predict_flag: tuple[str, str, str],
) -> Knob[Any]:
    """An on/off knob whose plan and search-space fields are ``name``: tried on where
    ``refusal(job, sharding)`` (the layout's effective data-parallel sharding) says
    nothing, refused naming the field where it says why, ``megatron`` flags and the
    ``label`` when on.  ``solve_flag``: (option, help); ``predict_flag``: (parameter,
    ``--x/--no-x``, help)."""

    def choices(job: Job, layout: Any) -> list[bool]:
        wanted: tuple[bool, ...] = getattr(job.space, name)
        if wanted == (False,):
            return OFF
        runs = refusal(job, layout.dp_sharding or "none") is None
        return [on for on in wanted if runs or not on] or [False]

    def runs(job: Job, plan: Any) -> None:
        if getattr(plan, name) and (why := refusal(job, plan.sharding)):
            raise LayoutError(f"plan.{name}", True, why)

    return Knob(
        name=name,
        choices=choices,
        rules=(Rule(Phase.SCHEDULE, runs),),
        label=lambda plan: (label,) if getattr(plan, name) else (),
        megatron=lambda training, plan: list(megatron) if getattr(plan, name) else [],
        lightest=lambda space: getattr(space, name),
        solve_flags=(SpaceFlag(name, solve_flag[0], solve_flag[1], "words"),),
        predict_flags=(
            PlanFlag(name, predict_flag[0], (predict_flag[1],), predict_flag[2], bool, False),
        ),
    )
