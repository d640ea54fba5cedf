"""The GPU catalogue: each entry's numbers are the ones its source string cites, the
aliases resolve, and the Blackwell and AMD parts are told apart where kernels and
launch rules depend on the GPU."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pipette_cp.clusters.generators.registry import generate
from pipette_cp.cost.evaluator.evaluate import evaluate
from pipette_cp.cost.stack.calibration import calibration_for
from pipette_cp.cost.stack.kernels import is_hopper, stack_kernel
from pipette_cp.errors import SpecError
from pipette_cp.io.measurements.devices import gpu_from_device_name
from pipette_cp.io.model_file import load_model
from pipette_cp.report.megatron.flags import before_blackwell, megatron_environment
from pipette_cp.specs import Instance, SearchSpace, TrainingSpec, resolve_gpu, validate_spec
from pipette_cp.specs.gpu import FLOPS_RANGE, GPU_CATALOG, GpuSpec
from pipette_cp.specs.layouts import make_plan
from pipette_cp.units import GB, TB, TFLOPS, MiB


@dataclass(frozen=True)
class Datasheet:
    """What the datasheet says (the strings must appear in the entry's source)."""

    mem_mib: int  # what nvidia-smi / rocm-smi reports
    mem_gb: int  # the datasheet's GB
    bf16_tflops: float
    fp8_tflops: float | None
    hbm_tb_per_s: float
    link_bidir_gb_per_s: float
    cited: tuple[str, ...]


SHEETS = {
    "H100-SXM5-80GB": Datasheet(81559, 80, 989, 1979, 3.35, 900,
                                ("989 TFLOP/s dense bf16", "1979 TFLOP/s dense fp8",
                                 "3.35 TB/s", "NVLink 900 GB/s")),
    "H200-SXM-141GB": Datasheet(143771, 141, 989, 1979, 4.8, 900,
                                ("989 TFLOP/s dense bf16", "1979 TFLOP/s dense fp8",
                                 "4.8 TB/s", "NVLink 900 GB/s")),
    "B200-SXM-180GB": Datasheet(183359, 180, 2250, 4500, 8, 1800,
                                ("180 GB HBM3e", "2250 TFLOP/s dense bf16",
                                 "4500 TFLOP/s dense fp8", "8 TB/s HBM3e", "1.8 TB/s")),
    "GB200-NVL72-186GB": Datasheet(189471, 186, 2500, 5000, 8, 1800,
                                   ("186 GB HBM3e", "2500 TFLOP/s dense bf16",
                                    "5000 TFLOP/s dense fp8", "8 TB/s HBM3e", "1.8 TB/s")),
    "MI300X-OAM-192GB": Datasheet(196288, 192, 1307.4, 2614.9, 5.3, 896,
                                  ("192 GB HBM3", "1307.4 TFLOP/s dense bf16",
                                   "2614.9 TFLOP/s dense fp8", "5.3 TB/s", "896 GB/s")),
    # the Hopper variants and Blackwell Ultra, one line each
    "H800-SXM5-80GB": Datasheet(81559, 80, 989, 1979, 3.35, 400, ("80 GB HBM3", "989 TFLOP/s dense bf16", "1979 TFLOP/s dense fp8", "3.35 TB/s", "NVLink 400 GB/s")),
    "H20-96GB": Datasheet(97871, 96, 148, 296, 4.0, 900, ("96 GB HBM3", "148 TFLOP/s dense bf16", "296 TFLOP/s dense fp8", "4.0 TB/s", "NVLink 900 GB/s", "assumption")),
    "GH200-96GB": Datasheet(97871, 96, 989, 1979, 4.0, 900, ("96 GB HBM3 at 4 TB/s", "989 TFLOP/s dense bf16", "1979 TFLOP/s dense fp8", "NVLink 900 GB/s")),
    "GH200-144GB": Datasheet(146831, 144, 989, 1979, 4.9, 900, ("144 GB HBM3e at 4.9 TB/s", "NVLink-C2C")),
    "B300-SXM-288GB": Datasheet(275040, 288, 2250, 4500, 8, 1800, ("288 GB HBM3e", "2250 TFLOP/s dense bf16", "4500 TFLOP/s dense fp8", "8 TB/s HBM3e", "NVLink 5 1.8 TB/s")),
    "GB300-NVL72-288GB": Datasheet(284208, 288, 2500, 5000, 8, 1800, ("288 GB HBM3e", "2500 TFLOP/s dense bf16", "5000 TFLOP/s dense fp8", "8 TB/s HBM3e (576 TB/s per rack)", "1.8 TB/s")),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(SHEETS))
def test_numbers_are_the_cited_ones(name: str) -> None:
    gpu, sheet = GPU_CATALOG[name], SHEETS[name]
    for text in sheet.cited:
        assert text in gpu.source, (name, text)
    assert gpu.memory_bytes == sheet.mem_mib * MiB
    # the device reports a little more than the datasheet's GB, and less than as many GiB
    assert sheet.mem_gb * GB < gpu.memory_bytes < sheet.mem_gb * 2**30
    assert gpu.peak_flops_per_s == pytest.approx(sheet.bf16_tflops * TFLOPS)
    assert gpu.peak_fp8_flops_per_s == pytest.approx(sheet.fp8_tflops * TFLOPS)
    assert gpu.hbm_bandwidth_bytes_per_s == pytest.approx(sheet.hbm_tb_per_s * TB)
    assert gpu.nvlink_bandwidth_bytes_per_s == pytest.approx(sheet.link_bidir_gb_per_s / 2 * GB)


def test_system_totals_divide_into_the_per_gpu_numbers() -> None:
    """HGX B200 (8 GPUs) and GB200 NVL72 (72 GPUs) quote sparse totals: dense = half."""
    b200, gb200 = GPU_CATALOG["B200-SXM-180GB"], GPU_CATALOG["GB200-NVL72-186GB"]
    assert b200.peak_flops_per_s == pytest.approx(36e15 / 8 / 2)
    assert b200.peak_fp8_flops_per_s == pytest.approx(72e15 / 8 / 2)
    assert gb200.peak_flops_per_s == pytest.approx(360e15 / 72 / 2)
    assert gb200.peak_fp8_flops_per_s == pytest.approx(720e15 / 72 / 2)
    assert gb200.hbm_bandwidth_bytes_per_s == pytest.approx(576e12 / 72)
    assert "13.4 TB per rack" in gb200.source and "1,440 GB per system" in b200.source
    for gpu in (b200, gb200):
        assert "with sparsity" in gpu.source
        assert 2 * gpu.nvlink_bandwidth_bytes_per_s == pytest.approx(1.8e12)


def test_mi300x_link_is_the_aggregate_of_its_seven_links() -> None:
    mi300x = GPU_CATALOG["MI300X-OAM-192GB"]
    assert "7 links x 128 GB/s = 896 GB/s peak aggregate" in mi300x.source
    assert 2 * mi300x.nvlink_bandwidth_bytes_per_s == pytest.approx(7 * 128e9)
    assert "64 GB/s each way" in mi300x.source  # one peer pair: say so, do not model it


def test_fp8_is_none_before_hopper_and_twice_bf16_after() -> None:
    for name, gpu in GPU_CATALOG.items():
        if name.startswith(("V100", "A100")):
            assert gpu.peak_fp8_flops_per_s is None, name
        else:
            fp8 = gpu.peak_fp8_flops_per_s
            assert fp8 == pytest.approx(2 * gpu.peak_flops_per_s, rel=1e-3), name


def test_fp8_peak_is_checked_like_the_bf16_peak() -> None:
    fields = GPU_CATALOG["H100-SXM5-80GB"].model_dump()
    for bad in (1979.0, FLOPS_RANGE[1] * 10):  # TFLOP/s given as FLOP/s; 10 EFLOP/s
        with pytest.raises(SpecError, match=r"^gpu\.peak_fp8_flops_per_s="):
            validate_spec(GpuSpec, {**fields, "peak_fp8_flops_per_s": bad}, "gpu")
    fields.pop("peak_fp8_flops_per_s")
    assert validate_spec(GpuSpec, fields, "gpu").peak_fp8_flops_per_s is None


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("b200", "B200-SXM-180GB"),
        ("B200", "B200-SXM-180GB"),
        ("b200-180gb", "B200-SXM-180GB"),
        ("gb200", "GB200-NVL72-186GB"),
        ("gb200-186gb", "GB200-NVL72-186GB"),
        ("mi300x", "MI300X-OAM-192GB"),
        ("mi300", "MI300X-OAM-192GB"),
        (" MI300X ", "MI300X-OAM-192GB"),
        ("mi300x-oam-192gb", "MI300X-OAM-192GB"),
        ("h200-141gb", "H200-SXM-141GB"),
    ],
)
def test_aliases_resolve(alias: str, name: str) -> None:
    assert resolve_gpu(alias).name == name


def test_vendor_and_architecture_by_name() -> None:
    vendors = {name: gpu.vendor for name, gpu in GPU_CATALOG.items()}
    assert vendors.pop("MI300X-OAM-192GB") == "AMD"
    assert set(vendors.values()) == {"NVIDIA"}
    renamed = {**resolve_gpu("mi300x").model_dump(), "name": "AMD Instinct MI250X"}
    assert resolve_gpu(renamed).vendor == "AMD"
    hopper = {name for name, gpu in GPU_CATALOG.items() if is_hopper(gpu)}
    assert hopper == {"H100-SXM5-80GB", "H200-SXM-141GB", "H800-SXM5-80GB", "H20-96GB",
                      "GH200-96GB", "GH200-144GB"}  # fmt: skip
    assert not calibration_for(GPU_CATALOG["MI300X-OAM-192GB"]).fitted  # the cautious default
    blackwell = {name for name, gpu in GPU_CATALOG.items() if gpu.architecture == "blackwell"}
    assert blackwell == {"B200-SXM-180GB", "GB200-NVL72-186GB", "B300-SXM-288GB",
                         "GB300-NVL72-288GB"}  # fmt: skip
    assert {calibration_for(GPU_CATALOG[name]).gpu_family for name in blackwell} == {"B200"}


def test_kernels_by_vendor() -> None:
    training = TrainingSpec(global_batch_size=8, seq_length=256)

    def kernel(gpu: str, name: str | None = None) -> str:
        t = training if name is None else training.model_copy(update={"attention_kernel": name})
        return stack_kernel(t, resolve_gpu(gpu))

    assert kernel("h100") == "cudnn" and kernel("b200") == "cudnn" and kernel("mi300x") == "flash2"
    assert kernel("a100") == "flash2" and kernel("gb300") == "cudnn"
    assert kernel("b200", "cudnn") == "cudnn" and kernel("gb200", "flash1") == "flash1"
    for gpu in ("b200", "gb200", "mi300x"):
        with pytest.raises(SpecError, match="FlashAttention 3 runs on Hopper"):
            kernel(gpu, "flash3")
    for name in ("cudnn", "flash1"):
        with pytest.raises(SpecError) as info:
            kernel("mi300x", name)
        assert str(info.value) == (
            f"training.attention_kernel='{name}': runs on NVIDIA GPUs only, not "
            "MI300X-OAM-192GB (AMD); use one of flash2, fused-softmax, eager, sdpa-math"
        )


def _instance(gpu: str) -> Instance:
    cluster = generate("healthy-a100", nodes=2, seed=0, gpus_per_node=8, gpu=gpu)
    return Instance(
        name=f"tiny-llama-{gpu}",
        model=load_model("tiny-llama"),
        cluster=cluster,
        training=TrainingSpec(global_batch_size=16, seq_length=1024),
        search_space=SearchSpace(),
    )


@pytest.mark.parametrize("gpu", ["b200", "gb200", "mi300x"])
def test_an_instance_on_the_new_gpus_evaluates(gpu: str) -> None:
    inst = _instance(gpu)
    layers = inst.model.num_layers
    plan = make_plan(num_layers=layers, dp=4, pp=2, tp=2, micro_batch_size=1)
    result = evaluate(inst, plan)
    assert result.fits and result.iteration_time_s > 0
    slower = evaluate(_instance("a100"), plan)  # same fabric, a GPU 4-8x slower
    assert result.iteration_time_s < slower.iteration_time_s
    assert inst.cluster.gpu_of_node(0).memory_bytes > 180 * GB


def test_launch_environment_follows_the_architecture() -> None:
    plan = make_plan(num_layers=4, dp=8, pp=1, tp=2, micro_batch_size=1)
    for gpu, older in (("b200", False), ("gb200", False), ("mi300x", True), ("h100", True)):
        inst = _instance(gpu)
        assert before_blackwell(inst) is older, gpu  # MI300X reports compute capability 9
        expected = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if older else {}
        assert megatron_environment(inst, plan) == expected, gpu


@pytest.mark.parametrize(
    ("device", "name"),
    [
        ("NVIDIA B200", "B200-SXM-180GB"),
        ("NVIDIA GB200", "GB200-NVL72-186GB"),
        ("AMD Instinct MI300X", "MI300X-OAM-192GB"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM5-80GB"),
    ],
)
def test_device_names_of_logs_map_to_the_catalogue(device: str, name: str) -> None:
    assert gpu_from_device_name([device]).name == name
