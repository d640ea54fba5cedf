"""What an :class:`~pipette_cp.cost.evaluator.evaluate.Evaluator` keeps between plans: the
fabric of each recent cluster, and a memo of the costs that depend on a plan's knobs but
not its placement (shared with the evaluator's data-parallel and expert-group parts)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from pipette_cp.cost.network import collectives as comm
from pipette_cp.specs.cluster import ClusterSpec

T = TypeVar("T")

#: The fabrics of the last few clusters evaluated (a search builds many evaluators of one
#: cluster; the arrays are read-only), keyed by identity, holding the cluster itself so
#: that its id cannot be reused while cached.
_FABRICS: dict[int, tuple[ClusterSpec, comm.Fabric]] = {}


def fabric_of(cluster: ClusterSpec) -> comm.Fabric:
    """``cluster``'s :class:`~pipette_cp.cost.network.collectives.Fabric`, built once for
    the last four clusters."""
    found = _FABRICS.get(id(cluster))
    if found is not None and found[0] is cluster:
        return found[1]
    fabric = comm.Fabric.from_cluster(cluster)
    if len(_FABRICS) >= 4:
        _FABRICS.pop(next(iter(_FABRICS)))
    _FABRICS[id(cluster)] = (cluster, fabric)
    return fabric


class KnobMemo:
    """Values made once per key (a tuple naming what is cached and the plan's knobs), all
    dropped together past ``limit`` entries; the values are read-only by convention.

    >>> memo = KnobMemo()
    >>> memo.get(("answer",), lambda: 42), memo.get(("answer",), lambda: 0)
    (42, 42)
    >>> ("answer",) in memo, ("other",) in memo
    (True, False)
    """

    def __init__(self, limit: int = 4096) -> None:
        self._values: dict[tuple[Hashable, ...], Any] = {}
        self._limit = limit

    def get(self, key: tuple[Hashable, ...], make: Callable[[], T]) -> T:
        """The value under ``key``, made by ``make()`` the first time."""
        if (value := self._values.get(key)) is None:
            if len(self._values) > self._limit:
                self._values.clear()
            value = self._values[key] = make()
        return value

    def __contains__(self, key: tuple[Hashable, ...]) -> bool:
        return key in self._values
