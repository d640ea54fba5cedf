"""The GPU architecture: every catalogue entry's, the rule for user GPUs that do not give
it, and every decision that reads it (FP8 recipes, FlashAttention 3, NVIDIA-only
kernels, Megatron's launch rule, the calibration family)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pipette_cp.cost.stack.calibration import calibration_for, gpu_family
from pipette_cp.cost.stack.kernels import check_precision, is_blackwell, is_hopper, stack_kernel
from pipette_cp.errors import SpecError
from pipette_cp.io.cluster_file import FORMAT, read_cluster_file
from pipette_cp.report.megatron.flags import before_blackwell, megatron_environment
from pipette_cp.specs import TrainingSpec, resolve_gpu
from pipette_cp.specs.gpu import GPU_CATALOG, GpuSpec, architecture_of_name
from pipette_cp.specs.layouts import make_plan
from pipette_cp.units import TFLOPS
from tests.conftest import small_instance

#: The architecture of every catalogue entry (a new entry must be added here).
ARCHITECTURES = {
    "V100-SXM2-16GB": "volta", "V100-SXM2-32GB": "volta",
    "A100-SXM4-40GB": "ampere", "A100-SXM4-80GB": "ampere",
    "H100-SXM5-80GB": "hopper", "H200-SXM-141GB": "hopper", "H800-SXM5-80GB": "hopper",
    "H20-96GB": "hopper", "GH200-96GB": "hopper", "GH200-144GB": "hopper",
    "B200-SXM-180GB": "blackwell", "GB200-NVL72-186GB": "blackwell",
    "B300-SXM-288GB": "blackwell", "GB300-NVL72-288GB": "blackwell",
    "MI300X-OAM-192GB": "cdna3",
}  # fmt: skip
HOPPER = [n for n, a in ARCHITECTURES.items() if a == "hopper"]
BLACKWELL = [n for n, a in ARCHITECTURES.items() if a == "blackwell"]
#: A user GPU whose name tells no architecture.
X1: dict[str, Any] = {
    "name": "X1", "memory_bytes": 64e9, "peak_flops_per_s": 5e14,
    "hbm_bandwidth_bytes_per_s": 2e12, "nvlink_bandwidth_bytes_per_s": 9e11,
}  # fmt: skip


def fp8(recipe: str | None = None) -> TrainingSpec:
    return TrainingSpec(global_batch_size=8, seq_length=256, precision="fp8", fp8_recipe=recipe)


def refusal(training: TrainingSpec, gpu: GpuSpec) -> str:
    with pytest.raises(SpecError) as info:
        check_precision(training, gpu)
    return str(info.value)


# ------------------------------------------------------------------ the catalogue
def test_every_catalogue_entry_has_its_architecture() -> None:
    assert {n: g.architecture for n, g in GPU_CATALOG.items()} == ARCHITECTURES
    for name, gpu in GPU_CATALOG.items():
        assert architecture_of_name(name) == gpu.architecture, name  # name and field agree
        major = {"volta": 7, "ampere": 8, "hopper": 9, "blackwell": 10}.get(gpu.architecture)
        assert (gpu.compute_capability or (None,))[0] == major, name
        assert gpu.vendor == ("AMD" if gpu.architecture == "cdna3" else "NVIDIA"), name


def test_new_entries_divide_their_system_totals() -> None:
    b300, gb300 = GPU_CATALOG["B300-SXM-288GB"], GPU_CATALOG["GB300-NVL72-288GB"]
    assert b300.peak_flops_per_s == pytest.approx(36e15 / 8 / 2)  # sparse per 8 GPUs
    assert b300.peak_fp8_flops_per_s == pytest.approx(72e15 / 8 / 2)
    assert b300.peak_fp4_flops_per_s == pytest.approx(108e15 / 8)  # dense per 8 GPUs
    assert gb300.peak_flops_per_s == pytest.approx(360e15 / 72 / 2)
    assert gb300.peak_fp8_flops_per_s == pytest.approx(720e15 / 72 / 2)
    assert gb300.peak_fp4_flops_per_s == pytest.approx(1080e15 / 72)
    assert gb300.hbm_bandwidth_bytes_per_s == pytest.approx(576e12 / 72)
    for text in ("13500 TFLOP/s dense fp4", "FP64 1.25 TFLOP/s", "not published"):
        assert text in b300.source  # the shipping part's SM count: not published
    for text in ("15000 TFLOP/s dense fp4", "130 TB/s per rack", "ConnectX-8 800 Gb/s"):
        assert text in gb300.source
    h800, h100 = GPU_CATALOG["H800-SXM5-80GB"], GPU_CATALOG["H100-SXM5-80GB"]
    assert h800.nvlink_bandwidth_bytes_per_s == pytest.approx(200e9)  # 400 GB/s bidirectional
    assert h800.peak_flops_per_s == h100.peak_flops_per_s and "FP64 1 TFLOP/s" in h800.source
    h20 = GPU_CATALOG["H20-96GB"]
    assert h20.peak_flops_per_s == pytest.approx(148 * TFLOPS) and "assumption" in h20.source
    gh96, gh144 = GPU_CATALOG["GH200-96GB"], GPU_CATALOG["GH200-144GB"]
    assert gh96.source == gh144.source and "NVLink-C2C" in gh96.source
    assert gh144.hbm_bandwidth_bytes_per_s > gh96.hbm_bandwidth_bytes_per_s
    fp4 = {n for n, g in GPU_CATALOG.items() if g.peak_fp4_flops_per_s is not None}
    assert fp4 == set(BLACKWELL)
    for name in fp4:  # dense FP4 is 2x FP8 on Blackwell, 3x on Blackwell Ultra
        ratio = GPU_CATALOG[name].peak_fp4_flops_per_s / GPU_CATALOG[name].peak_fp8_flops_per_s  # type: ignore[operator]
        assert ratio == pytest.approx(3.0 if "300" in name else 2.0), name


@pytest.mark.parametrize(
    ("alias", "name"),
    [("h800", "H800-SXM5-80GB"), ("h20", "H20-96GB"), ("gh200", "GH200-96GB"),
     ("gh200-144gb", "GH200-144GB"), ("b300", "B300-SXM-288GB"), ("GB300", "GB300-NVL72-288GB")],
)  # fmt: skip
def test_new_aliases_resolve(alias: str, name: str) -> None:
    assert resolve_gpu(alias).name == name


# ------------------------------------------------------------------ FP8 recipes
@pytest.mark.parametrize("name", HOPPER + BLACKWELL)
def test_blockwise_fp8_on_every_hopper_and_blackwell_part(name: str) -> None:
    """The bug: an H800 (Hopper) was refused blockwise FP8 because Hopper was a name."""
    gpu = GPU_CATALOG[name]
    for recipe in (None, "tensorwise", "blockwise"):
        check_precision(fp8(recipe), gpu)


def test_a100_refuses_blockwise_naming_the_architectures() -> None:
    message = refusal(fp8("blockwise"), resolve_gpu("a100"))
    assert message == (
        "training.fp8_recipe='blockwise': needs gpu.architecture hopper or blackwell; "
        "A100-SXM4-80GB's is 'ampere', without FP8 tensor cores: train in bf16"
    )
    assert "\n" not in message
    # the default recipe on an A100 keeps its message: no FP8 tensor cores
    assert refusal(fp8(), resolve_gpu("a100")).startswith("training.precision='fp8': FP8 needs")


@pytest.mark.parametrize("name", HOPPER)
def test_mxfp8_refused_on_hopper(name: str) -> None:
    assert refusal(fp8("mxfp8"), GPU_CATALOG[name]) == (
        f"training.fp8_recipe='mxfp8': runs on Blackwell GPUs (B200, GB200) only, not {name}; "
        "use delayed, tensorwise or blockwise"
    )


@pytest.mark.parametrize("name", BLACKWELL)
def test_mxfp8_on_blackwell(name: str) -> None:
    assert is_blackwell(GPU_CATALOG[name]) and not is_hopper(GPU_CATALOG[name])
    check_precision(fp8("mxfp8"), GPU_CATALOG[name])


# ------------------------------------------------------------------ user GPUs
def test_a_user_gpu_file_without_the_architecture_loads(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    cluster = {"format": FORMAT, "gpu": X1, "num_nodes": 2, "gpus_per_node": 2,
               "nic_bandwidth_gb_per_s": 25, "node_bandwidth_gb_per_s": [[None, 20], [20, None]]}  # fmt: skip
    path.write_text(yaml.safe_dump(cluster))
    gpu = read_cluster_file(path).gpu_of_node(0)
    assert gpu.architecture == "unknown" and gpu.vendor == "NVIDIA"
    assert gpu.compute_capability is None and gpu_family(gpu) == ""
    check_precision(fp8(), gpu.model_copy(update={"peak_fp8_flops_per_s": 1e15}))
    assert refusal(fp8("blockwise"), gpu) == (
        "training.fp8_recipe='blockwise': needs gpu.architecture hopper or blackwell; X1's "
        "is 'unknown' (not given, and its name tells none): set gpu.architecture if it is "
        "one, else train in bf16"
    )
    training = TrainingSpec(global_batch_size=8, seq_length=256, attention_kernel="flash3")
    with pytest.raises(SpecError, match=r"set gpu\.architecture to hopper if it is one\)"):
        stack_kernel(training, gpu)
    assert stack_kernel(training.model_copy(update={"attention_kernel": None}), gpu) == "flash2"
    assert before_blackwell(small_instance(gpu=X1))  # no compute capability: the safe side


@pytest.mark.parametrize(
    ("name", "architecture"),
    [("NVIDIA H800 PCIe", "hopper"), ("H20", "hopper"), ("GH200-120GB", "hopper"),
     ("B300-custom", "blackwell"), ("NVIDIA GB300", "blackwell"), ("A800", "ampere"),
     ("L40S", "ada"), ("Tesla T4", "turing"), ("AMD Instinct MI355X", "cdna4"),
     ("MI250X", "cdna2"), ("H200X", "hopper"), ("X20", "unknown"), ("AMD thing", "unknown")],
)  # fmt: skip
def test_the_name_tells_the_architecture_when_not_given(name: str, architecture: str) -> None:
    assert resolve_gpu({**X1, "name": name}).architecture == architecture


def test_a_given_architecture_wins_over_the_name() -> None:
    fast = resolve_gpu({**X1, "peak_fp8_flops_per_s": 1e15, "architecture": "blackwell"})
    check_precision(fp8("mxfp8"), fast)
    plan = make_plan(num_layers=8, dp=4, pp=1, tp=2, micro_batch_size=1)
    instance = small_instance(gpu=fast.model_dump())
    assert not before_blackwell(instance) and megatron_environment(instance, plan) == {}
    amd = resolve_gpu({**X1, "architecture": "cdna3"})
    training = TrainingSpec(global_batch_size=8, seq_length=256, attention_kernel="cudnn")
    assert amd.vendor == "AMD"
    with pytest.raises(SpecError, match="runs on NVIDIA GPUs only, not X1 \\(AMD\\)"):
        stack_kernel(training, amd)
    assert resolve_gpu({**X1, "name": "AMD-badge", "architecture": "hopper"}).vendor == "NVIDIA"
    pre_fp8 = resolve_gpu({**X1, "name": "A100-fp8", "peak_fp8_flops_per_s": 1e15})
    assert refusal(fp8(), pre_fp8) == (
        "training.precision='fp8': needs gpu.architecture ada, hopper, blackwell, cdna3 or "
        "cdna4; A100-fp8's is 'ampere': train in bf16"
    )


def test_a_misspelt_architecture_is_refused() -> None:
    with pytest.raises(SpecError, match=r"^gpu\.architecture='hoper': Input should be 'volta'"):
        resolve_gpu({**X1, "architecture": "hoper"})


# ------------------------------------------------------------------ kernels, launch, calibration
@pytest.mark.parametrize("name", HOPPER)
def test_every_hopper_part_runs_flash3_and_defaults_to_cudnn(name: str) -> None:
    training = TrainingSpec(global_batch_size=8, seq_length=256)
    gpu = GPU_CATALOG[name]
    assert stack_kernel(training, gpu) == "cudnn"
    assert stack_kernel(training.model_copy(update={"attention_kernel": "flash3"}), gpu) == "flash3"


@pytest.mark.parametrize("name", ["b300", "gb300", "h800", "h20", "gh200"])
def test_the_launch_rule_reads_the_compute_capability(name: str) -> None:
    plan = make_plan(num_layers=8, dp=4, pp=1, tp=2, micro_batch_size=1)
    instance = small_instance(gpu=name)
    older = name.startswith(("h", "gh"))
    assert before_blackwell(instance) is older
    assert megatron_environment(instance, plan) == ({"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if older else {})  # fmt: skip


def test_calibration_family_by_architecture() -> None:
    h100 = calibration_for(resolve_gpu("h100"))
    for name in ("h800", "h20", "gh200", "gh200-144gb"):
        assert calibration_for(resolve_gpu(name)) == h100, name  # Hopper: H100's fit
    b200 = calibration_for(resolve_gpu("b200"))
    assert b200.fitted and b200.gpu_family == "B200"  # fitted on modern_runs.csv
    for name in ("b300", "gb300", "gb200"):
        assert calibration_for(resolve_gpu(name)) == b200, name
