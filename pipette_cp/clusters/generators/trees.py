"""Generators of hierarchical clusters of any size, registered beside the dense G1-G7.

The dense generators (:mod:`pipette_cp.clusters.generators.registry`) draw a node matrix; these
return a :class:`~pipette_cp.specs.cluster.ClusterSpec` on a
:class:`~pipette_cp.specs.hierarchy.HierarchicalFabric` (levels plus sparse exceptions,
O(nodes + exceptions) memory), sized by ``gpus`` (or ``nodes``) up to 16 million GPUs:

>>> from pipette_cp.clusters.generators.trees import generate_tree
>>> c = generate_tree("fat-tree", gpus=16384, seed=0)
>>> c.name, c.num_gpus, [lv.name for lv in c.fabric.levels]
('fat-tree-16384-s0', 16384, ['leaf', 'pod', 'spine'])
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipette_cp.clusters.generators.fat_tree import fat_tree, fat_tree_cluster
from pipette_cp.clusters.generators.params import integer, number
from pipette_cp.errors import SpecError
from pipette_cp.specs.cluster import ClusterSpec

_XX01 = "xxrjun/nccl-tests-cluster@455de4f example-cluster01 (H100 + NDR per-stream rates)"


@dataclass(frozen=True)
class TreeGeneratorInfo:
    """One registered hierarchical generator.

    Attributes
    ----------
    kind, alias, title : str
        Registry name, short name and one line for listings.
    builder : Callable[..., ClusterSpec]
        ``builder(gpus, seed, **params)``.
    parameters : Callable[..., Any]
        The function whose keyword parameters (after ``gpus`` and ``seed``) are the
        generator's, with their defaults and docstring.
    gpus_per_node : int
        GPUs of every node it builds.
    integers : tuple[str, ...]
        Parameters that take integers (the others take numbers).
    sources : tuple[str, ...]
        Where its numbers come from.
    """

    kind: str
    alias: str
    title: str
    builder: Callable[..., ClusterSpec]
    parameters: Callable[..., Any]
    gpus_per_node: int
    integers: tuple[str, ...]
    sources: tuple[str, ...]

    @property
    def defaults(self) -> dict[str, Any]:
        """Its parameters and their defaults."""
        return {name: p.default
                for name, p in inspect.signature(self.parameters).parameters.items()
                if p.kind is inspect.Parameter.KEYWORD_ONLY}  # fmt: skip


#: The hierarchical generators by kind.
TREE_GENERATORS: dict[str, TreeGeneratorInfo] = {
    "fat-tree": TreeGeneratorInfo(
        "fat-tree",
        "ft",
        "H100 + NDR fat tree of any size (leaf, pod, spine; slow NICs, degraded pairs)",
        fat_tree_cluster,
        fat_tree,
        8,
        ("leaf_nodes", "pod_leaves"),
        (_XX01, "pipette_cp.clusters.generators.fat_tree (spine factor 0.9: an assumption)"),
    )
}
_BY_ALIAS = {info.alias: info for info in TREE_GENERATORS.values()}


def tree_info(kind: Any) -> TreeGeneratorInfo | None:
    """The hierarchical generator called ``kind`` or its alias, or None."""
    key = kind.strip().lower() if isinstance(kind, str) else None
    return (TREE_GENERATORS.get(key) or _BY_ALIAS.get(key)) if key is not None else None


def generate_tree(
    kind: str,
    *,
    seed: int,
    gpus: int | None = None,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    **params: Any,
) -> ClusterSpec:
    """A seeded hierarchical cluster of ``gpus`` GPUs (or ``nodes`` nodes).

    Raises
    ------
    SpecError
        Unknown kind or parameter, a value of the wrong type or out of range, both or
        neither of ``gpus`` and ``nodes``, a ``gpus_per_node`` the kind does not build.
    """
    info = tree_info(kind)
    if info is None:
        kinds = ", ".join(f"{i.kind} ({i.alias})" for i in TREE_GENERATORS.values())
        raise SpecError("generator.kind", kind, f"not a hierarchical generator; known: {kinds}")
    integer("seed", seed, 0)
    g = info.gpus_per_node
    if gpus_per_node is not None and gpus_per_node != g:
        raise SpecError("gpus_per_node", gpus_per_node, f"{info.kind} nodes hold {g} GPUs")
    if (gpus is None) == (nodes is None):
        raise SpecError("gpus", gpus, f"give exactly one of gpus and nodes ({info.kind})")
    if nodes is not None:
        gpus = integer("nodes", nodes, 1) * g
    total = integer("gpus", gpus, g)
    known = info.defaults
    for name, value in params.items():
        at = f"{info.kind}.{name}"
        if name not in known:
            raise SpecError(at, value, f"unknown parameter; known: {', '.join(sorted(known))}")
        if name in info.integers:
            integer(at, value, 1)
        else:
            number(at, value, 0.0, 1.0, open_low=name.endswith("factor"))
    return info.builder(total, seed, **params)


def nodes_of(nodes: int | None, gpus: int | None, gpus_per_node: int) -> int:
    """The nodes a dense generator builds: ``nodes``, or ``gpus`` whole nodes' worth."""
    if gpus is not None:
        if nodes is not None or integer("gpus", gpus, 1) % gpus_per_node:
            raise SpecError("gpus", gpus, f"give nodes or gpus, a multiple of {gpus_per_node} "
                            "GPUs per node")  # fmt: skip
        return gpus // gpus_per_node
    if nodes is None:
        raise SpecError("nodes", None, "missing: give nodes (or gpus)")
    return nodes
