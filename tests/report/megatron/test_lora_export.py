"""Megatron-LM has no LoRA flags: exporting a LoRA plan is refused with one line naming
``training.lora`` (exit 2), never written as the arguments of full training."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pipette_cp.cli import app
from pipette_cp.errors import UnsupportedError
from pipette_cp.report.megatron.flags import megatron_args, megatron_flags
from pipette_cp.specs.layouts import make_plan
from pipette_cp.specs.lora import LoraSpec
from tests.conftest import small_instance

MESSAGE = (
    "training.lora='rank 16 on linear_qkv, linear_proj': Megatron-LM has no LoRA flags "
    "(LoRA fine-tuning runs in Megatron-Bridge or NeMo); its export would launch full training"
)


def test_the_flags_refuse_a_lora_job() -> None:
    inst = small_instance()
    plan = make_plan(num_layers=8, dp=2, pp=2, tp=2, micro_batch_size=1)
    assert megatron_flags(inst, plan)  # full training exports
    lora = LoraSpec(rank=16, target_modules=("linear_qkv", "linear_proj"))
    tuned = inst.model_copy(update={"training": inst.training.model_copy(update={"lora": lora})})
    for build in (megatron_flags, megatron_args):
        with pytest.raises(UnsupportedError) as err:
            build(tuned, plan)
        assert str(err.value) == MESSAGE and err.value.exit_code == 2


def test_the_export_command_exits_2(tmp_path: Path) -> None:
    instance = tmp_path / "lora.yaml"
    instance.write_text(yaml.safe_dump({
        "model": "gpt3-1.3b",
        "cluster": {"generator": {"kind": "healthy-a100", "nodes": 1, "seed": 0}},
        "training": {"global_batch_size": 16, "seq_length": 2048, "framework": "nemo",
                     "lora": {"rank": 16, "target_modules": ["linear_qkv", "linear_proj"]}},
    }))  # fmt: skip
    plan = make_plan(num_layers=24, dp=8, pp=1, tp=1, micro_batch_size=1)
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(plan.model_dump_json())
    result = CliRunner().invoke(app, ["export", str(plan_file), "--instance", str(instance)])
    assert result.exit_code == 2
    assert f"error: {MESSAGE}" in " ".join(result.output.split())
