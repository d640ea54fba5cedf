"""The tied-embedding all-reduce between the first and the last stage of a replica."""

from __future__ import annotations

import numpy as np
import pytest

from pipette_cp.solvers.placement.families.embedding import TiedEmbedding
from pipette_cp.specs.layouts import make_plan
from tests.conftest import small_instance
from tests.solvers.placement.families.harness import verify

MATRIX = np.array([[0, 5, 10], [5, 0, 20], [10, 20, 0]]) * 1e9
INSTANCE = small_instance(nodes=3, gpus_per_node=1, node_bandwidth=MATRIX)


def test_the_first_and_last_stage_sync_their_embedding() -> None:
    assert INSTANCE.model.tied_embeddings
    plan = make_plan(num_layers=8, dp=1, pp=3, tp=1, micro_batch_size=1)
    verifier = verify(INSTANCE, plan, TiedEmbedding())
    data, lat = verifier.data, INSTANCE.cluster.inter_node_latency_s
    expected = data.emb_bytes / 5e9 + 2 * lat  # stages 0 and 2 on nodes 0 and 1
    assert verifier.given([0, 2, 1]).costs(expected) == pytest.approx(expected)
    for pinned in verifier.assignments(4):
        pinned.costs()


def test_untied_or_one_stage_has_no_input() -> None:
    untied = INSTANCE.model_copy(
        update={"model": INSTANCE.model.model_copy(update={"tied_embeddings": False})}
    )
    plan = make_plan(num_layers=8, dp=1, pp=3, tp=1, micro_batch_size=1)
    assert verify(untied, plan, TiedEmbedding()).data.xi.size == 0
    one = make_plan(num_layers=8, dp=3, pp=1, tp=1, micro_batch_size=1)
    assert verify(INSTANCE, one, TiedEmbedding()).data.xi.size == 0
