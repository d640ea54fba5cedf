"""Where the bundled data lives: ``models/`` and ``instances/`` at the project root.

``PIPETTE_CP_DATA`` overrides the root (for a non-editable install, point it at
a checkout)."""

from __future__ import annotations

import os
from pathlib import Path

DATA_ROOT = Path(os.environ.get("PIPETTE_CP_DATA", Path(__file__).resolve().parents[2]))
MODELS_DIR = DATA_ROOT / "models"
INSTANCES_DIR = DATA_ROOT / "instances"
CLUSTERS_DIR = INSTANCES_DIR / "clusters"
