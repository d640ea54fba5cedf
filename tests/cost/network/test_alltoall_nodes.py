"""The expert all-to-all per node pair (:mod:`pipette_cp.cost.network.alltoall_nodes`) against
the pairwise one it replaces where the matrix allows it.

Oracle: :func:`_reference_members_times`, the all-to-all over every ordered pair of every
group as :func:`~pipette_cp.cost.network.parallel_groups.alltoall_times_s` computed it before the
node-level path, kept verbatim; compared on random layouts, placements and byte scales
on healthy, degraded, failed-pair, slow-pair, fail-slow, NVL72 and DGX-1 clusters.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipette_cp.clusters.generators.registry import generate
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.cost.network import collectives as comm
from pipette_cp.cost.network.alltoall_nodes import group_nodes_of, node_blocks, usable_groups
from pipette_cp.cost.network.parallel_groups import alltoall_times_s, expert_members, group_flows
from pipette_cp.errors import InfeasibleError, LayoutError
from pipette_cp.specs import ClusterSpec, Instance, ModelSpec, TrainingSpec
from pipette_cp.specs.layouts import make_plan

GB = 1e9


def _reference_peers(ep: int) -> np.ndarray:
    return (np.arange(ep)[:, None] + 1 + np.arange(ep - 1)[None, :]) % ep


def _reference_members_times(fabric, members, nbytes, remote_scale=1.0):
    """The pairwise all-to-all of every ordered pair, as ``alltoall_times_s`` computed it
    before the node-level path (members: (pp, groups, ep) GPU ids), kept verbatim."""
    pp = members.shape[0]
    if members.shape[-1] <= 1 or nbytes <= 0:
        return np.zeros(pp)
    peer = _reference_peers(members.shape[-1])
    dst = members[..., peer]
    bw = fabric.bandwidth[members[..., None], dst]
    if not bw.all():
        src = np.broadcast_to(members[..., None], dst.shape)
        comm.check_links(fabric, src, dst, "an expert-parallel all-to-all")
    dom, node = fabric.domain_of[members], fabric.node_of[members]
    remote = dom[..., None] != dom[..., peer]
    latency = np.full(members.shape, fabric.intra_node_latency_s)
    if remote.any():
        counts = remote.sum(axis=-1)
        k = np.bincount(node.ravel(), weights=counts.ravel(), minlength=fabric.num_nodes)
        kn = np.maximum(k[node], 1.0)
        share = fabric.nic_capacity_bytes_per_s / np.maximum(kn[..., None], kn[..., peer])
        bw = np.where(remote, np.minimum(bw, share), bw)
        latency[remote.any(axis=-1)] = fabric.inter_node_latency_s
    if fabric.domain_of is not fabric.node_of:
        across = (node[..., None] != node[..., peer]).any(axis=-1)
        latency[across] = fabric.inter_node_latency_s
    t = nbytes / bw
    if not np.isscalar(remote_scale) or remote_scale != 1.0:
        scale = np.broadcast_to(np.asarray(remote_scale, dtype=float)[..., None, None], t.shape)
        t = np.where(remote, t * scale, t)
    serial = np.where(remote, 0.0, t).sum(axis=-1)
    parallel = np.where(remote, t, 0.0).max(axis=-1)
    return (np.maximum(serial, parallel) + latency).reshape(pp, -1).max(axis=1)


def _reference_alltoall(fabric, flat, f, nbytes, remote_scale=1.0):
    return _reference_members_times(fabric, flat[f.ep_groups], nbytes, remote_scale)


def _outcome(fn, *args):
    """(result, None) or (None, message of the InfeasibleError)."""
    try:
        return fn(*args), None
    except InfeasibleError as exc:
        return None, str(exc)


def _with_pairs(cluster, pairs):
    """``cluster`` with the GPU pairs ``(a, b, factor)`` scaled (0: failed), both ways."""
    bw = cluster.bandwidth_bytes_per_s.copy()
    for a, b, factor in pairs:
        bw[a, b] = bw[b, a] = bw[a, b] * factor
    return cluster.model_copy(update={"bandwidth_bytes_per_s": bw})


def _kind(kind: str) -> ClusterSpec:
    """A 64-GPU (8 x 8 H100), 144-GPU (2 NVL72 racks) or 32-GPU (4 DGX-1) cluster."""
    if kind == "healthy":
        return generate("h100-multileaf", nodes=8, seed=3)
    if kind == "degraded":  # two failed and some slow node pairs, each one whole block
        return generate("degraded", nodes=8, seed=1)
    if kind == "failed-pair":  # one failed pair across nodes, one inside a node
        return _with_pairs(
            generate("h100-multileaf", nodes=8, seed=3), [(1, 9, 0.0), (18, 21, 0.0)]
        )
    if kind == "slow-pairs":  # blocks that are no longer constant
        pairs = [(0, 8, 0.3), (3, 5, 0.5), (40, 63, 0.7)]
        return _with_pairs(generate("h100-multileaf", nodes=8, seed=3), pairs)
    if kind == "failslow":
        return generate("failslow", nodes=8, seed=2)
    if kind == "nvl72":  # two racks of 18 trays x 4 GPUs, one slow pair inside a rack
        return _with_pairs(generate("gb200-nvl72", nodes=36, seed=1), [(5, 30, 0.5)])
    if kind == "nvl72-healthy":
        return generate("gb200-nvl72", nodes=36, seed=1)
    assert kind == "v100-cube"  # no constant NVLink block: pairwise throughout
    return generate("v100-cube", nodes=4, seed=1)


def _random_flats(rng, num_gpus: int, used: int, gpus_per_node: int):
    """Megatron's order, a whole-node permutation of it and a random placement."""
    nodes = num_gpus // gpus_per_node
    base = np.arange(used)
    order = rng.permutation(nodes)
    yield base
    yield order[base // gpus_per_node] * gpus_per_node + base % gpus_per_node
    yield rng.permutation(num_gpus)[:used]


KINDS = ["healthy", "degraded", "failed-pair", "slow-pairs", "failslow", "nvl72",
         "nvl72-healthy", "v100-cube"]  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_alltoall_matches_the_pairwise_reference_on_every_cluster_kind(kind):
    cluster = _kind(kind)
    fabric = comm.Fabric.from_cluster(cluster)
    rng = np.random.default_rng(len(kind))
    n, checked, refused = cluster.num_gpus, 0, 0
    for _ in range(30):
        ep = int(rng.choice([2, 4, 8, 16, 32]))
        pp, tp, cp = (int(rng.choice(c)) for c in ([1, 2, 4], [1, 2], [1, 2]))
        etp = None if rng.random() < 0.5 else 1
        per = n // pp
        dp = per // (tp * cp)
        if per % (tp * cp) or per % ep or dp < 1:
            continue
        try:
            plan = make_plan(num_layers=8, dp=dp, pp=pp, tp=tp, cp=cp, ep=ep, etp=etp,
                             micro_batch_size=1, sequence_parallel=tp > 1)  # fmt: skip
            f = group_flows(plan)
        except (LayoutError, ValueError):
            continue
        for flat in _random_flats(rng, n, pp * per, cluster.gpus_per_node):
            flat = flat.astype(np.int64)
            shape = f.ep_groups.shape[:2]
            for scale in (1.0, 0.6, rng.uniform(0.2, 1.0, shape), rng.uniform(0.2, 1, shape[1:])):
                nbytes = float(rng.uniform(1e4, 1e8))
                want, want_err = _outcome(_reference_alltoall, fabric, flat, f, nbytes, scale)
                got, got_err = _outcome(alltoall_times_s, fabric, flat, f, nbytes, scale)
                assert got_err == want_err
                if want is None:
                    refused += 1
                    continue
                assert got.shape == want.shape
                np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
                checked += 1
    assert checked > 20
    if kind in ("degraded", "failed-pair"):
        assert refused > 0  # the failed pairs were met, and named alike


def test_alltoall_matches_the_reference_on_fabrics_in_any_gpu_order():
    """Nodes of unequal size whose GPUs are not numbered node by node, with NVLink
    domains of two nodes: the general path of the node-pair view."""
    rng = np.random.default_rng(11)
    sizes = np.array([4, 2, 4, 1, 3, 2])
    node_of = rng.permutation(np.repeat(np.arange(6), sizes))
    n = node_of.size
    node_bw = rng.uniform(10, 50, (6, 6)) * GB
    node_bw = np.minimum(node_bw, node_bw.T)
    np.fill_diagonal(node_bw, 300 * GB)
    bw = node_bw[node_of[:, None], node_of[None, :]]
    np.fill_diagonal(bw, 0.0)
    for domain_of in (node_of, node_of // 2):
        for matrix in (bw, _scaled(bw, 0, int(np.flatnonzero(node_of == node_of[0])[1]), 0.5)):
            fabric = comm.Fabric(
                bandwidth=matrix, latency=np.zeros((n, n)), node_of=node_of,
                nic_capacity_bytes_per_s=80 * GB, num_nodes=6, intra_node_latency_s=2e-6,
                inter_node_latency_s=7e-6, domain_of=domain_of,
            )  # fmt: skip
            for ep in (4, 8):
                plan = make_plan(num_layers=4, dp=16, pp=1, tp=1, ep=ep, micro_batch_size=1)
                f = group_flows(plan)
                for _ in range(10):
                    flat = rng.permutation(n)[:16].astype(np.int64)
                    scale = rng.uniform(0.2, 1.0, f.ep_groups.shape[:2])
                    got = alltoall_times_s(fabric, flat, f, 3e6, scale)
                    want = _reference_alltoall(fabric, flat, f, 3e6, scale)
                    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


def _scaled(matrix: np.ndarray, a: int, b: int, factor: float) -> np.ndarray:
    out = matrix.copy()
    out[a, b] = out[b, a] = matrix[a, b] * factor
    return out


def test_the_node_pair_view_is_used_only_where_the_matrix_allows_it():
    healthy = _kind("healthy")
    plan = make_plan(num_layers=4, dp=64, pp=1, tp=1, ep=16, micro_batch_size=1)
    f = group_flows(plan)
    flat = np.arange(64, dtype=np.int64)
    members = expert_members(flat, f)  # groups of 16: nodes (0, 1), (2, 3), ...
    blocks = node_blocks(comm.Fabric.from_cluster(healthy))
    assert blocks is not None and blocks.all_usable and blocks.by_node
    groups = group_nodes_of(comm.Fabric.from_cluster(healthy), members)
    assert groups.distinct.tolist() == [2, 2, 2, 2] and (groups.counts == 8).all()
    assert usable_groups(blocks, groups).all()
    # a slow pair inside node 2 and a failed one between nodes 6 and 7: those groups only
    fabric = comm.Fabric.from_cluster(_with_pairs(healthy, [(17, 18, 0.5), (48, 56, 0.0)]))
    blocks = node_blocks(fabric)
    assert blocks is not None and not blocks.all_usable
    assert usable_groups(blocks, group_nodes_of(fabric, members)).tolist() == [
        True, False, True, False,
    ]  # fmt: skip
    with pytest.raises(InfeasibleError, match="48->56") as new:
        alltoall_times_s(fabric, flat, f, 1e6)
    with pytest.raises(InfeasibleError) as old:
        _reference_alltoall(fabric, flat, f, 1e6)
    assert str(new.value) == str(old.value)
    # one GPU on a node with a slow NVLink pair uses no NVLink pair: still node-level
    slow = comm.Fabric.from_cluster(_with_pairs(healthy, [(17, 18, 0.5)]))
    one_each = np.array([8 * i + (1 if i == 2 else 0) for i in range(8)] * 2, dtype=np.int64)
    one_each[8:] += 4
    small = group_flows(make_plan(num_layers=4, dp=16, pp=1, tp=1, ep=8, micro_batch_size=1))
    slow_blocks = node_blocks(slow)
    assert slow_blocks is not None
    assert usable_groups(slow_blocks, group_nodes_of(slow, expert_members(one_each, small))).all()
    # a listed-twice GPU (an unvalidated placement) is costed pairwise, as before
    twice = flat.copy()
    twice[1] = twice[0]
    assert not usable_groups(slow_blocks, group_nodes_of(slow, expert_members(twice, f)))[0]
    with np.errstate(divide="ignore"):  # GPU 0 to itself: bandwidth 0
        got, want = alltoall_times_s(slow, twice, f, 1e6), _reference_alltoall(slow, twice, f, 1e6)
    assert got.tolist() == want.tolist() == [np.inf]
    # no node with constant NVLink pairs, or a node across two domains: no view
    assert node_blocks(comm.Fabric.from_cluster(_kind("v100-cube"))) is None
    split = comm.Fabric(
        bandwidth=np.full((4, 4), 10 * GB) - 10 * GB * np.eye(4), latency=np.zeros((4, 4)),
        node_of=np.array([0, 0, 1, 1]), nic_capacity_bytes_per_s=GB, num_nodes=2,
        domain_of=np.array([0, 1, 2, 2]),
    )  # fmt: skip
    assert node_blocks(split) is None


@pytest.mark.parametrize("dispatcher", ["alltoall", "flex", "allgather"])
@pytest.mark.parametrize("kind", ["healthy", "slow-pairs", "nvl72"])
def test_the_evaluator_prices_expert_groups_as_the_pairwise_reference(
    monkeypatch, dispatcher, kind
):
    """Iteration time and ep_comm of random placements, with the evaluator's all-to-all
    swapped for the pairwise reference: the same to rounding, flex's per-group byte
    scaling included."""
    import pipette_cp.cost.evaluator.expert_groups as groups_module

    cluster = _kind(kind)
    model = ModelSpec(
        name="tiny-moe", num_layers=4, hidden_size=256, num_attention_heads=8,
        ffn_hidden_size=1024, vocab_size=1000, max_seq_length=2048, num_experts=32,
        moe_top_k=4, moe_ffn_hidden_size=512,
    )  # fmt: skip
    n, g = cluster.num_gpus, cluster.gpus_per_node
    training = TrainingSpec(global_batch_size=2 * n, seq_length=1024,
                            moe_token_dispatcher=dispatcher)  # fmt: skip
    inst = Instance(name="t", model=model, cluster=cluster, training=training)
    rng = np.random.default_rng(5)
    new = groups_module.stage_alltoall_times_s

    def reference(fabric, members, pp, nbytes, remote_scale=1.0, nodes=None):
        return _reference_members_times(fabric, members.reshape(pp, -1, members.shape[-1]),
                                        nbytes, remote_scale)  # fmt: skip

    layouts = [(2, 1, 16), (2, 2, 8), (2, 1, 32), (1, 1, 16), (1, 2, 8), (2, 1, 8)]
    layouts = [(pp, tp, ep) for pp, tp, ep in layouts if (n // (pp * tp)) % ep == 0][:3]
    assert len(layouts) == 3
    for pp, tp, ep in layouts:
        plan = make_plan(num_layers=4, dp=n // (pp * tp), pp=pp, tp=tp, ep=ep,
                         micro_batch_size=1, sequence_parallel=tp > 1)  # fmt: skip
        for which, flat in enumerate(_random_flats(rng, n, n, g)):
            if tp > 1 and which == 2:  # a random order of whole units (each inside a node)
                flat = (rng.permutation(n // tp)[:, None] * tp + np.arange(tp)).ravel()
            units = tuple(tuple(int(x) for x in flat[i : i + tp]) for i in range(0, n, tp))
            placed = plan.model_copy(update={"placement": units})
            results = []
            for fn in (new, reference):
                monkeypatch.setattr(groups_module, "stage_alltoall_times_s", fn)
                ev = Evaluator(inst)
                e = ev.evaluate(placed)
                results.append((ev.iteration_time(placed), e.breakdown_s.ep_comm))
            (t_new, ep_new), (t_ref, ep_ref) = results
            assert t_new == pytest.approx(t_ref, rel=1e-12)
            assert ep_new == pytest.approx(ep_ref, rel=1e-12) and ep_ref > 0
