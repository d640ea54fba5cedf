"""Fine-grained activation offloading (``plan.offload_modules``): the bytes each module
takes off the GPU, the host copies the layer's compute does not hide, the rules, the
search's choices and the Megatron export."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipette_cp.cost.compute.model_chunks import layer_times
from pipette_cp.cost.evaluator.layout_rules import check_knobs
from pipette_cp.cost.memory.peak import activation_bytes_per_layer, moe_activation_bytes_per_layer
from pipette_cp.cost.stack.offload import offload_savings
from pipette_cp.cost.workload.tokens import expert_tokens
from pipette_cp.errors import LayoutError
from pipette_cp.report.megatron.check import check_megatron_argv
from pipette_cp.report.megatron.flags import before_blackwell, megatron_argv, megatron_environment
from pipette_cp.search.space import enumerate_layouts
from pipette_cp.specs import resolve_gpu
from pipette_cp.specs.layouts import make_plan
from pipette_cp.specs.search_space import SearchSpace
from pipette_cp.specs.training import OFFLOAD_MODULES, FrameworkProfile, TrainingSpec
from tests.conftest import small_instance
from tests.cost.memory.test_moe_activations import FE, H, K, S, tiny
from tests.cost.stack.test_fp8 import MODEL

TRAIN = TrainingSpec(global_batch_size=16, seq_length=S)


def dense(**knobs: object):
    return make_plan(num_layers=8, dp=8, pp=1, tp=2, micro_batch_size=1, sequence_parallel=True,
                     **knobs)  # type: ignore[arg-type]  # fmt: skip


def test_the_dense_modules_by_hand() -> None:
    """tp 2 with sequence parallelism, 4096 tokens, h 8192, 64 query heads of 128, 8 KV
    heads: the norms' inputs 2 B x h / tp a token; the core's Q (2 x 8192), K and V (2 x
    1024 each) / tp; the projection's bf16 input 2 x 8192 / tp."""
    tokens, h = 4096, 8192
    training = TrainingSpec(global_batch_size=64, seq_length=tokens)
    by_module = {m: offload_savings(MODEL, training, dense(offload_modules=(m,)), False)
                 for m in OFFLOAD_MODULES}  # fmt: skip
    assert by_module["attn_norm"] == by_module["mlp_norm"] == tokens * 2 * h / 2
    assert by_module["core_attn"] == tokens * (2 * 8192 + 2 * 1024 + 2 * 1024) / 2
    assert by_module["attn_proj"] == tokens * 2 * 8192 / 2
    assert by_module["expert_fc1"] == by_module["moe_act"] == 0.0  # a dense layer
    both = dense(offload_modules=("core_attn", "attn_proj"))
    kept = activation_bytes_per_layer(MODEL, training, dense())
    saved = by_module["core_attn"] + by_module["attn_proj"]
    assert activation_bytes_per_layer(MODEL, training, both) == pytest.approx(kept - saved)


def test_the_expert_modules_by_hand() -> None:
    """The tiny MoE model, tp 1, ep 2, micro-batch 2: FC1's input 2 B x h per routed copy,
    the activation's input 2 x 2 B x the expert width (SwiGLU's gate and up)."""
    p = make_plan(num_layers=4, dp=2, pp=1, tp=1, ep=2, micro_batch_size=2)
    copies = expert_tokens(tiny(), TRAIN, p)
    assert copies == S * 2 * K  # balanced: every routed copy on the two GPUs, half each x 2
    fc1 = offload_savings(tiny(), TRAIN, p.model_copy(update={"offload_modules": ("expert_fc1",)}), True)  # fmt: skip
    act = offload_savings(tiny(), TRAIN, p.model_copy(update={"offload_modules": ("moe_act",)}), True)  # fmt: skip
    assert fc1 == copies * 2 * H and act == copies * 2 * 2 * FE
    kept = moe_activation_bytes_per_layer(tiny(), TRAIN, p)
    off = p.model_copy(update={"offload_modules": ("expert_fc1", "moe_act")})
    assert moe_activation_bytes_per_layer(tiny(), TRAIN, off) == pytest.approx(kept - fc1 - act)


@settings(max_examples=30, deadline=None)
@given(
    modules=st.lists(st.sampled_from(("attn_norm", "core_attn", "attn_proj", "mlp_norm")),
                     min_size=1, unique=True),
    tp=st.sampled_from([1, 2, 4]),
    mb=st.integers(1, 4),
)  # fmt: skip
def test_offloading_never_raises_memory_and_never_shortens_a_layer(
    modules: list[str], tp: int, mb: int
) -> None:
    training = TrainingSpec(global_batch_size=64, seq_length=4096)
    base = make_plan(num_layers=8, dp=8, pp=1, tp=tp, micro_batch_size=mb,
                     sequence_parallel=tp > 1)  # fmt: skip
    off = base.model_copy(update={"offload_modules": tuple(modules)})
    assert activation_bytes_per_layer(MODEL, training, off) < activation_bytes_per_layer(MODEL, training, base)  # fmt: skip
    assert activation_bytes_per_layer(MODEL, training, off) > 0
    gpu = resolve_gpu("h100")
    on, plain = (layer_times(MODEL, training, gpu, p, 450e9) for p in (off, base))
    assert on.forward_s >= plain.forward_s and on.backward_s >= plain.backward_s


def test_copies_longer_than_the_layer_are_exposed(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a host link so slow that the copies outlast the layer, the forward and the
    backward each grow by the copy less the compute: halving the link again adds exactly
    one more copy time to each."""
    training = TrainingSpec(global_batch_size=64, seq_length=4096)
    gpu, off = resolve_gpu("gb300"), dense(offload_modules=OFFLOAD_MODULES[:4])
    nbytes = offload_savings(MODEL, training, off, False)
    times = {}
    for rate in (1e6, 0.5e6):  # 1 and 0.5 MB/s: tens of seconds a copy
        monkeypatch.setattr("pipette_cp.cost.compute.model_chunks.HOST_LINK_BYTES_PER_S", rate)
        times[rate] = layer_times(MODEL, training, gpu, off, 900e9)
    slower, slow = times[0.5e6], times[1e6]
    assert slower.forward_s - slow.forward_s == pytest.approx(nbytes / 1e6)
    assert slower.backward_s - slow.backward_s == pytest.approx(nbytes / 1e6)
    monkeypatch.undo()
    # at PCIe rate one norm input of an H100 layer (33.5 MB, 1.3 ms) hides behind its
    # compute (about 5 ms forward): nothing added
    h100, norm = resolve_gpu("h100"), dense(offload_modules=("attn_norm",))
    hidden = layer_times(MODEL, training, h100, norm, 450e9)
    plain = layer_times(MODEL, training, h100, dense(), 450e9)
    assert (hidden.forward_s, hidden.backward_s) == (plain.forward_s, plain.backward_s)


# ----------------------------------------------------------------------------- rules
def test_the_rules_name_the_field() -> None:
    inst = small_instance()
    cases = {
        ("full", None, ("attn_proj",)): "full recomputation keeps the layer inputs alone",
        ("selective", None, ("core_attn",)): "core_attn is recomputed too (core_attn)",
        ("none", None, ("moe_act",)): "moe_act needs a mixture-of-experts model",
    }
    for (recompute, modules, offload), why in cases.items():
        p = make_plan(num_layers=inst.model.num_layers, dp=8, pp=1, tp=1, micro_batch_size=1,
                      recompute=recompute, recompute_modules=modules, offload_modules=offload)  # fmt: skip
        with pytest.raises(LayoutError, match=re.escape(why)) as refused:
            check_knobs(inst, p)
        assert str(refused.value).startswith("plan.offload_modules=")
    titan = inst.model_copy(update={"training": inst.training.model_copy(update={"framework": FrameworkProfile(name="torchtitan")})})  # fmt: skip
    p = make_plan(num_layers=inst.model.num_layers, dp=8, pp=1, tp=1, micro_batch_size=1,
                  offload_modules=("attn_proj",))  # fmt: skip
    with pytest.raises(LayoutError, match="Megatron-Core's --fine-grained-activation-offloading"):
        check_knobs(titan, p)


def test_the_search_tries_the_space_s_sets_where_they_run() -> None:
    inst = small_instance()
    space = SearchSpace(offload_modules=(None, ("core_attn", "attn_proj")), recompute=("none", "selective"))  # fmt: skip
    layouts = list(enumerate_layouts(inst, space))
    offloaded = {(p.recompute, p.offload_modules) for p in layouts}
    assert ("none", ("core_attn", "attn_proj")) in offloaded and ("none", None) in offloaded
    # selective recomputes the core: that set is not tried with it
    assert ("selective", ("core_attn", "attn_proj")) not in offloaded


def test_module_sets_read_as_megatron_orders_them_and_none_is_off() -> None:
    p = make_plan(num_layers=8, dp=8, pp=1, tp=1, micro_batch_size=1,
                  offload_modules="attn_proj+core_attn,attn_proj")  # fmt: skip
    assert p.offload_modules == ("core_attn", "attn_proj")
    off = make_plan(num_layers=8, dp=8, pp=1, tp=1, micro_batch_size=1, offload_modules="none")
    assert off.offload_modules is None
    space = SearchSpace(offload_modules=("none", "core_attn+attn_norm", ["attn_norm", "core_attn"]))  # fmt: skip
    assert space.offload_modules == (None, ("attn_norm", "core_attn"))


def test_export_offloading_flags_pass_the_megatron_check() -> None:
    inst = small_instance(gpu="h100")
    p = make_plan(num_layers=inst.model.num_layers, dp=8, pp=1, tp=1, micro_batch_size=1,
                  offload_modules=("core_attn", "attn_proj"))  # fmt: skip
    argv = megatron_argv(inst, p)
    text = " ".join(argv)
    assert "--fine-grained-activation-offloading" in argv
    assert "--offload-modules core_attn attn_proj" in text
    parsed = check_megatron_argv(argv, megatron_environment(inst, p), before_blackwell=before_blackwell(inst))  # fmt: skip
    assert parsed["offload_modules"][1] == ["core_attn", "attn_proj"]
    assert parsed["fine_grained_activation_offloading"][1] is True
