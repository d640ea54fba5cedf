"""Settings for the whole test run (``tests/`` and the package doctests)."""

from __future__ import annotations

import importlib.util
import os

# A false "optimal" claim raises in the tests (production downgrades it with a warning).
os.environ["PIPETTE_CP_STRICT_CLAIMS"] = "1"

# The profiler needs the optional PyTorch extra; without it its doctests are skipped.
collect_ignore_glob = [] if importlib.util.find_spec("torch") else ["pipette_cp/profiler/*"]
