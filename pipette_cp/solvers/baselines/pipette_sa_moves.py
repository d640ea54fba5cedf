"""The five neighbourhood moves of Pipette's annealer (``MetaHeuristics.get_neighbors``).

Each move rearranges a node permutation in place with one ``random.Random``, with
Pipette's index conventions (``two_opt``, ``insert``, ``swap``, ``insert_route``,
``insert_reversed`` of ``mh_simulated_annealing_opt.py``, re-implemented, not copied);
:data:`MOVES` lists them in Pipette's order, and
:func:`~pipette_cp.solvers.baselines.pipette_sa.anneal` picks one uniformly per iteration.
"""

from __future__ import annotations

import random
from collections.abc import Callable


def _two_opt(state: list[int], rng: random.Random) -> None:
    """Reverse ``state[i:j]`` (``MetaHeuristics.two_opt``)."""
    i, j = sorted(rng.sample(range(len(state)), 2))
    state[i:j] = state[i:j][::-1]


def _insert(state: list[int], rng: random.Random) -> None:
    """Move the node at position j to position i (``MetaHeuristics.insert``)."""
    i, j = rng.sample(range(len(state)), 2)
    node = state.pop(j)
    state.insert(i, node)


def _swap(state: list[int], rng: random.Random) -> None:
    """Exchange positions i and j (``MetaHeuristics.swap``)."""
    i, j = rng.sample(range(len(state)), 2)
    state[i], state[j] = state[j], state[i]


def _cut_route(state: list[int], rng: random.Random) -> tuple[list[int], int]:
    n = len(state)
    i, j = sorted((rng.randrange(n), rng.randrange(n)))
    route = state[i:j]
    del state[i:j]
    return route, rng.randrange(n)


def _insert_route(state: list[int], rng: random.Random) -> None:
    """Cut ``state[i:j]`` and re-insert it at a random position (``insert_route``).

    One ``list.insert`` per node, last node first, as Pipette: a position past
    the shortened list appends, which then reverses the route.
    """
    route, at = _cut_route(state, rng)
    for node in route[::-1]:
        state.insert(at, node)


def _insert_reversed(state: list[int], rng: random.Random) -> None:
    """As :func:`_insert_route`, first node first (``insert_reversed``)."""
    route, at = _cut_route(state, rng)
    for node in route:
        state.insert(at, node)


#: Pipette's ``local_search`` list, in its order.
MOVES: tuple[Callable[[list[int], random.Random], None], ...] = (
    _two_opt,
    _insert,
    _swap,
    _insert_route,
    _insert_reversed,
)
