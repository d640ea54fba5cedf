"""The plan of a cluster measurement: which node pairs run together, the tests of each
and the names of their logs (:func:`plan_measurement`); the script that runs it is
written by :mod:`pipette_cp.io.measurements.measure_script`.

A round-robin tournament (the circle method, :func:`round_robin`) splits the node
pairs into rounds of disjoint pairs: n - 1 rounds for even n and n for odd n (one
node sits out each round), the minimum, as a round holds at most floor(n / 2) pairs.
The log names are those :data:`pipette_cp.io.measurements.nccl_tests.LOG_NAME` reads back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipette_cp.errors import SpecError
from pipette_cp.io.hostfile import Host, common_slots
from pipette_cp.io.measurements.nccl_tests import LOG_NAME

TOOLS = ("nccl-tests", "mpigraph")
LAUNCHERS = ("slurm", "mpirun")
#: The nccl-tests binaries (``<name>_perf``) a plan may run.
COLLECTIVES = (
    "sendrecv", "all_reduce", "alltoall", "all_gather", "reduce_scatter", "broadcast",
    "reduce", "gather", "scatter", "hypercube",
)  # fmt: skip


def round_robin(nodes: Sequence[str]) -> list[list[tuple[str, str]]]:
    """Rounds of disjoint node pairs covering every pair exactly once (circle method).

    Node 0 stays put while the others rotate one place per round; an odd count
    gets a bye (the node paired with it sits the round out).  Each pair is
    ordered as the nodes are in ``nodes``.

    Returns
    -------
    list of rounds
        n - 1 rounds of n / 2 pairs for even n, n rounds of (n - 1) / 2 for odd n.

    Examples
    --------
    >>> round_robin(["a", "b", "c", "d"])
    [[('a', 'd'), ('b', 'c')], [('a', 'c'), ('b', 'd')], [('a', 'b'), ('c', 'd')]]
    """
    names = list(nodes)
    if len(set(names)) != len(names):
        raise SpecError("nodes", names, "node names must be distinct")
    order = {name: i for i, name in enumerate(names)}
    slots: list[str | None] = [*names, None] if len(names) % 2 else list(names)
    m = len(slots)
    rounds: list[list[tuple[str, str]]] = []
    for _ in range(m - 1):
        pairs = []
        for i in range(m // 2):
            a, b = slots[i], slots[m - 1 - i]
            if a is not None and b is not None:
                pairs.append((a, b) if order[a] < order[b] else (b, a))
        rounds.append(sorted(pairs, key=lambda p: order[p[0]]))
        slots = [slots[0], slots[-1], *slots[1:-1]]
    return rounds


def pair_log_name(a: str, b: str, gpus: int) -> str:
    """``nccl_N2_G<gpus>_<a>_<b>.log``."""
    return f"nccl_N2_G{gpus}_{a}_{b}.log"


def single_log_name(node: str, gpus: int) -> str:
    """``nccl_N1_G<gpus>_<node>.log``."""
    return f"nccl_N1_G{gpus}_{node}.log"


@dataclass(frozen=True)
class MeasurePlan:
    """What the script runs: rounds of node pairs, the tests of each, the log names."""

    hosts: tuple[str, ...]
    gpus_per_node: int
    tool: str
    launcher: str
    collectives: tuple[str, ...]
    gpus_per_test: tuple[int, ...]
    single_node: bool
    rounds: tuple[tuple[tuple[str, str], ...], ...]

    @property
    def num_pairs(self) -> int:
        return sum(len(r) for r in self.rounds)

    def pair_logs(self) -> list[tuple[str, tuple[str, str], int]]:
        """``(file name, (node a, node b), G)`` of every pairwise log, round by round."""
        if self.tool != "nccl-tests":
            return []
        return [
            (pair_log_name(a, b, g), (a, b), g)
            for pairs in self.rounds
            for a, b in pairs
            for g in self.gpus_per_test
        ]

    def single_logs(self) -> list[tuple[str, str, int]]:
        """``(file name, node, G)`` of every single-node log."""
        if self.tool != "nccl-tests" or not self.single_node:
            return []
        return [(single_log_name(h, self.gpus_per_node), h, self.gpus_per_node) for h in self.hosts]

    @property
    def num_tests(self) -> int:
        """nccl-tests runs (one binary on one pair or node at one G); 1 for mpiGraph."""
        if self.tool == "mpigraph":
            return 1
        return (len(self.pair_logs()) + len(self.single_logs())) * len(self.collectives)


def plan_measurement(
    hosts: Sequence[Host | str],
    *,
    gpus_per_node: int | None = None,
    tool: str = "nccl-tests",
    launcher: str = "slurm",
    collectives: Sequence[str] = ("sendrecv",),
    gpus_per_test: Sequence[int] = (1,),
    single_node: bool = True,
) -> MeasurePlan:
    """The measurement plan of a cluster (module doc).

    Parameters
    ----------
    hosts : Host or str sequence
        In hostfile order (:func:`~pipette_cp.io.hostfile.read_hostfile`).
    gpus_per_node : int, optional
        Default: the hosts' common slot count, else 8.
    tool, launcher : str
        One of :data:`TOOLS`, :data:`LAUNCHERS`.
    collectives : str sequence
        nccl-tests binaries without ``_perf`` (:data:`COLLECTIVES`), run in this
        order into each log; ``sendrecv`` is what the importer reads.
    gpus_per_test : int sequence
        The G of the pairwise runs (the importer reads G=1 by default; the
        largest G of ``alltoall`` runs gives the NICs' capacity under load).
    single_node : bool
        Add a round of single-node runs with all ``gpus_per_node`` GPUs.

    Raises
    ------
    SpecError
        An unknown tool, launcher or collective, a G outside 1..gpus_per_node,
        hosts with different slot counts, fewer than two hosts.
    """
    items = [h if isinstance(h, Host) else Host(str(h), None, i + 1) for i, h in enumerate(hosts)]
    names = tuple(h.name for h in items)
    if len(names) < 2:
        raise SpecError("hosts", list(names), "need at least two nodes to measure pairs")
    if tool not in TOOLS:
        raise SpecError("--tool", tool, f"expected one of {', '.join(TOOLS)}")
    if launcher not in LAUNCHERS:
        raise SpecError("--launcher", launcher, f"expected one of {', '.join(LAUNCHERS)}")
    g = gpus_per_node if gpus_per_node is not None else common_slots(items)
    if isinstance(g, bool) or not isinstance(g, int) or g < 1:
        raise SpecError("--gpus-per-node", g, "expected a positive integer")
    binaries = tuple(dict.fromkeys(_collective(c) for c in collectives))
    if not binaries:
        raise SpecError("--collectives", list(collectives), "name at least one collective")
    tests = tuple(sorted(set(gpus_per_test)))
    bad = [t for t in tests if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= g]
    if not tests or bad:
        raise SpecError("--gpus-per-test", list(gpus_per_test), f"expected values in 1..{g}")
    rounds = tuple(tuple(r) for r in round_robin(names))
    plan = MeasurePlan(names, g, tool, launcher, binaries, tests, single_node and g > 1, rounds)
    assert all(LOG_NAME.match(name) for name, _, _ in plan.pair_logs())
    return plan


def _collective(name: str) -> str:
    base = name.strip().removesuffix("_perf")
    if base not in COLLECTIVES:
        raise SpecError("--collectives", name, f"expected some of {', '.join(COLLECTIVES)}")
    return f"{base}_perf"
