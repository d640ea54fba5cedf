"""``pipette-cp bench --executor ray`` on a local Ray instance (skipped without Ray:
``pip install 'pipette-cp[ray]'``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipette_cp.suite import BenchStore, make_executor, prepare_jobs, run_bench

ray = pytest.importorskip("ray")

TINY = "gpt3-1.3b-nominal-8"


def test_ray_tasks_write_through_the_same_store(tmp_path: Path) -> None:
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        planned = prepare_jobs([TINY], ["greedy", "megatron-default"], time_limits_s=[5.0])
        with BenchStore(tmp_path / "b.sqlite") as store:
            summary = run_bench(planned, store, make_executor("ray"))
            again = run_bench(planned, store, make_executor("ray"))
            rows = store.rows()
    finally:
        ray.shutdown()
    assert sorted(r.method for r in rows) == ["greedy", "megatron-default"]
    assert all(r.solved and r.predictor == "simulator" for r in rows)
    assert len(summary.rows) == 2 and again.rows == [] and again.skipped == 2
