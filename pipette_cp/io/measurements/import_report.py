"""What an nccl-tests import did with every file it was given, in words.

:func:`import_report` says, for a pairwise directory turned into a cluster: the logs
whose table gave the matrix, every file it skipped and why (not a log, no nccl-tests
output), every log it used only in part (its last row cut off) or not at all (an
unreadable table, cut off before any row, the test not run), the node pairs it calls
failed (their run failed: NCCL errors, no result table, corrupted results) and those no
log measures, the logs of other G it did not read for the matrix with what they would
say (their median pair and how many pairs fall below 80 % of it), and where the
intra-node bandwidth and the NIC capacity come from (measured, given or assumed).
:meth:`ImportReport.lines` is what the command prints; :meth:`ImportReport.provenance`
what the cluster file keeps in its ``source``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipette_cp.io.measurements.nccl_tests import NcclLog
from pipette_cp.units import GB

#: A pair below this share of the median pair is counted as degraded in the summaries.
DEGRADED_SHARE = 0.8


@dataclass(frozen=True)
class ImportReport:
    """One import's account (module docstring)."""

    used: int
    gpus_per_test: int
    notes: tuple[tuple[str, str, str], ...]  # (file name, what happened to it, why)
    other_g: tuple[str, ...]  # one line per G not read for the matrix
    failed: tuple[str, ...]  # "a-b: reason" of each failed pair
    intra_node: str
    nic: str

    def lines(self) -> list[str]:
        """One line per fact, skipped and partial files one each."""
        out = [f"read {self.used} G={self.gpus_per_test} pairwise logs for the node matrix"]
        out += [f"{name}: {what}: {why}" for name, what, why in self.notes]
        out += list(self.other_g)
        out += [f"failed pair {f}" for f in self.failed]
        out += [f"intra-node bandwidth: {self.intra_node}", f"NIC capacity: {self.nic}"]
        return out

    def provenance(self) -> str:
        """The account in one paragraph for the cluster file (files by count)."""
        by_kind: dict[str, list[str]] = {}
        for name, what, _ in self.notes:
            by_kind.setdefault(what, []).append(name)
        parts = [f"{self.used} G={self.gpus_per_test} pairwise logs read"]
        parts += [f"{len(names)} {what}: {', '.join(names)}" for what, names in by_kind.items()]
        parts += [f"{len(self.failed)} failed pairs"] if self.failed else []
        parts += [f"intra-node: {self.intra_node}", f"NIC capacity: {self.nic}"]
        return "; ".join(parts)


def other_g_lines(
    logs: Sequence[NcclLog], chosen: int, used: np.ndarray, stats: dict[int, np.ndarray]
) -> tuple[str, ...]:
    """Per G of 2-node logs other than ``chosen``: how many, and what their matrix says
    against the one used (``stats``: each G's node matrix)."""
    out = []
    base = _degraded(used)
    counts = Counter(log.gpus_per_node for log in logs if log.num_nodes == 2)
    for g, n in sorted((g, n) for g, n in counts.items() if g is not None and g != chosen):
        matrix = stats.get(g)
        said = ""
        if matrix is not None:
            median, low, total = _degraded(matrix)
            said = (f"; their median pair {median / GB:.1f} GB/s, {low} of {total} pairs "
                    f"({100 * low / max(total, 1):.1f} %) below {DEGRADED_SHARE:.0%} of it, "
                    f"against {base[1]} ({100 * base[1] / max(base[2], 1):.1f} %) at "
                    f"G={chosen}")  # fmt: skip
        out.append(f"{n} G={g} pairwise logs not read for the matrix (--gpus-per-test {g} "
                   f"reads them: GPU {g - 1} of one node to GPU 0 of the other, NVLink busy)"
                   f"{said}")  # fmt: skip
    bigger = Counter(log.num_nodes for log in logs if (log.num_nodes or 0) > 2)
    out += [f"{n} logs of {k}-node runs not read (they measure no single pair)"
            for k, n in sorted(bigger.items())]  # fmt: skip
    return tuple(out)


def _degraded(matrix: np.ndarray) -> tuple[float, int, int]:
    """Median of the measured pairs, how many fall below the share of it, and how many."""
    upper = matrix[np.triu_indices(len(matrix), k=1)]
    alive = upper[upper > 0]
    if not alive.size:
        return 0.0, 0, int(upper.size)
    median = float(np.median(alive))
    return median, int(np.count_nonzero(upper < DEGRADED_SHARE * median)), int(upper.size)
