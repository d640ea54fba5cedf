"""The software stack's kernels: attention kernel and fused norm, in time and memory."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipette_cp.cost.compute.model_chunks import layer_times
from pipette_cp.cost.memory.peak import activation_bytes_per_layer
from pipette_cp.cost.stack.kernels import attention_kernel, fused_attention_efficiency, stack_kernel
from pipette_cp.errors import SpecError
from pipette_cp.specs import TrainingSpec, resolve_gpu
from pipette_cp.specs.layouts import make_plan
from tests.models import LLAMA_STYLE, gpt_model

LLAMA = gpt_model("llama-like", 8, 4096, 32, ffn_hidden_size=11008, vocab_size=32000,
                  max_seq_length=4096, **LLAMA_STYLE)  # fmt: skip
A100, H100 = resolve_gpu("a100"), resolve_gpu("h100")
NVLINK = 150e9


def _train(**over) -> TrainingSpec:
    return TrainingSpec(global_batch_size=64, seq_length=4096, **over)


def _plan(flash: bool = True, **knobs):
    base = {"dp": 1, "pp": 1, "tp": 1, "micro_batch_size": 1, "flash_attention": flash}
    return make_plan(num_layers=8, **(base | knobs))


def _layer_s(training: TrainingSpec, gpu=A100, flash: bool = True) -> float:
    times = layer_times(LLAMA, training, gpu, _plan(flash), NVLINK)
    return times.forward_s + times.backward_s


def test_default_kernel_is_megatron_cores():
    assert stack_kernel(_train(), A100) == "flash2"
    assert stack_kernel(_train(), H100) == "cudnn"
    assert attention_kernel(_train(), _plan(flash=False), A100) == "fused-softmax"


def test_flash3_needs_hopper():
    assert stack_kernel(_train(attention_kernel="flash3"), H100) == "flash3"
    with pytest.raises(
        SpecError, match=r"training\.attention_kernel='flash3': FlashAttention 3 runs on Hopper"
    ):
        _layer_s(_train(attention_kernel="flash3"), A100)


def test_kernel_efficiencies_follow_the_papers():
    # FlashAttention-2 ~2x FlashAttention (Dao 2023); FA3 1.5-2x FA2 on H100 (Shah et al. 2024)
    assert fused_attention_efficiency("flash1", A100, 0.55) == pytest.approx(0.275)
    assert fused_attention_efficiency("flash2", A100, 0.55) == 0.55
    assert fused_attention_efficiency("flash3", H100, 0.5) / fused_attention_efficiency(
        "flash2", H100, 0.5
    ) == pytest.approx(0.60 / 0.35)


def test_attention_kernels_order_on_a100():
    """flash2 < flash1 < fused-softmax < eager for one layer at 4k on an A100."""
    times = [
        _layer_s(_train(attention_kernel=k), flash=k in ("flash1", "flash2"))
        for k in ("flash2", "flash1", "fused-softmax", "eager")
    ]
    assert times == sorted(times) and len(set(times)) == 4


def test_unfused_kernels_store_the_scores():
    fused = activation_bytes_per_layer(LLAMA, _train(), _plan())
    eager = activation_bytes_per_layer(LLAMA, _train(attention_kernel="eager"), _plan())
    # Korthikanti et al. 2022: the unfused softmax keeps 5 a s^2 b bytes per layer
    assert eager - fused == pytest.approx(5 * 32 * 4096**2 - 4 * 32 * 4096)


def test_unfused_rmsnorm_costs_time_and_memory():
    train = _train()
    unfused = _train(fused_norm=False)
    assert _layer_s(unfused) > _layer_s(train)
    extra = activation_bytes_per_layer(LLAMA, unfused, _plan()) - activation_bytes_per_layer(
        LLAMA, train, _plan()
    )
    assert extra == pytest.approx(2 * 4.0 * 4096 * 4096)  # two norms, +4 B per element
    layernorm = LLAMA.model_copy(update={"norm": "layernorm"})
    # PyTorch's LayerNorm is one kernel: the flag changes nothing there
    assert activation_bytes_per_layer(layernorm, unfused, _plan()) == activation_bytes_per_layer(
        layernorm, train, _plan()
    )


@given(
    tp=st.sampled_from([1, 2, 4, 8]),
    mb=st.integers(1, 4),
    seq=st.sampled_from([512, 2048, 8192]),
    gpu=st.sampled_from([A100, H100]),
)
def test_a_faster_kernel_never_slows_the_layer(tp: int, mb: int, seq: int, gpu) -> None:
    """FlashAttention 2 beats FlashAttention 1, fused kernels beat the unfused path, a
    fused norm beats PyTorch's, fused bias-activation the separate kernels; the fused
    kernels never keep more memory."""
    plan = _plan(tp=tp, micro_batch_size=mb)
    base = TrainingSpec(global_batch_size=64, seq_length=seq)

    def total(training, flash=True):
        t = layer_times(
            LLAMA, training, gpu, plan.model_copy(update={"flash_attention": flash}), NVLINK
        )
        return t.forward_s + t.backward_s

    assert total(base.model_copy(update={"attention_kernel": "flash2"})) <= total(
        base.model_copy(update={"attention_kernel": "flash1"})
    )
    assert total(base) <= total(base, flash=False)
    assert total(base) <= total(base.model_copy(update={"fused_norm": False}))
    assert activation_bytes_per_layer(LLAMA, base, plan) <= activation_bytes_per_layer(
        LLAMA, base.model_copy(update={"fused_norm": False}), plan
    )
    unfused = base.model_copy(update={"fused_bias_activation": False})
    assert total(base) <= total(unfused)
    assert activation_bytes_per_layer(LLAMA, base, plan) <= activation_bytes_per_layer(LLAMA, unfused, plan)  # fmt: skip


def test_a_plan_may_name_its_kernel():
    plan = make_plan(num_layers=8, dp=1, pp=1, tp=1, micro_batch_size=1, attention_kernel="eager")
    assert (plan.flash_attention, plan.layout()) == (False, "dp1-pp1-tp1-mb1-nofa-eager")
    assert attention_kernel(_train(), plan, A100) == "eager"
    again = type(plan).model_validate_json(plan.model_dump_json())
    assert again == plan


def test_the_search_chooses_among_the_available_kernels():
    """Kernels as search knobs: the fastest plans use the fastest kernel the space allows."""
    from pipette_cp.api import solve
    from pipette_cp.search.space import enumerate_layouts
    from pipette_cp.specs import SearchSpace
    from tests.conftest import small_instance

    inst = small_instance(nodes=1, gpus_per_node=8)
    llama = inst.model.model_copy(update={"norm": "rmsnorm"})
    space = SearchSpace(attention_kernel=("eager", "flash1", "flash2"), fused_norm=(True, False),
                        recompute=("none",), micro_batch_size=(1,), vpp=(1,))  # fmt: skip
    inst = inst.model_copy(update={"model": llama, "search_space": space})
    seen = {(p.attention_kernel, p.fused_norm) for p in enumerate_layouts(inst)}
    assert seen == {(k, n) for k in ("eager", "flash1", "flash2") for n in (True, False)}
    best = solve(inst, method="megatron-default", top_k=1, time_limit_s=20)[0]
    assert (best.attention_kernel, best.fused_norm) == ("flash2", True)


def test_flash3_in_the_search_space_needs_hopper():
    from pipette_cp.search.space import enumerate_layouts
    from pipette_cp.specs import SearchSpace
    from tests.conftest import small_instance

    inst = small_instance()
    inst = inst.model_copy(update={"search_space": SearchSpace(attention_kernel=("flash3",))})
    with pytest.raises(SpecError, match=r"search_space\.attention_kernel=.*Hopper"):
        list(enumerate_layouts(inst))


def test_unfused_bias_activation_costs_time_and_memory():
    """Unfused SwiGLU: SiLU and the product as two kernels (10 B instead of 6 B of HBM
    traffic per element of T f/t forward) and the SiLU output kept (2 B per element)."""
    fused, unfused = _train(), _train(fused_bias_activation=False)
    extra = activation_bytes_per_layer(LLAMA, unfused, _plan()) - activation_bytes_per_layer(LLAMA, fused, _plan())  # fmt: skip
    assert extra == 4096 * LLAMA.ffn_hidden_size * 2.0
    assert _layer_s(unfused) > _layer_s(fused)
    gpt = LLAMA.model_copy(update={"activation": "gelu", "ffn_hidden_size": 16384})
    no_bias = [activation_bytes_per_layer(gpt, t, _plan()) for t in (fused, unfused)]
    assert no_bias[0] == no_bias[1]  # GeLU keeps its input either way


def test_fused_cross_entropy_keeps_only_the_bf16_logits():
    from pipette_cp.cost.compute.model_chunks import chunk_times
    from pipette_cp.cost.memory.peak import logits_bytes

    plan = _plan()
    plain, fused = _train(), _train(fused_cross_entropy=True)
    assert logits_bytes(LLAMA, fused, plan) * 3 == logits_bytes(LLAMA, plain, plan)
    times = [chunk_times(LLAMA, t, A100, plan, NVLINK, None) for t in (plain, fused)]
    assert times[1].forward_s[0] < times[0].forward_s[0]
    assert times[1].backward_s[0] < times[0].backward_s[0]
