"""``python -m pipette_cp.experiments.models.modern_runs``: the report."""

from pipette_cp.experiments.models.modern_runs.report import main

if __name__ == "__main__":
    raise SystemExit(main())
