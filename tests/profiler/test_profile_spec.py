"""The profile spec's optional fields and how the cost model reads a compute-only profile.

No PyTorch needed (the profiler's own tests are in ``tests/profiler/test_profiler.py``).
"""

from __future__ import annotations

import re
import sys

import pytest
from typer.testing import CliRunner

from pipette_cp.cli import app
from pipette_cp.cost.compute.model_chunks import chunk_times, layer_times, tp_collective_time_s
from pipette_cp.profiler import TORCH_MISSING
from pipette_cp.specs import ModelSpec, TrainingSpec, resolve_gpu
from pipette_cp.specs.layouts import make_plan
from pipette_cp.specs.profile import LayerProfile
from tests.conftest import FIXTURES

A100 = resolve_gpu("a100")
NVLINK = 150e9
MODEL = ModelSpec(name="m", num_layers=8, hidden_size=1024, num_attention_heads=16,
                  ffn_hidden_size=4096, vocab_size=32000, max_seq_length=2048)  # fmt: skip
TRAIN = TrainingSpec(global_batch_size=16, seq_length=2048)
ENTRIES = [
    {"tp": t, "micro_batch_size": 1, "recompute": r, "forward_s": 0.01, "backward_s": 0.03}
    for t in (1, 2) for r in ("none", "full")
]  # fmt: skip
FILE = FIXTURES / "tiny-llama.yaml"


def plan(tp: int, recompute: str = "none"):
    return make_plan(num_layers=8, dp=1, pp=1, tp=tp, micro_batch_size=1, recompute=recompute)


def test_old_profiles_stay_valid_and_include_tp_comm() -> None:
    old = LayerProfile.model_validate(
        {"entries": [{"tp": 1, "micro_batch_size": 1, "forward_s": 1e-3, "backward_s": 2e-3}]}
    )
    assert old.includes_tp_comm
    assert old.entries[0].peak_memory_bytes is None and old.entries[0].repetitions is None
    new = LayerProfile.model_validate(
        {
            "includes_tp_comm": False,
            "entries": [{**ENTRIES[0], "peak_memory_bytes": 7, "repetitions": 10}],
        }
    )
    assert not new.includes_tp_comm and new.entries[0].peak_memory_bytes == 7


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_compute_only_profile_gets_the_analytic_tp_collectives(recompute: str) -> None:
    measured = LayerProfile.model_validate({"entries": ENTRIES})
    compute_only = measured.model_copy(update={"includes_tp_comm": False})
    p = plan(2, recompute)
    with_comm = chunk_times(MODEL, TRAIN, A100, p, NVLINK, profile=measured)
    without = chunk_times(MODEL, TRAIN, A100, p, NVLINK, profile=compute_only)
    # Four ring collectives of the b s h bf16 activation per pass (two all-reduces).
    comm = 4 * tp_collective_time_s(2.0 * 2048 * 1024, 2, NVLINK)
    assert comm == pytest.approx(layer_times(MODEL, TRAIN, A100, p, NVLINK).tp_comm_forward_s)
    passes = 2 if recompute == "full" else 1  # the recomputed forward repeats its collectives
    assert without.forward_s[0] - with_comm.forward_s[0] == pytest.approx(8 * comm)
    assert without.backward_s[0] - with_comm.backward_s[0] == pytest.approx(8 * comm * passes)
    layer_comm = without.tp_comm_forward_s[0] - with_comm.tp_comm_forward_s[0]
    assert layer_comm == pytest.approx(8 * comm)


def test_compute_only_profile_at_tp1_and_with_overlap() -> None:
    compute_only = LayerProfile.model_validate({"includes_tp_comm": False, "entries": ENTRIES})
    measured = compute_only.model_copy(update={"includes_tp_comm": True})
    a = chunk_times(MODEL, TRAIN, A100, plan(1), NVLINK, profile=compute_only)
    b = chunk_times(MODEL, TRAIN, A100, plan(1), NVLINK, profile=measured)
    assert (a.forward_s == b.forward_s).all() and (a.backward_s == b.backward_s).all()
    # --tp-comm-overlap hides collectives shorter than the measured 10 ms of compute
    overlap = TRAIN.model_copy(update={"tp_comm_overlap": True})
    a = chunk_times(MODEL, overlap, A100, plan(2), NVLINK, profile=compute_only)
    b = chunk_times(MODEL, overlap, A100, plan(2), NVLINK, profile=measured)
    assert a.forward_s[0] == pytest.approx(b.forward_s[0])


def test_profile_without_torch_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    result = CliRunner().invoke(app, ["profile", str(FILE), "--seq", "16"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [f"error: {TORCH_MISSING}"]


def test_a_profile_belongs_to_its_model_and_device():
    """A profile records what it measured; an instance of another model, another GPU
    family, or a CPU profile on a GPU cluster is refused with one line."""
    from pipette_cp.errors import SpecError
    from pipette_cp.specs import Instance, validate_spec
    from tests.conftest import small_instance

    inst = small_instance()  # small-gpt on A100s
    entry = {"tp": 1, "micro_batch_size": 1, "forward_s": 0.01, "backward_s": 0.02}

    def with_profile(**fields):
        data = {**dict(inst), "profile": {"entries": [entry], **fields}}
        return validate_spec(Instance, data, "instance")

    assert with_profile(model="small-gpt", device="cuda", gpu="NVIDIA A100-SXM4-80GB").profile
    assert with_profile().profile  # nothing recorded: nothing to check
    for fields, said in (
        ({"model": "llama-2-7b"}, "profile.model='llama-2-7b'"),
        ({"device": "cpu", "gpu": "cpu"}, "profile.device='cpu'"),
        ({"gpu": "NVIDIA H100 80GB HBM3"}, "measured on H100, the cluster has A100"),
        ({"gpu": "NVIDIA GH200 480GB"}, "measured on GH200, the cluster has A100"),
        ({"gpu": "NVIDIA GB300"}, "measured on GB300, the cluster has A100"),
        ({"gpu": "NVIDIA H20"}, "measured on H20, the cluster has A100"),
    ):
        with pytest.raises(SpecError, match=re.escape(said)):
            with_profile(**fields)
