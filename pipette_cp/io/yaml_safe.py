"""A YAML loader for untrusted input: :class:`yaml.SafeLoader` with limits.

``yaml.safe_load`` builds no arbitrary objects, but it still accepts three
things no input of ours needs and that turn into a hang, a traceback or a silent
mistake:

* an *alias bomb* ("billion laughs": ``b: [*a, *a]``, ``c: [*b, *b]``, ...): a
  few hundred bytes that expand to billions of values once anything walks them;
  refused when the aliases of a document expand to more than
  :data:`MAX_ALIAS_NODES` nodes, and an alias of a node that contains it
  (a cycle) is refused too;
* deep nesting (``[[[[...]]]]``): the composer recurses once per level and dies
  with :class:`RecursionError` at about a thousand; refused beyond
  :data:`MAX_DEPTH` levels of lists and mappings, before any recursion limit;
* a key given twice in one mapping: ``safe_load`` keeps the last value without a
  word; refused, naming the key (a key overriding one taken in by a ``<<`` merge
  is not a duplicate).

Every refusal is a :class:`RefusedYamlError` (a :class:`yaml.MarkedYAMLError`)
with the position of the offending node;
:func:`pipette_cp.io.files.read_mapping` turns it into one line naming the file.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

#: Deepest nesting of lists and mappings accepted (instance files need about 6).
MAX_DEPTH = 32

#: Most nodes that the aliases of one document may stand for, counted expanded.
MAX_ALIAS_NODES = 10_000

_MERGE_TAG = "tag:yaml.org,2002:merge"


class RefusedYamlError(yaml.MarkedYAMLError):
    """Valid YAML that is refused: an alias bomb, too deep a nesting or a duplicate key."""

    def __init__(self, problem: str, mark: Any) -> None:  # a yaml Mark (Python or C), or None
        super().__init__(problem=problem, problem_mark=mark)

    def where(self) -> str:
        """`` at line L column C`` (1-based), or an empty string without a position."""
        mark = self.problem_mark
        return f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""


class LimitedSafeLoader(yaml.SafeLoader):
    """:class:`yaml.SafeLoader` refusing alias bombs, deep nesting and duplicate keys
    (module doc).  Use it through :func:`safe_load`."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._open_anchors: set[str] = set()
        self._sizes: dict[int, int] = {}  # id(node) -> nodes it stands for, aliases expanded
        self._alias_nodes = 0

    def compose_document(self) -> Node | None:
        self._depth, self._alias_nodes = 0, 0
        self._open_anchors.clear()
        node = super().compose_document()
        self._sizes.clear()
        return node

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            return self._alias(event, parent, index)
        nested = isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent)
        if nested:
            self._depth += 1
            if self._depth > MAX_DEPTH:
                raise RefusedYamlError(
                    f"YAML nested deeper than {MAX_DEPTH} levels", event.start_mark
                )
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            self._open_anchors.add(anchor)
        node = super().compose_node(parent, index)
        if anchor is not None:
            self._open_anchors.discard(anchor)
        if nested:
            self._depth -= 1
        if nested and node is not None:  # a scalar stands for 1 node: not stored
            self._sizes[id(node)] = 1 + sum(self._sizes.get(id(c), 1) for c in _children(node))
        return node

    def _alias(self, event: yaml.AliasEvent, parent: Node | None, index: Any) -> Node | None:
        if event.anchor in self._open_anchors:
            raise RefusedYamlError(
                f"YAML alias *{event.anchor} refers to a node that contains it (a cycle)",
                event.start_mark,
            )
        node = self.anchors.get(event.anchor) if event.anchor is not None else None
        if node is not None:
            self._alias_nodes += self._sizes.get(id(node), 1)
            if self._alias_nodes > MAX_ALIAS_NODES:
                raise RefusedYamlError(
                    f"YAML aliases expand to more than {MAX_ALIAS_NODES} nodes (an alias bomb?)",
                    event.start_mark,
                )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            seen: dict[Any, Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # unhashable: the base class reports it
                    continue
                if first is not None:
                    line = first.start_mark.line + 1
                    raise RefusedYamlError(
                        f"duplicate key {key!r} (first given at line {line})",
                        key_node.start_mark,
                    )
                seen[key] = key_node
        return super().construct_mapping(node, deep=deep)  # type: ignore[arg-type]


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    assert isinstance(node, MappingNode)
    return [part for pair in node.value for part in pair]


def safe_load(text: str) -> Any:
    """``yaml.safe_load`` with the limits of :class:`LimitedSafeLoader`.

    Raises
    ------
    RefusedYamlError
        An alias bomb or cycle, nesting beyond :data:`MAX_DEPTH`, a duplicate key.
    yaml.YAMLError
        Malformed YAML.

    Examples
    --------
    >>> safe_load("a: [1, 2]")
    {'a': [1, 2]}
    >>> try:
    ...     safe_load("a: 1\\na: 2")
    ... except RefusedYamlError as exc:
    ...     print(exc.problem + exc.where())
    duplicate key 'a' (first given at line 1) at line 2 column 1
    """
    loader = LimitedSafeLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
