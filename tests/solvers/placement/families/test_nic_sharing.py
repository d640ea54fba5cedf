"""NIC sharing: hops, embedding pairs and DP rings leaving a node share its NICs (the
master's counts of flows per node give the Evaluator's concurrent flows)."""

from __future__ import annotations

import numpy as np
import pytest

from pipette_cp.solvers.placement.families.dp_rings import DataParallelRings
from pipette_cp.solvers.placement.families.embedding import TiedEmbedding
from pipette_cp.solvers.placement.families.hops import PipelineHops
from pipette_cp.solvers.placement.families.nic_sharing import NicSharing
from pipette_cp.specs.layouts import make_plan
from tests.conftest import small_instance
from tests.solvers.placement.families.harness import verify

#: three nodes of two GPUs, one 25 GB/s NIC each (links at 100 GB/s: the NIC is the limit)
BASE = small_instance(nodes=3, gpus_per_node=2, node_bandwidth=np.full((3, 3), 100e9))
CLUSTER = BASE.cluster.model_copy(update={"nics_per_node": 1})
INSTANCE = BASE.model_copy(update={"cluster": CLUSTER})
PLAN = make_plan(num_layers=8, dp=2, pp=2, tp=1, micro_batch_size=1)
FAMILIES = (PipelineHops(), DataParallelRings(), TiedEmbedding(), NicSharing())


def test_two_hops_leaving_one_node_take_half_its_nic_each() -> None:
    verifier = verify(INSTANCE, PLAN, *FAMILIES)
    data = verifier.data
    pinned = verifier.given([0, 0, 1, 1])  # stage 0 on node 0, stage 1 on node 1
    hop = pinned.reads()[data.xi.hf[0]]
    lat = INSTANCE.cluster.inter_node_latency_s
    assert hop == pytest.approx(lat + data.act_bytes * 2 / data.nic_capacity, rel=1e-12)
    read = pinned.costs()
    # without the NIC counts the master prices each flow at a whole NIC: too low
    _, alone = verify(INSTANCE, PLAN, *FAMILIES[:3]).given([0, 0, 1, 1]).solve("cpsat")
    assert alone is not None and alone < read - data.act_bytes / data.nic_capacity / 2


def test_every_placement_reads_the_evaluators_shares() -> None:
    verifier = verify(INSTANCE, PLAN, *FAMILIES)
    for pinned in verifier.assignments(8):
        pinned.costs()
