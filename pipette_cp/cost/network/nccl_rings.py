"""The ring NCCL builds over a communicator's ranks, from their rank order alone.

A collective over a group of ranks runs over one NCCL communicator.  PyTorch's
``new_group`` (which Megatron-LM's ``parallel_state`` calls for every data-parallel,
tensor, context and expert group) sorts the group's global ranks, so the
communicator's rank order is the global rank order of its members.  NCCL then builds
its rings from that order alone, not from the network:

1. **Nodes are numbered by their first rank.**  Walking the communicator's ranks in
   order, each host met for the first time becomes the next node (NCCL
   ``src/init.cc``: ``nodesFirstRank`` / ``rankToNode``).
2. **Every ring visits the nodes in that order**, all the ranks of one node together,
   and closes from the last node back to the first (``src/graph/connect.cc``,
   ``connectRings``: node ``n``'s last rank sends to node ``n + 1``'s first).  Each
   channel's ring does so; the channels differ only inside the nodes.
3. **Inside a node** the order comes from NCCL's topology search over the node's
   links (``ncclTopoCompute``).  On a node whose GPUs are linked alike (an NVSwitch
   node) every order is equal; this module keeps the ranks' order there.  A tensor-parallel
   group, which always sits inside one node, takes the search's best ring instead
   (:mod:`pipette_cp.cost.network.tp_rings`).

NCCL's maintainers confirm the rule (github.com/NVIDIA/nccl/issues/1340: asked whether
the nodes' rings are joined in the order of the node list alone, a maintainer answers
that NCCL keeps it simple and does not detect the network topology;
github.com/NVIDIA/nccl/issues/471: NCCL builds flat rings, never a 2-D ring).  Its trees
use the same node numbering (``src/graph/trees.cc``), so a ring in this order and the
trees agree on which node comes first.  A ring therefore differs from "rank ``i`` sends to rank
``i + 1``" exactly when some node's ranks are not consecutive in the group: ranks on
nodes A, B, A, B run as A, A, B, B.

:func:`nccl_rings` applies the rule to many groups at once; :func:`is_node_contiguous`
says whether rank order is already that ring.
"""

from __future__ import annotations

import numpy as np


def nccl_rings(groups: np.ndarray, node_of: np.ndarray) -> np.ndarray:
    """Every row of ``groups`` (GPU ids in the communicator's rank order) reordered into
    the ring NCCL builds: nodes (``node_of[gpu]``) in the order of their first rank, each
    node's GPUs together in rank order.  ``groups`` itself when every row already is.

    >>> import numpy as np
    >>> node_of = np.array([0, 0, 1, 1, 2, 2])
    >>> nccl_rings(np.array([[0, 2, 1, 3], [4, 0, 5, 1]]), node_of).tolist()
    [[0, 1, 2, 3], [4, 5, 0, 1]]
    """
    groups = np.asarray(groups)
    if groups.ndim != 2 or groups.shape[1] <= 2:
        return groups  # two ranks: one ring only
    nodes = node_of[groups]
    if is_node_contiguous(nodes).all():
        return groups
    k, n = groups.shape
    by_node = np.argsort(nodes, axis=1, kind="stable")  # each node's ranks together, in order
    sorted_nodes = np.take_along_axis(nodes, by_node, axis=1)
    starts = np.ones((k, n), dtype=bool)
    starts[:, 1:] = sorted_nodes[:, 1:] != sorted_nodes[:, :-1]
    # the rank at which each member's node first appears (its block's first position)
    block_start = np.maximum.accumulate(np.where(starts, np.arange(n), 0), axis=1)
    first = np.take_along_axis(by_node, block_start, axis=1)
    order = np.take_along_axis(by_node, np.argsort(first, axis=1, kind="stable"), axis=1)
    return np.take_along_axis(groups, order, axis=1)


def is_node_contiguous(nodes: np.ndarray) -> np.ndarray:
    """Per row of ``nodes`` (the node of each rank, in rank order): whether every node's
    ranks are consecutive, so that NCCL's ring is the rank-order ring."""
    nodes = np.atleast_2d(np.asarray(nodes))
    changes = np.count_nonzero(nodes[:, 1:] != nodes[:, :-1], axis=1)
    ordered = np.sort(nodes, axis=1)
    distinct = 1 + np.count_nonzero(ordered[:, 1:] != ordered[:, :-1], axis=1)
    # a sequence over d nodes changes node at least d - 1 times, exactly d - 1 when each
    # node's ranks are one block
    return changes == distinct - 1
