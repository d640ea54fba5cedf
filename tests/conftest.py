"""Small instances built directly from specs (no files), shared by the tests."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from pipette_cp.clusters.expand import cluster_from_node_matrix
from pipette_cp.specs import Instance, SearchSpace, TrainingSpec, resolve_gpu
from tests.models import gpt_model

#: the tests folder, its data files, and the repository root
TESTS = Path(__file__).resolve().parent
FIXTURES = TESTS / "fixtures"
ROOT = TESTS.parent

# ``HYPOTHESIS_PROFILE=fuzz pytest tests/property/test_search.py tests/property/test_evaluator.py tests/property/test_inputs.py``: the long
# fuzzing run (tests/property/strategies.py multiplies its example counts under this profile).
settings.register_profile(
    "fuzz",
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    print_blob=True,
)
# The test run's own profile: the same examples on every run and machine (a test that
# passes passes again; a counterexample found by the fuzzing run becomes a pinned case).
settings.register_profile("repeatable", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


def small_instance(
    nodes: int = 2,
    gpus_per_node: int = 4,
    layers: int = 8,
    node_bandwidth: np.ndarray | None = None,
    gpu: str = "a100",
    global_batch_size: int = 16,
) -> Instance:
    """A GPT-like 8-layer model on ``nodes`` x ``gpus_per_node`` A100s."""
    model = gpt_model("small-gpt", layers, 1024, 16, vocab_size=32000, max_seq_length=1024)
    matrix = node_bandwidth if node_bandwidth is not None else np.full((nodes, nodes), 20e9)
    cluster = cluster_from_node_matrix(
        node_bandwidth=matrix,
        intra_node=150e9,
        gpus_per_node=gpus_per_node,
        gpu=resolve_gpu(gpu),
        nics_per_node=gpus_per_node,
        nic_bandwidth_bytes_per_s=25e9,
        name=f"test-{nodes}x{gpus_per_node}",
    )
    training = TrainingSpec(global_batch_size=global_batch_size, seq_length=1024)
    return Instance(
        name="small", model=model, cluster=cluster, training=training, search_space=SearchSpace()
    )


@pytest.fixture
def instance() -> Instance:
    return small_instance()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary folder with a short path of fixed length: error messages cut long values
    at 80 characters, so a message naming a file here does not depend on the test's name or
    on the worker running it."""
    with tempfile.TemporaryDirectory(prefix="t") as folder:
        yield Path(folder)
