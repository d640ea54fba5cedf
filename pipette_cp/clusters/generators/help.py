"""The parameters each generator takes through ``--set KEY=VALUE``, read from its code:
names and defaults from the builder's keyword parameters (those
:func:`~pipette_cp.clusters.generators.params.call_builder` accepts), types and
descriptions from its numpy-style docstring, plus those of the generators it builds on
(``degraded``, ``failslow``).  ``nodes`` and ``seed`` are options, not parameters.

>>> [p.name for p in generator_parameters("fat-tree")][:2]
['leaf_nodes', 'pod_leaves']
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from pipette_cp.clusters.generators.params import parameters_of
from pipette_cp.clusters.generators.registry import generator_info
from pipette_cp.clusters.generators.trees import tree_info

#: Base parameters a generator takes by name but refuses (failslow: set by correlation).
_REFUSED = {"failslow": {"persistent_share"}}
#: Parameters documented in prose only (the fat tree's module docstring).
_PROSE = {
    "leaf_nodes": "Nodes per leaf switch.",
    "pod_leaves": "Leaves per pod; the spine joins the pods.",
    "slow_nic_rate": "Share of the nodes whose NICs run at half speed.",
    "degraded_pair_rate": "Share of the node pairs degraded to degraded_factor of their level.",
    "degraded_factor": "Bandwidth a degraded pair keeps, relative to its level.",
    "failed_pair_rate": "Share of the node pairs that fail (bandwidth 0).",
    "spine_factor": "Bandwidth across pods relative to across leaves (0.9: an assumption).",
}


@dataclass(frozen=True)
class Parameter:
    """One ``--set`` parameter: ``default`` under the other defaults, ``needs`` the
    settings it applies under (``base=h100-multileaf``), ``note`` what else to know."""

    name: str
    type: str
    default: Any
    description: str
    unit: str = ""
    note: str = ""
    needs: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The default as a ``--set`` value (``null`` for None)."""
        return format_value(self.default)


def format_value(value: Any) -> str:
    """``value`` as YAML reads it back: ``null``, ``true``, ``0.026``, ``1.0e-06``."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, float):
        text = f"{value:g}" if float(f"{value:g}") == value else repr(value)
        mantissa, e, exponent = text.partition("e")
        return f"{mantissa}.0e{exponent}" if e and "." not in mantissa else text
    return str(value)


def _docs(builder: Callable[..., Any]) -> dict[str, tuple[str, str]]:
    """Name -> (type, first sentence) from the ``Parameters`` section of the docstring."""
    text = inspect.cleandoc(builder.__doc__ or "")
    section = text.partition("Parameters\n----------\n")[2]
    section = re.split(r"\n\S[^\n]*\n-{3,}\n", section)[0]
    entries: dict[str, tuple[str, list[str]]] = {}
    names: list[str] = []
    for line in section.splitlines():
        if line and not line[0].isspace():
            head, _, kind = line.partition(" : ")
            names = [n.strip() for n in head.split(",")]
            entries.update({n: (kind.strip(), []) for n in names})
        else:
            for n in names:
                entries[n][1].append(line.strip())
    return {n: (kind, _sentence(" ".join(words))) for n, (kind, words) in entries.items()}


def _sentence(text: str, limit: int = 120) -> str:
    """The first sentence, reST roles and literals as plain text; over ``limit``
    characters, without a closing parenthesis (a source) or its last clauses."""
    text = re.sub(r":\w+:`~?(?:[\w.]*\.)?([^`]+)`", r"\1", text).replace("``", "")
    text = re.split(r"(?<!e\.g\.)(?<!i\.e\.)(?<=\.)\s+", text.strip(), maxsplit=1)[0]
    while len(text) > limit:
        shorter = re.sub(r"\s*\([^()]*\)\.?$", "", text)
        if shorter == text:
            cut = max(text.rfind("; "), text.rfind(": "))
            if cut < 30:
                break
            shorter = text[:cut]
        text = shorter.rstrip(".,;:") + "."
    return text


def _parameter(
    name: str, default: Any, builder: Callable[..., Any], note: str = "", **needs: Any
) -> Parameter:
    kind, description = _docs(builder).get(name, ("", _PROSE.get(name, "")))
    annotation = inspect.signature(builder).parameters[name].annotation
    if not kind:
        kind = annotation if isinstance(annotation, str) else type(default).__name__
    unit = "GB/s" if name.endswith("gbytes_per_s") else ""
    if unit and unit not in description:
        description = f"{description.rstrip('.')}, {unit}."
    note = "also --gpus-per-node" if name == "gpus_per_node" else note
    return Parameter(name, kind, default, description, unit, note, needs)


def generator_parameters(kind: str) -> list[Parameter]:
    """The ``--set`` parameters of the generator ``kind`` (or alias), in signature order;
    an unknown kind raises the :class:`SpecError` of :func:`~.registry.generate`."""
    tree = tree_info(kind)
    if tree is not None:
        return [_parameter(n, d, tree.parameters) for n, d in tree.defaults.items()]
    info = generator_info(kind)
    refused = _REFUSED.get(info.kind, set())
    found = {n: _parameter(n, d, info.builder) for n, d in info.defaults.items()}
    first = info.defaults.get("base", next(iter(info.base_kinds), None))
    for base in sorted(info.base_kinds, key=lambda b: b != first):  # default base first
        builder = info.base_kinds[base]
        for name, default in parameters_of(builder).items():
            if name in refused:
                continue
            if name not in found:
                only = {"base": base} if "base" in info.defaults and base != first else {}
                note = f"base {base} only" if only else ""
                found[name] = _parameter(name, default, builder, note, **only)
            elif name not in info.defaults and found[name].default != default:
                extra = f"{format_value(default)} with base {base}"
                note = "; ".join(filter(None, [found[name].note, extra]))
                found[name] = replace(found[name], note=note)
    return list(found.values())


def generator_kind(kind: str) -> str:
    """The registry name of the generator ``kind`` or its alias."""
    tree = tree_info(kind)
    return tree.kind if tree is not None else generator_info(kind).kind


def accepted_keys(kind: str) -> set[str]:
    """Every key ``generate(kind, ...)`` takes by name as a generator parameter."""
    tree = tree_info(kind)
    if tree is not None:
        return set(tree.defaults)
    info = generator_info(kind)
    return {*info.defaults, *(p for b in info.base_kinds.values() for p in parameters_of(b))}
