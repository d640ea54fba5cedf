"""Hybrid Mamba-Transformer models (Nemotron-H / Nemotron 3) through every cost model.

Oracles: the published parameter counts of Nemotron 3 Nano; hand counts of the Mamba-2
mixer's GEMMs; chunk times and stage memory rebuilt layer by layer from the per-symbol
functions; the evaluator against the split solver's answer.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipette_cp.checker.checks import check_memory_limit
from pipette_cp.clusters.expand import cluster_from_node_matrix
from pipette_cp.cost.compute.model_chunks import chunk_times, layer_times
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.cost.evaluator.layout_rules import check_knobs
from pipette_cp.cost.memory.hybrid_activations import hybrid_kept_bytes
from pipette_cp.cost.memory.peak import memory_by_stage
from pipette_cp.cost.workload.flops import (
    SSD_CHUNK,
    mamba_projection_gemms,
    model_flops_per_iteration,
    ssd_gemms,
)
from pipette_cp.cost.workload.parameters import stage_param_split
from pipette_cp.errors import LayoutError
from pipette_cp.solvers.split.solve import solve_split
from pipette_cp.specs import Instance, TrainingSpec, resolve_gpu
from pipette_cp.specs.layouts import make_plan
from pipette_cp.specs.model import ModelSpec
from pipette_cp.units import GB

#: Nemotron 3 Nano as Megatron-Bridge's ``Nemotron3NanoProvider`` builds it.
NANO = ModelSpec(
    name="nemotron-3-nano", num_layers=52, hidden_size=2688, num_attention_heads=32,
    num_kv_heads=2, head_dim=128, ffn_hidden_size=1856, vocab_size=131072,
    activation="squared_relu", norm="rmsnorm", position_embedding="rope", linear_bias=False,
    tied_embeddings=False, max_seq_length=262144,
    hybrid_pattern="MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
    mamba_num_heads=64, mamba_head_dim=64, num_experts=128, moe_top_k=6,
    moe_ffn_hidden_size=1856, num_shared_experts=1, shared_expert_ffn_hidden_size=3712,
    moe_router_expert_bias=True,
)  # fmt: skip
#: A small hybrid with every symbol.
SMALL = ModelSpec(
    name="small-hybrid", num_layers=8, hidden_size=512, num_attention_heads=8, num_kv_heads=4,
    ffn_hidden_size=1024, vocab_size=32000, activation="squared_relu", norm="rmsnorm",
    position_embedding="rope", linear_bias=False, max_seq_length=2048,
    hybrid_pattern="M*-EMM*E", mamba_num_heads=16, mamba_head_dim=64, mamba_state_dim=64,
    mamba_num_groups=4, num_experts=8, moe_top_k=2, moe_ffn_hidden_size=512,
)  # fmt: skip


def instance(model: ModelSpec, gbs: int = 16, nodes: int = 2) -> Instance:
    cluster = cluster_from_node_matrix(
        node_bandwidth=np.full((nodes, nodes), 40 * GB), intra_node=300 * GB, gpus_per_node=8,
        gpu=resolve_gpu("h100-sxm"), nics_per_node=8, nic_bandwidth_bytes_per_s=50 * GB,
    )  # fmt: skip
    training = TrainingSpec(global_batch_size=gbs, seq_length=2048)
    return Instance(name="hybrid", model=model, cluster=cluster, training=training)


def test_nemotron_3_nano_parameters_match_the_model_card() -> None:
    # NVIDIA's model card: 31.6B total, 3.6B active including embeddings
    assert NANO.total_params == pytest.approx(31.6e9, rel=0.005)
    assert NANO.active_params == pytest.approx(3.6e9, rel=0.02)


def test_mamba_mixer_parameters_by_hand() -> None:
    h, heads, p, n, g = 512, 16, 64, 64, 4
    inner = heads * p
    in_proj = h * (2 * inner + 2 * g * n + heads)
    conv = (inner + 2 * g * n) * (4 + 1)
    expected = h + in_proj + conv + 3 * heads + inner + inner * h  # pre-norm first
    assert SMALL.hybrid_layer_params("M") == expected


def test_mamba_gemms_by_hand() -> None:
    tokens, tp = 4096, 2
    in_proj, out_proj = mamba_projection_gemms(SMALL, tokens, tp)
    assert (in_proj.m, in_proj.n, in_proj.k) == (tokens, (2 * 1024 + 2 * 4 * 64 + 16) // 2, 512)
    assert (out_proj.m, out_proj.n, out_proj.k) == (tokens, 512, 1024 // 2)
    scan = ssd_gemms(SMALL, 2048, 2, tp)
    chunks = 2 * 2048 // SSD_CHUNK
    # C B^T per chunk and group; the three per-head products
    assert [g.batch for g in scan] == [chunks * 4 // 2] + [chunks * 16 // 2] * 3
    per_token = sum(g.flops for g in scan) / (2 * 2048)
    q = SSD_CHUNK
    assert per_token == pytest.approx((2 * q * 64 * 4 + 2 * 64 * 16 * (q + 2 * 64)) / tp)


def test_chunk_times_sum_the_sublayers_layer_by_layer() -> None:
    inst = instance(SMALL)
    plan = make_plan(num_layers=8, dp=2, pp=2, tp=2, ep=2, micro_batch_size=1,
                     sequence_parallel=True, layer_split=(3, 5))  # fmt: skip
    gpu = resolve_gpu("h100-sxm")
    times = chunk_times(SMALL, inst.training, gpu, plan, 300 * GB)
    per = {k: layer_times(SMALL, inst.training, gpu, plan, 300 * GB, symbol=k) for k in "M*-E"}
    first = sum(per[k].forward_s for k in "M*-")
    second = sum(per[k].forward_s for k in "EMM*E")
    # the embedding and the head are the boundary chunks' extras
    boundary = chunk_times(SMALL, inst.training, gpu, plan.model_copy(
        update={"layer_split": (3, 5)}), 300 * GB)  # fmt: skip
    assert times.forward_s[0] - first == pytest.approx(boundary.forward_s[0] - first)
    assert times.forward_s[0] > first and times.forward_s[1] > second
    moved = chunk_times(SMALL, inst.training, gpu, plan.model_copy(
        update={"layer_split": (4, 4)}), 300 * GB)  # fmt: skip
    # moving the E layer from stage 1 to stage 0 moves exactly its time
    assert moved.forward_s[0] - times.forward_s[0] == pytest.approx(per["E"].forward_s)
    assert times.forward_s[1] - moved.forward_s[1] == pytest.approx(per["E"].forward_s)


def test_stage_parameters_add_up_to_the_model() -> None:
    plan = make_plan(num_layers=8, dp=1, pp=2, tp=1, micro_batch_size=1, layer_split=(5, 3))
    held = sum(sum(stage_param_split(SMALL, plan, s)) for s in range(2))
    # pp > 1 keeps the untied head on the last stage; tied: a second copy of the embedding
    assert held == SMALL.total_params + SMALL.vocab_size * SMALL.hidden_size


def test_recomputation_never_raises_memory() -> None:
    inst = instance(SMALL)
    for recompute in ("none", "selective", "full"):
        plan = make_plan(num_layers=8, dp=4, pp=2, tp=2, ep=2, micro_batch_size=2,
                         sequence_parallel=True, recompute=recompute)  # fmt: skip
        for k in "M*-E":
            kept = hybrid_kept_bytes(SMALL, inst.training, plan, k)
            none = hybrid_kept_bytes(SMALL, inst.training, plan.model_copy(
                update={"recompute": "none"}), k)  # fmt: skip
            assert 0 < kept <= none
    full = make_plan(num_layers=8, dp=4, pp=2, tp=2, ep=2, micro_batch_size=2,
                     sequence_parallel=True, recompute="full")  # fmt: skip
    bare = full.model_copy(update={"recompute": "none"})
    for a, b in zip(memory_by_stage(SMALL, inst.training, full),
                    memory_by_stage(SMALL, inst.training, bare), strict=True):  # fmt: skip
        assert a.activations < b.activations


def test_model_flops_count_every_sublayer() -> None:
    training = TrainingSpec(global_batch_size=1, seq_length=2048)
    attention_free = SMALL.model_copy(update={"hybrid_pattern": "M-M-EMEM"})
    # swapping two attention layers for a Mamba and an MLP changes only their FLOPs
    assert model_flops_per_iteration(SMALL, training) != model_flops_per_iteration(
        attention_free, training)  # fmt: skip
    assert model_flops_per_iteration(NANO, training) > 6 * 3.0e9 * 2048


@pytest.mark.parametrize(
    ("update", "field"),
    [({"cp": 2}, "plan.cp"), ({"tp": 8, "dp": 2, "ep": 2}, "plan.tp"),
     ({"offload_modules": ("core_attn",)}, "plan.offload_modules")],
)  # fmt: skip
def test_what_hybrids_are_not_priced_under_is_refused(update: dict, field: str) -> None:
    fields = {"dp": 4, "pp": 2, "tp": 2, "ep": 2, "micro_batch_size": 1} | update
    plan = make_plan(num_layers=8, sequence_parallel=fields["tp"] > 1, **fields)
    with pytest.raises(LayoutError) as error:
        check_knobs(instance(SMALL), plan)
    assert error.value.field == field


def test_split_solver_claims_no_optimum_and_returns_a_fitting_split() -> None:
    inst = instance(SMALL, gbs=32)
    plan = make_plan(num_layers=8, dp=4, pp=4, tp=1, ep=4, micro_batch_size=1)
    result = solve_split(inst, plan)
    assert result.status == "feasible" and result.bound_s is None
    solved = plan.model_copy(update={"layer_split": result.split})
    assert not check_memory_limit(inst, solved)
    ev = Evaluator(inst, validate=False)
    assert result.objective_s == pytest.approx(ev.iteration_time(solved))
    assert result.objective_s <= ev.iteration_time(plan) * (1 + 1e-12)  # the even split


# ------------------------------------------------------------ LatentMoE, hybrid MTP
LATENT = SMALL.model_copy(update={"moe_latent_size": 128})


def test_nemotron_3_super_parameters_match_the_model_card() -> None:
    from pipette_cp.io.model_file import load_model

    sup = load_model("nemotron-3-super")
    bare = ModelSpec.model_validate(
        sup.model_dump() | {"mtp_layers": 0, "mtp_hybrid_pattern": None}
    )
    # NVIDIA's "120B-A12B" (the multi-token prediction blocks not counted)
    assert bare.total_params == pytest.approx(120e9, rel=0.01)
    assert bare.active_params - bare.embedding_params - bare.output_params == pytest.approx(
        12e9, rel=0.03
    )
    # each block: attention and a LatentMoE sublayer, eh_proj and three norms
    h = sup.hidden_size
    block = sup.hybrid_layer_params("*") + sup.hybrid_layer_params("E") + 2 * h * h + 3 * h
    assert sup.total_params - bare.total_params == 2 * block


def test_latent_moe_narrows_the_experts_and_the_dispatch() -> None:
    from pipette_cp.cost.compute.layer_work import expert_gemms, latent_gemms
    from pipette_cp.cost.workload.tokens import dispatch_bytes

    plan = make_plan(num_layers=8, dp=4, pp=1, tp=1, ep=4, micro_batch_size=1)
    training = TrainingSpec(global_batch_size=16, seq_length=2048)
    assert dispatch_bytes(LATENT, training, plan) == pytest.approx(
        dispatch_bytes(SMALL, training, plan) * 128 / 512)  # fmt: skip
    fc1, fc2 = expert_gemms(LATENT, training, plan)
    assert fc1.k == 128 and fc2.n == 128
    down, up = latent_gemms(LATENT, training, plan)
    assert (down.n, down.k, up.n, up.k) == (128, 512, 512, 128)
    # experts of width w over the latent, and the two projections
    width = SMALL.expert_width
    assert LATENT.expert_params == 2 * 128 * width
    moe = LATENT.hybrid_layer_params("E") - SMALL.hybrid_layer_params("E")
    assert moe == 8 * 2 * width * (128 - 512) + 2 * 512 * 128


def test_hybrid_mtp_block_is_its_pattern() -> None:
    with_mtp = SMALL.model_copy(update={"mtp_layers": 1, "mtp_hybrid_pattern": "*E"})
    with_mtp = ModelSpec.model_validate(with_mtp.model_dump())
    inst = instance(with_mtp)
    plan = make_plan(num_layers=8, dp=4, pp=2, tp=1, ep=4, micro_batch_size=1)
    gpu = resolve_gpu("h100-sxm")
    extra = chunk_times(with_mtp, inst.training, gpu, plan, 300 * GB).forward_s[-1]
    extra -= chunk_times(SMALL, inst.training, gpu, plan, 300 * GB).forward_s[-1]
    block = sum(layer_times(SMALL, inst.training, gpu, plan, 300 * GB, symbol=k).forward_s
                for k in "*E")  # fmt: skip
    assert extra > block  # the block, eh_proj, norms and the extra head
    params = stage_param_split(with_mtp, plan, 1)[0] - stage_param_split(SMALL, plan, 1)[0]
    assert params > SMALL.hybrid_layer_params("*")


@pytest.mark.parametrize(
    ("update", "message"),
    [({"moe_latent_size": 512}, "below hidden_size"),
     ({"mtp_layers": 1}, "needs mtp_hybrid_pattern"),
     ({"mtp_layers": 1, "mtp_hybrid_pattern": "M"}, "Mamba layers in the multi-token"),
     ({"mtp_hybrid_pattern": "*E"}, "without mtp_layers")],
)  # fmt: skip
def test_latent_and_mtp_rules(update: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelSpec.model_validate(SMALL.model_dump() | update)


def test_named_recompute_modules_act_on_the_sublayers_that_have_them() -> None:
    inst = instance(SMALL)
    gpu = resolve_gpu("h100-sxm")
    base = make_plan(num_layers=8, dp=4, pp=2, tp=2, ep=2, micro_batch_size=2,
                     sequence_parallel=True, recompute="selective")  # fmt: skip
    named = base.model_copy(update={"recompute_modules": ("moe", "layernorm", "core_attn", "mlp")})
    for k in "M*-E":
        kept = hybrid_kept_bytes(SMALL, inst.training, named, k)
        default = hybrid_kept_bytes(SMALL, inst.training, base, k)
        assert kept <= default
        if k in "-E":  # their modules are recomputed: less kept, more backward
            assert kept < default
            t_named = layer_times(SMALL, inst.training, gpu, named, 300 * GB, symbol=k)
            t_default = layer_times(SMALL, inst.training, gpu, base, 300 * GB, symbol=k)
            assert t_named.recompute_s > t_default.recompute_s
        else:  # a Mamba mixer has no module; attention recomputes its core either way
            assert kept == default
    moe_only = base.model_copy(update={"recompute_modules": ("moe",)})
    from pipette_cp.cost.workload.tokens import rank_tokens

    # the MoE block recomputed keeps its input (2 B x h per routed token) beside the
    # sublayer's pre-norm input and residual dropout mask (2 + 1 B x h per token, split
    # over tp by sequence parallelism)
    assert inst.training.dropout
    routed = rank_tokens(inst.training, moe_only)
    tokens = 2 * 2048
    expected = 3.0 * 512 * tokens / 2 + 2.0 * 512 * routed
    assert hybrid_kept_bytes(SMALL, inst.training, moe_only, "E") == pytest.approx(expected)
