"""``pipette_cp.profiler`` and ``pipette-cp profile`` (need PyTorch; skipped without it).

Nothing here reads a measured time as evidence: times are checked for being
positive and present, the structure (shapes, parameter counts, recomputation,
backends) is checked exactly, and the timing loop runs on a scripted clock.
"""

from __future__ import annotations

import doctest
import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

import pipette_cp.profiler.layer as layer_module  # noqa: E402
from pipette_cp.cli import app  # noqa: E402
from pipette_cp.cost.memory.peak import layer_params_per_gpu  # noqa: E402
from pipette_cp.errors import SpecError  # noqa: E402
from pipette_cp.io.model_file import load_model  # noqa: E402
from pipette_cp.io.profile_file import load_layer_profile  # noqa: E402
from pipette_cp.profiler.layer import (  # noqa: E402
    AttentionCore,
    RankLayer,
    build_layer,
    shard_problem,
)
from pipette_cp.profiler.run import ProfileRequest, profile_layer  # noqa: E402
from pipette_cp.profiler.timing import CpuTimer, measure  # noqa: E402
from pipette_cp.specs.model import ModelSpec  # noqa: E402
from tests.conftest import FIXTURES  # noqa: E402

TINY = FIXTURES / "tiny-llama.yaml"
runner = CliRunner()
torch.set_num_threads(1)  # tiny tensors: threads only contend on a 2-core machine


def run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def tiny(**update: Any) -> ModelSpec:
    """The tiny fixture model with some fields replaced (validated)."""
    return ModelSpec.model_validate({**load_model(TINY).model_dump(), **update})


GPT_LIKE = {"activation": "gelu", "norm": "layernorm", "position_embedding": "learned",
            "linear_bias": True, "num_kv_heads": 4}  # fmt: skip
VARIANTS = {
    "llama (GQA, SwiGLU, RMSNorm, RoPE, no bias)": {},
    "gpt (MHA, GeLU, LayerNorm, biases)": GPT_LIKE,
    "MQA": {"num_kv_heads": 1},
    "head_dim != hidden/heads": {"head_dim": 32},
    "alibi": {"position_embedding": "alibi", "linear_bias": True},
}


# ------------------------------------------------------------------------ the layer
@pytest.mark.parametrize("update", VARIANTS.values(), ids=VARIANTS.keys())
def test_variants_build_run_and_hold_one_rank_of_parameters(update: dict) -> None:
    model = tiny(**update)
    for tp in (1, 2, 4):
        if shard_problem(model, tp) is not None:
            continue
        layer = build_layer(model, tp)
        assert sum(p.numel() for p in layer.parameters()) == layer_params_per_gpu(model, tp)
        x = torch.randn(2, 24, model.hidden_size, requires_grad=True)
        out = layer.step(x)
        assert out.shape == x.shape and out.dtype == torch.float32
        out.backward(torch.randn_like(out))
        assert x.grad is not None and x.grad.shape == x.shape
        assert all(p.grad is not None for p in layer.parameters())


@pytest.mark.parametrize("name", ["llama-2-70b", "gpt3-175b", "llama-2-7b"])
def test_real_shapes_match_the_analytic_parameter_count(name: str) -> None:
    model = load_model(name)
    for tp in (1, 2, 8):
        layer = build_layer(model, tp, device="meta")  # shapes only, no memory
        assert sum(p.numel() for p in layer.parameters()) == layer_params_per_gpu(model, tp)
        heads = model.num_attention_heads // tp
        assert layer.proj.in_features == heads * model.head_size
        assert layer.fc2.in_features == model.ffn_hidden_size // tp
        assert layer.input_norm.normalized_shape == (model.hidden_size,)


def test_shard_problem_names_the_indivisible_width() -> None:
    model = tiny()  # 4 heads, 2 kv heads, ffn 256
    assert shard_problem(model, 2) is None
    assert shard_problem(model, 4) == "tp=4 does not divide num_kv_heads=2"
    assert shard_problem(model, 3) == "tp=3 does not divide num_attention_heads=4"


def _count_calls(layer: RankLayer, recompute: str, monkeypatch: pytest.MonkeyPatch) -> tuple:
    """Forward calls of the layer and of its attention core in one forward + backward."""
    calls = {RankLayer: 0, AttentionCore: 0}
    for cls in calls:

        def counted(self: Any, *args: Any, _cls: type = cls, _orig: Any = cls.forward) -> Any:
            calls[_cls] += 1
            return _orig(self, *args)

        monkeypatch.setattr(cls, "forward", counted)
    layer.recompute = recompute  # type: ignore[assignment]
    x = torch.randn(1, 16, layer.shape.hidden, requires_grad=True)
    out = layer.step(x)
    out.backward(torch.ones_like(out))
    monkeypatch.undo()
    return calls[RankLayer], calls[AttentionCore]


def test_recomputation_really_reruns_the_forward_in_the_backward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    layer = build_layer(tiny(), 1)
    assert _count_calls(layer, "none", monkeypatch) == (1, 1)
    assert _count_calls(layer, "selective", monkeypatch) == (1, 2)  # the attention core only
    assert _count_calls(layer, "full", monkeypatch) == (2, 2)  # the whole layer


def test_recomputation_gives_the_same_gradients() -> None:
    grads = []
    for recompute in ("none", "selective", "full"):
        layer = build_layer(tiny(), 2, seed=1)
        layer.recompute = recompute  # type: ignore[assignment]
        torch.manual_seed(2)
        x = torch.randn(2, 16, 64, requires_grad=True)
        layer.step(x).sum().backward()
        grads.append(torch.cat([x.grad.flatten(), layer.qkv.weight.grad.flatten()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-5)
    assert torch.allclose(grads[0], grads[2], atol=1e-5)


def test_no_flash_pins_the_math_kernel_and_computes_the_same() -> None:
    layer = build_layer(tiny(), 1)
    layer.flash = False
    with layer.core.backend():
        assert not torch.backends.cuda.flash_sdp_enabled()
        assert torch.backends.cuda.math_sdp_enabled()
    x = torch.randn(2, 32, 64)
    math_out = layer(x)
    layer.flash = True
    assert torch.allclose(layer(x), math_out, atol=1e-5)


def test_attention_is_causal() -> None:
    layer = build_layer(tiny(), 1)
    x = torch.randn(1, 16, 64)
    changed = x.clone()
    changed[0, 10:] += 1.0  # a later token cannot change an earlier output
    assert torch.allclose(layer(x)[0, :10], layer(changed)[0, :10], atol=1e-6)
    assert not torch.allclose(layer(x)[0, 10:], layer(changed)[0, 10:])


def test_layer_module_doctests() -> None:
    assert doctest.testmod(layer_module).failed == 0


# ------------------------------------------------------------------------- timing
class ScriptedTimer(CpuTimer):
    """Marks are successive integers; a pass between marks i and i+1 lasts DURATIONS[i]."""

    def __init__(self, durations: list[float]) -> None:
        self.durations, self.count, self.waited = durations, 0, 0

    def mark(self) -> int:
        self.count += 1
        return self.count - 1

    def wait(self) -> None:
        self.waited += 1

    def seconds(self, start: int, end: int) -> float:
        return sum(self.durations[start:end])

    def peak_memory_bytes(self) -> int | None:
        return 1234


def test_measure_takes_medians_after_the_warmup() -> None:
    passes: list[str] = []
    # per repetition: forward (mark 3i -> 3i+1), backward (3i+1 -> 3i+2), gap to next mark
    durations = [1.0, 10.0, 0.0, 3.0, 30.0, 0.0, 2.0, 20.0, 0.0]
    timer = ScriptedTimer(durations)
    result = measure(lambda: passes.append("f"), lambda _: passes.append("b"), timer,
                     warmup=2, reps=3)  # fmt: skip
    assert passes == ["f", "b"] * 5  # 2 untimed, 3 timed
    assert (result.forward_s, result.backward_s) == (2.0, 20.0)
    assert result.peak_memory_bytes == 1234 and result.repetitions == 3
    assert timer.count == 9 and timer.waited == 2
    with pytest.raises(ValueError, match="reps"):
        measure(lambda: None, lambda _: None, timer, reps=0)


# ---------------------------------------------------------------------- the sweep
def _request(**update: Any) -> ProfileRequest:
    base: dict[str, Any] = {"model": tiny(), "seq_length": 32, "tp": (1, 2), "dtype": "fp32",
                            "micro_batch_size": (1, 2), "warmup": 1, "reps": 2}  # fmt: skip
    return ProfileRequest(**{**base, **update})


def test_sweep_measures_every_combination_and_notes_the_skipped(tmp_path: Path) -> None:
    seen = []
    request = _request(tp=(1, 2, 4), recompute=("none", "full"), flash_attention=(True, False),
                       seq_length=16)  # fmt: skip
    result = profile_layer(request, on_entry=seen.append)
    prof = result.profile
    keys = {(e.tp, e.micro_batch_size, e.recompute, e.flash_attention) for e in prof.entries}
    assert len(keys) == len(prof.entries) == 2 * 2 * 2 * 2
    assert list(prof.entries) == seen
    assert result.notes == ("tp=4 skipped: tp=4 does not divide num_kv_heads=2",)
    assert prof.gpu == "cpu" and prof.seq_length == 16 and not prof.includes_tp_comm
    assert all(e.forward_s > 0 and e.backward_s > 0 and e.repetitions == 2 for e in prof.entries)
    assert all(e.peak_memory_bytes is None for e in prof.entries)  # CPU: not measured
    for word in ("torch " + torch.__version__, "fp32", "median of 2 reps", "compute only"):
        assert word in prof.description
    path = tmp_path / "profile.json"
    path.write_text(prof.model_dump_json(indent=1))
    assert load_layer_profile(path) == prof


def test_bad_requests_are_spec_errors() -> None:
    with pytest.raises(SpecError, match="nothing could be measured"):
        profile_layer(_request(tp=(3, 4)))
    with pytest.raises(SpecError, match="reps"):
        profile_layer(_request(reps=0))
    with pytest.raises(SpecError, match="num_experts"):
        profile_layer(_request(model=tiny(num_experts=8)))
    if not torch.cuda.is_available():
        with pytest.raises(SpecError, match=r"cuda\.is_available"):
            profile_layer(_request(device="cuda"))


# --------------------------------------------------------------------------- CLI
def test_cli_profile_feeds_predict(tmp_path: Path) -> None:
    path = tmp_path / "tiny-profile.json"
    code, out = run("profile", str(TINY), "--tp", "1,2", "--mb", "1", "--seq", "64",
                    "--device", "cpu", "--dtype", "fp32", "--warmup", "1", "--reps", "2",
                    "--recompute", "none,full", "--no-flash", "-o", str(path))  # fmt: skip
    assert code == 0, out
    prof = load_layer_profile(path)
    assert prof.device == "cpu" and prof.model == load_model(TINY).name  # its provenance
    assert {(e.tp, e.recompute, e.flash_attention) for e in prof.entries} == {
        (1, "none", False), (1, "full", False), (2, "none", False), (2, "full", False)
    }  # fmt: skip
    predict = ("predict", "gpt3-1.3b-nominal-8", "--model", str(TINY), "--seq-length", "64",
               "--tp", "2", "--pp", "1", "--dp", "4", "--mb", "1", "--no-flash-attn",
               "--recompute", "full", "--json")  # fmt: skip
    code, out = run(*predict, "--profile", str(path))
    assert code == 2 and "profile.device='cpu'" in out, out  # CPU times do not stand for a GPU
    # The same numbers as if measured on the cluster's GPU (the workflow, not the numbers).
    as_gpu = prof.model_copy(update={"device": "cuda", "gpu": "NVIDIA A100-SXM4-80GB"})
    path.write_text(as_gpu.model_dump_json())
    code, out = run(*predict, "--profile", str(path))
    assert code == 0, out
    compute_only = json.loads(out)
    # The same times declared as including TP comm: the analytic collectives vanish.
    with_comm = tmp_path / "with-comm.json"
    with_comm.write_text(as_gpu.model_copy(update={"includes_tp_comm": True}).model_dump_json())
    code, out = run(*predict, "--profile", str(with_comm))
    assert code == 0, out
    assert compute_only["iteration_time_s"] > json.loads(out)["iteration_time_s"]


def test_cli_profile_to_stdout_and_one_line_errors() -> None:
    code, out = run("profile", str(TINY), "--seq", "16", "--device", "cpu", "--dtype", "fp32",
                    "--warmup", "0", "--reps", "1")  # fmt: skip
    assert code == 0, out
    assert '"includes_tp_comm": false' in out
    for args, expected in (
        (("--tp", "two"), "--tp='two': expected comma-separated positive integers"),
        (("--mb", "0"), "--mb='0'"),
        (("--recompute", "some"), "--recompute='some'"),
        (("--tp", "4"), "nothing could be measured"),
        (("-o", "no/such/dir/p.json"), "its folder no/such/dir does not exist"),
    ):
        code, out = run("profile", str(TINY), "--seq", "16", "--device", "cpu", *args)
        assert code == 2 and expected in out and len(out.strip().splitlines()) == 1, out
