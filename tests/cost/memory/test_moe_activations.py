"""Memory of mixture-of-experts and context-parallel layouts: parameters per GPU split
into dense and routed-expert ones, their sharded state, MoE and CP activations.

Hand computations on tiny models (Megatron-Core semantics: experts ``num_experts / ep``
per GPU split over etp, the router replicated, the distributed optimizer sharding dense
state over dp x cp and expert state over the expert data-parallel ranks), invariants,
and dense numbers pinned from the memory model before MoE and CP were added.
"""

from __future__ import annotations

import pytest

from pipette_cp.cost.memory.moe_activations import combine_activation_bytes, expert_activation_bytes
from pipette_cp.cost.memory.peak import (
    activation_bytes_per_layer,
    logits_bytes,
    memory_by_stage,
    moe_activation_bytes_per_layer,
    stage_params_per_gpu,
)
from pipette_cp.cost.memory.state import (
    expert_state_bytes_per_param,
    stage_fp8_weight_bytes,
    state_bytes_per_param,
)
from pipette_cp.cost.workload.parameters import (
    expert_shard_group,
    largest_layer_params_per_gpu,
    stage_layer_kinds,
    stage_param_split,
)
from pipette_cp.io.model_file import load_model
from pipette_cp.specs.layouts import make_plan
from pipette_cp.specs.model import ModelSpec
from pipette_cp.specs.training import FrameworkProfile, TrainingSpec
from tests.models import gpt_model, llama3_8b

H, HEADS, F, FE, E, K, V = 64, 4, 256, 128, 4, 2, 1024
S = 256


def tiny(**over: object) -> ModelSpec:
    """4 layers, h 64, MHA with 4 heads, SwiGLU, RMSNorm, no biases, untied; 4 routed
    experts of width 128, top 2."""
    fields: dict[str, object] = dict(
        name="tiny-moe", num_layers=4, hidden_size=H, num_attention_heads=HEADS,
        ffn_hidden_size=F, vocab_size=V, activation="swiglu", norm="rmsnorm",
        position_embedding="rope", linear_bias=False, tied_embeddings=False,
        max_seq_length=S, num_experts=E, moe_top_k=K, moe_ffn_hidden_size=FE,
    )  # fmt: skip
    return ModelSpec(**(fields | over))  # type: ignore[arg-type]


def dense_tiny() -> ModelSpec:
    m = tiny()
    return ModelSpec(
        **{**m.model_dump(), "num_experts": 1, "moe_top_k": 1, "moe_ffn_hidden_size": None}
    )


TRAIN = TrainingSpec(global_batch_size=16, seq_length=S)

# Hand counts of the tiny model: attention 4 h^2 (q = kv = h), 2 RMSNorms of h, router h E,
# one routed expert 3 h f_e (SwiGLU), the vocab-parallel embedding and the LM head.
ATTENTION, NORMS, ROUTER, EXPERT = 4 * H * H, 2 * H, H * E, 3 * H * FE


def test_expert_params_per_gpu_are_local_experts_over_etp() -> None:
    """4 experts, ep 2, etp 1, tp 2: 2 experts x 3 h f_e per GPU and MoE layer; attention
    over tp, norms and router replicated; the vocabulary padded to 128 x tp = 256."""
    p = make_plan(num_layers=4, dp=2, pp=1, tp=2, ep=2, etp=1, micro_batch_size=1,
                  sequence_parallel=True)  # fmt: skip
    dense, experts = stage_param_split(tiny(), p, 0)
    assert experts == 4 * (2 * EXPERT / 1)
    assert dense == 4 * (ATTENTION / 2 + NORMS + ROUTER) + V * H / 2 + H + V * H / 2
    assert stage_params_per_gpu(tiny(), p, 0) == dense + experts
    # etp 2 (the default, tp): the same 2 experts, each split in two
    q = p.model_copy(update={"etp": None})
    assert stage_param_split(tiny(), q, 0) == (dense, experts / 2)


def test_doubling_ep_halves_the_routed_expert_weights() -> None:
    def split(ep: int) -> tuple[float, float]:
        p = make_plan(num_layers=4, dp=4, pp=2, tp=1, ep=ep, micro_batch_size=1)
        return stage_param_split(tiny(), p, 1)

    (dense2, experts2), (dense4, experts4) = split(2), split(4)
    assert dense2 == dense4 and experts4 == experts2 / 2 == 2 * (1 * EXPERT)


def test_optimizer_state_of_experts_is_sharded_over_expert_data_parallel() -> None:
    """tp 1, dp 4, ep 2: dense state over dp x cp = 4 ranks, expert state over
    tp cp dp / (ep etp) = 2 ranks (Megatron-Core's expert data-parallel group)."""
    p = make_plan(num_layers=4, dp=4, pp=1, tp=1, ep=2, micro_batch_size=1,
                  distributed_optimizer=True)  # fmt: skip
    assert (p.shard_group, p.expert_dp, expert_shard_group(p)) == (4, 2, 2)
    assert state_bytes_per_param(TRAIN, p) == (2.0, 4.0, 12.0 / 4)
    assert expert_state_bytes_per_param(TRAIN, p) == (2.0, 4.0, 12.0 / 2)
    dense, experts = stage_param_split(tiny(), p, 0)
    assert experts == 4 * 2 * EXPERT
    mem = memory_by_stage(tiny(), TRAIN, p)[0]
    assert mem.weights == pytest.approx(2 * (dense + experts))
    assert mem.gradients == pytest.approx(4 * (dense + experts))
    assert mem.optimizer_state == pytest.approx(12 * dense / 4 + 12 * experts / 2)
    # ZeRO-3: weights and gradients follow the same two groups
    z3 = p.model_copy(update={"dp_sharding": "optim_grads_params"})
    assert expert_state_bytes_per_param(TRAIN, z3) == (1.0, 2.0, 6.0)
    assert state_bytes_per_param(TRAIN, z3) == (0.5, 1.0, 3.0)


def test_context_parallel_ranks_shard_dense_and_expert_state() -> None:
    """cp 2 x dp 2 x tp 1, ep 2: dense state over dp cp = 4, experts over 4 / 2 = 2."""
    p = make_plan(num_layers=4, dp=2, pp=1, tp=1, cp=2, ep=2, micro_batch_size=1,
                  distributed_optimizer=True)  # fmt: skip
    assert state_bytes_per_param(TRAIN, p)[2] == 3.0
    assert expert_state_bytes_per_param(TRAIN, p)[2] == 6.0


def test_hsdp_divides_the_expert_group_by_the_optimizer_instances() -> None:
    """dp 4 in 2 shard groups of 2 (2 optimizer instances), ep 2: expert dp 2 / 2 = 1."""
    p = make_plan(num_layers=4, dp=4, pp=1, tp=1, ep=2, micro_batch_size=1,
                  dp_sharding="optim", dp_shard_size=2)  # fmt: skip
    assert (p.shard_group, p.expert_dp, expert_shard_group(p)) == (2, 2, 1)
    assert expert_state_bytes_per_param(TRAIN, p)[2] == 12.0


def test_layer_kinds_follow_megatron_virtual_stage_order() -> None:
    """8 layers, the first dense, then every 2nd MoE (1, 3, 5, 7); pp 2, vpp 2, split
    (3, 1, 2, 2): stage 0 holds virtual stages 0 and 2 (layers 0-2 and 4-5), stage 1
    virtual stages 1 and 3 (layers 3 and 6-7)."""
    m = tiny(num_layers=8, first_k_dense_layers=1, moe_layer_freq=2)
    p = make_plan(num_layers=8, dp=2, pp=2, tp=1, vpp=2, ep=2, micro_batch_size=1,
                  layer_split=(3, 1, 2, 2))  # fmt: skip
    assert stage_layer_kinds(m, p, 0) == (3, 2) and stage_layer_kinds(m, p, 1) == (1, 2)
    dense_layer = ATTENTION + NORMS + 3 * H * F
    moe_dense, expert = ATTENTION + NORMS + ROUTER, 2 * EXPERT
    assert stage_param_split(m, p, 0) == (3 * dense_layer + 2 * moe_dense + V * H, 2 * expert)
    assert stage_param_split(m, p, 1) == (dense_layer + 2 * moe_dense + H + V * H, 2 * expert)
    assert largest_layer_params_per_gpu(m, p) == max(dense_layer, moe_dense + expert)


def test_mixtral_parameters_per_gpu_by_hand() -> None:
    """Mixtral-8x7B, tp 1, ep 8, pp 4, dp 8: per layer attention 4096 x (4096 + 2 x 1024)
    + 4096 x 4096, 2 norms, router 4096 x 8, one expert 3 x 4096 x 14336 per GPU."""
    m = load_model("mixtral-8x7b")
    p = make_plan(num_layers=32, dp=8, pp=4, tp=1, ep=8, micro_batch_size=1,
                  distributed_optimizer=True)  # fmt: skip
    h = 4096
    dense_layer = h * (h + 2 * 1024) + h * h + 2 * h + h * 8
    expert = 3 * h * 14336
    assert stage_param_split(m, p, 0) == (8 * dense_layer + 32000 * h, 8 * expert)
    assert stage_param_split(m, p, 1) == (8 * dense_layer, 8 * expert)
    assert stage_param_split(m, p, 3) == (8 * dense_layer + h + 32000 * h, 8 * expert)
    # about 1.9e9 parameters on a GPU of stage 0: 46.7e9 / (pp 4 x ep 8) for the experts,
    # dense ones replicated over ep
    assert 1.8e9 < stage_params_per_gpu(m, p, 0) < 1.95e9
    # every parameter once over the stages and the ep ranks (tp 1)
    total = sum(d + 8 * x for d, x in (stage_param_split(m, p, s) for s in range(4)))
    assert total == m.total_params
    # expert dp = 8 / 8 = 1: the expert state is not sharded, the dense state over dp 8
    mem = memory_by_stage(m, TRAIN, p)[0]
    assert mem.optimizer_state == pytest.approx(
        12 * (8 * dense_layer + 32000 * h) / 8 + 12 * 8 * expert
    )


def test_fp8_weight_copies_count_the_local_experts() -> None:
    fp8 = TRAIN.model_copy(update={"precision": "fp8"})
    p = make_plan(num_layers=4, dp=2, pp=1, tp=2, ep=2, etp=1, micro_batch_size=1,
                  sequence_parallel=True)  # fmt: skip
    # 2 B (row- and column-wise FP8) per GEMM weight: attention over tp, 2 experts over etp 1
    per_layer = (4 * H * H / 2 + 2 * 3 * H * FE / 1) * 2.0
    assert stage_fp8_weight_bytes(tiny(), fp8, p, 0) == pytest.approx(4 * per_layer)
    assert stage_fp8_weight_bytes(tiny(), TRAIN, p, 0) == 0.0
    dense, experts = stage_param_split(tiny(), p, 0)
    weights = memory_by_stage(tiny(), fp8, p)[0].weights
    assert weights == pytest.approx(2 * (dense + experts) + 4 * per_layer)


def test_moe_layer_activations_by_hand() -> None:
    """tp 1, no SP, FlashAttention, dropout masks, balanced routing: Korthikanti et al.'s
    attention terms, then router input (2h) + fp32 logits and scores and bool map (9 B
    per expert) + top-k probability and index (12 B per copy); per routed copy the FC1
    input (2h), SwiGLU's gate and up (4 f_e) and FC2 input (2 f_e); the combine's kept
    expert outputs (2h per copy)."""
    p = make_plan(num_layers=4, dp=2, pp=1, tp=1, ep=2, micro_batch_size=2)
    sb = S * 2
    attention = sb * H * (4 + 2 + 2) + sb * (2 * H + 4 * H + 2 * H) + 4 * HEADS * sb
    router = sb * (2 * H + 9 * E + 12 * K)
    experts = sb * K * (2 * H + 6 * FE)
    combine = sb * K * 2 * H
    expected = attention + router + experts + combine
    assert moe_activation_bytes_per_layer(tiny(), TRAIN, p) == pytest.approx(expected)
    # the dense layer of the same widths: FC1 input 2h and the MLP's 6 f instead
    dense = attention + sb * (2 * H + 6 * F)
    assert activation_bytes_per_layer(tiny(), TRAIN, p) == pytest.approx(dense)
    # full recompute keeps the layer input alone, as for a dense layer
    full = p.model_copy(update={"recompute": "full"})
    assert moe_activation_bytes_per_layer(tiny(), TRAIN, full) == 2.0 * sb * H


def test_probabilities_applied_in_the_activation_keep_no_expert_outputs() -> None:
    """The megatron-bridge profile's experts weight their SwiGLU output by the routing
    probabilities (Megatron-Core's weighted_bias_swiglu_impl): the un-permutation keeps
    nothing, 2h per routed copy less than Megatron-Core's older combine; nothing else
    changes."""
    p = make_plan(num_layers=4, dp=2, pp=1, tp=1, ep=2, micro_batch_size=2)
    bridge = TRAIN.model_copy(update={"framework": FrameworkProfile(name="megatron-bridge")})
    assert combine_activation_bytes(tiny(), bridge, p) == 0.0
    assert combine_activation_bytes(tiny(), TRAIN, p) == S * 2 * K * 2 * H
    kept = moe_activation_bytes_per_layer(tiny(), TRAIN, p)
    assert moe_activation_bytes_per_layer(tiny(), bridge, p) == pytest.approx(
        kept - S * 2 * K * 2 * H
    )
    assert activation_bytes_per_layer(tiny(), bridge, p) == activation_bytes_per_layer(
        tiny(), TRAIN, p
    )


def test_expert_activations_follow_imbalance_etp_and_sequence_parallelism() -> None:
    p = make_plan(num_layers=4, dp=2, pp=1, tp=2, ep=2, etp=1, micro_batch_size=1,
                  sequence_parallel=True)  # fmt: skip
    # each GPU routes s / tp tokens to top-2 experts; etp 1 gathers nothing
    assert expert_activation_bytes(tiny(), TRAIN, p) == pytest.approx(S / 2 * K * (2 * H + 6 * FE))
    skewed = TRAIN.model_copy(update={"moe_load_imbalance": 1.5})
    assert expert_activation_bytes(tiny(), skewed, p) == pytest.approx(
        1.5 * expert_activation_bytes(tiny(), TRAIN, p)
    )
    # etp 2: the two expert tensor ranks gather their tokens, each with half the width
    q = p.model_copy(update={"etp": 2})
    assert expert_activation_bytes(tiny(), TRAIN, q) == pytest.approx(S * K * (2 * H + 3 * FE))


@pytest.mark.parametrize("flash", [True, False])
@pytest.mark.parametrize("tp", [1, 2])
def test_cp_2_halves_the_activations_of_a_dense_plan(flash: bool, tp: int) -> None:
    m = dense_tiny()

    def plan(cp: int):
        return make_plan(num_layers=4, dp=2, pp=2, tp=tp, cp=cp, micro_batch_size=1,
                         flash_attention=flash, sequence_parallel=tp > 1)  # fmt: skip

    one, two = plan(1), plan(2)
    assert activation_bytes_per_layer(m, TRAIN, two) == pytest.approx(
        activation_bytes_per_layer(m, TRAIN, one) / 2
    )
    assert logits_bytes(m, TRAIN, two) == pytest.approx(logits_bytes(m, TRAIN, one) / 2)
    for a, b in zip(memory_by_stage(m, TRAIN, one), memory_by_stage(m, TRAIN, two), strict=True):
        assert b.activations == pytest.approx(a.activations / 2)
        assert b.weights == a.weights and b.gradients == a.gradients


def test_cp_shards_the_distributed_optimizer_over_dp_times_cp() -> None:
    m = dense_tiny()
    one = make_plan(num_layers=4, dp=2, pp=1, tp=1, micro_batch_size=1, distributed_optimizer=True)
    two = one.model_copy(update={"cp": 2, "placement": ((0,), (1,), (2,), (3,))})
    assert memory_by_stage(m, TRAIN, two)[0].optimizer_state == pytest.approx(
        memory_by_stage(m, TRAIN, one)[0].optimizer_state / 2
    )


# ---------------------------------------- dense models: pinned from the model before MoE/CP
LLAMA = llama3_8b()
GPT = gpt_model("gpt", 16, 2048, 16)
LONG = TrainingSpec(global_batch_size=256, seq_length=4096)
FP8 = TrainingSpec(global_batch_size=256, seq_length=2048, precision="fp8")

#: (model, training, plan knobs, params per GPU by stage, total bytes by stage)
PINNED = [
    (LLAMA, LONG, dict(dp=8, pp=4, tp=2, vpp=2, sequence_parallel=True, distributed_optimizer=True),
     [1135149056.0, 872480768.0, 872480768.0, 1135153152.0],
     [29643093770.239998, 24945339924.48, 22273431961.6, 23350135275.52]),
    (GPT, FP8, dict(dp=4, pp=2, tp=4, recompute="full"),
     [131198976.0, 127008768.0], [8850498682.88, 8883954319.36]),
    (GPT, LONG, dict(dp=8, pp=1, tp=1, recompute="selective", dp_sharding="optim_grads_params"),
     [914788352.0], [15272884920.32]),
]  # fmt: skip


@pytest.mark.parametrize(("model", "training", "knobs", "params", "totals"), PINNED)
def test_dense_models_are_unchanged(model, training, knobs, params, totals) -> None:
    p = make_plan(num_layers=model.num_layers, micro_batch_size=1, **knobs)
    assert [stage_params_per_gpu(model, p, s) for s in range(p.pp)] == params
    got = [b.total_bytes for b in memory_by_stage(model, training, p)]
    assert got == pytest.approx(totals, rel=1e-12)
    assert all(stage_param_split(model, p, s)[1] == 0.0 for s in range(p.pp))
