"""Settings for the whole test run (``tests/`` and the package doctests)."""

from __future__ import annotations

import importlib.util
import os

import pytest

# A false "optimal" claim raises in the tests (production downgrades it with a warning).
os.environ["PIPETTE_CP_STRICT_CLAIMS"] = "1"

# The profiler needs the optional PyTorch extra; without it its doctests are skipped.
collect_ignore_glob = [] if importlib.util.find_spec("torch") else ["pipette_cp/profiler/*"]

#: Doctests that run a whole search: the slow lane, as the end-to-end tests.
SLOW_DOCTESTS = frozenset({"pipette_cp.api.solve", "pipette_cp.api.solve_robust"})

#: Most parallel test workers ``-n auto`` starts: searches in the tests start worker
#: processes and local Ray clusters of their own, so more workers than this mostly
#: wait on each other (and on memory).
MAX_TEST_WORKERS = 4


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if isinstance(item, pytest.DoctestItem) and item.name in SLOW_DOCTESTS:
            item.add_marker(pytest.mark.slow)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker per core this process may run on, at most
    :data:`MAX_TEST_WORKERS`."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cores or 1, MAX_TEST_WORKERS))
