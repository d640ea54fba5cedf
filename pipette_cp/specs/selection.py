"""Which GPUs a layout may use: the nodes not excluded, and the GPU totals allowed.

A layout's world size ``dp x pp x tp`` may be below the cluster's GPU count: a
prime node count forces ``pp`` (or ``dp``) to a multiple of it, and a node with a
bad NIC or failed links slows every layout that uses it.  The search therefore
tries the totals of :func:`gpu_totals` and the placement chooses which nodes
hold ranks; ``search_space.exclude_nodes`` takes nodes out by name.
"""

from __future__ import annotations

from pipette_cp.errors import SpecError
from pipette_cp.specs.cluster import ClusterSpec
from pipette_cp.specs.search_space import SearchSpace

#: Default number of whole nodes a layout may leave idle: one per 8 nodes, at least
#: 1 and at most this many (each idle count adds the layouts of one more GPU total).
MAX_DEFAULT_IDLE_NODES = 4


def excluded_nodes(cluster: ClusterSpec, space: SearchSpace) -> tuple[int, ...]:
    """Indices of the nodes ``space.exclude_nodes`` names, in cluster order.

    Raises
    ------
    SpecError
        A name that is no node of the cluster, or every node excluded.
    """
    if not space.exclude_nodes:
        return ()
    index = {name: i for i, name in enumerate(cluster.node_names)}
    for name in space.exclude_nodes:
        if name not in index:
            known = ", ".join(cluster.node_names[:8]) + (", ..." if cluster.num_nodes > 8 else "")
            raise SpecError(
                "search_space.exclude_nodes", name, f"no node of that name (nodes: {known})"
            )
    if len(space.exclude_nodes) >= cluster.num_nodes:
        raise SpecError(
            "search_space.exclude_nodes",
            list(space.exclude_nodes),
            "excludes the only node"
            if cluster.num_nodes == 1
            else f"excludes all {cluster.num_nodes} nodes",
        )
    return tuple(sorted(index[name] for name in space.exclude_nodes))


def usable_gpus(cluster: ClusterSpec, space: SearchSpace) -> int:
    """GPUs on the nodes not excluded."""
    return (cluster.num_nodes - len(excluded_nodes(cluster, space))) * cluster.gpus_per_node


def default_idle_nodes(num_nodes: int) -> int:
    """Whole nodes a layout may leave idle by default: ``num_nodes // 8`` within
    [1, :data:`MAX_DEFAULT_IDLE_NODES`], and never every node."""
    return max(0, min(num_nodes - 1, MAX_DEFAULT_IDLE_NODES, max(1, num_nodes // 8)))


def gpu_totals(cluster: ClusterSpec, space: SearchSpace) -> list[int]:
    """World sizes a layout may have, largest first.

    ``use_all_gpus: true``: the usable GPUs only.  Otherwise every whole-node count
    from ``min_gpus`` (default: :func:`default_idle_nodes` nodes fewer) up to the
    usable GPUs; ``use_all_gpus: false`` adds every total above one node fewer
    (a few GPUs of a node idle).

    Raises
    ------
    SpecError
        ``min_gpus`` above the usable GPUs (see :func:`excluded_nodes` too).
    On 17 nodes of 8 GPUs the default is ``[136, 128, 120]``.
    """
    g, usable = cluster.gpus_per_node, usable_gpus(cluster, space)
    nodes = usable // g
    if space.min_gpus is not None and space.min_gpus > usable:
        raise SpecError(
            "search_space.min_gpus",
            space.min_gpus,
            f"above the {usable} GPUs of the {nodes} node{'s' if nodes != 1 else ''} the "
            "layouts may use",
        )
    if space.use_all_gpus:
        return [usable]
    low = space.min_gpus if space.min_gpus is not None else usable - g * default_idle_nodes(nodes)
    totals = {k * g for k in range(1, nodes + 1) if k * g >= low} | {usable}
    if space.use_all_gpus is False:
        totals |= {t for t in range(max(low, usable - g + 1), usable + 1)}
    return sorted(totals, reverse=True)
