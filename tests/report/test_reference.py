"""The reference pages and file schemas are made from the readers: the committed pages
are what the code makes, the schemas' keys are the readers' keys, every example reads,
and every bundled file passes its schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pipette_cp.io import cluster_file, fabric_file, instance_file
from pipette_cp.io.cluster_file import cluster_from_mapping
from pipette_cp.io.file_formats import (
    ClusterFile,
    Fabric,
    FabricLevel,
    InstanceFile,
    PairList,
    SlowNics,
)
from pipette_cp.io.instance_file import instance_from_mapping
from pipette_cp.io.model_file import model_from_mapping
from pipette_cp.io.paths import INSTANCES_DIR, MODELS_DIR
from pipette_cp.report.plan_file import plan_file_model, read_plan_document
from pipette_cp.report.reference import FILE_KINDS, pages, schemas
from pipette_cp.report.reference_examples import examples
from pipette_cp.specs import LayerProfile, ModelSpec, validate_spec

DOCS = Path(__file__).resolve().parents[2] / "docs" / "reference"


@pytest.fixture(scope="module")
def made() -> dict[str, str]:
    return pages()


def test_the_committed_pages_are_what_the_code_makes(made: dict[str, str]) -> None:
    committed = {p.name: p.read_text(encoding="utf-8") for p in DOCS.glob("*.md")}
    assert set(committed) == set(made)
    for name, text in made.items():
        assert committed[name] == text, (
            f"docs/reference/{name} is stale: python -m pipette_cp.report.reference docs/reference"
        )


def test_the_schemas_keys_are_the_readers_keys() -> None:
    assert set(ClusterFile.model_fields) == cluster_file._KEYS
    assert set(Fabric.model_fields) == fabric_file._SECTION_KEYS
    assert set(FabricLevel.model_fields) == fabric_file._LEVEL_KEYS
    assert set(SlowNics.model_fields) == set(fabric_file._GROUPS["slow_nics"])
    for group in ("node_pairs", "gpu_pairs"):
        assert set(PairList.model_fields) == set(fabric_file._GROUPS[group])
    assert set(InstanceFile.model_fields) == instance_file._PARTS


def _examples(kind: str) -> list[str]:
    return [text for _, _, text in examples(kind)]


@pytest.mark.parametrize("text", _examples("cluster"))
def test_every_cluster_example_reads_and_passes_its_schema(text: str) -> None:
    data = yaml.safe_load(text)
    ClusterFile.model_validate(data)
    assert cluster_from_mapping(data).num_gpus > 0


@pytest.mark.parametrize("text", _examples("instance"))
def test_every_instance_example_reads_and_passes_its_schema(text: str) -> None:
    data = yaml.safe_load(text)
    InstanceFile.model_validate(data)
    assert instance_from_mapping(data).cluster.num_gpus > 0


@pytest.mark.parametrize("text", _examples("model"))
def test_every_model_example_reads(text: str) -> None:
    assert model_from_mapping(yaml.safe_load(text)).num_layers > 0


def test_the_profile_and_plan_examples_read() -> None:
    (profile,) = _examples("profile")
    assert validate_spec(LayerProfile, json.loads(profile), "profile").entries
    (plan,) = _examples("plan")
    document = json.loads(plan)
    plan_file_model().model_validate(document)
    assert read_plan_document(document).evaluation is not None


def _bundled(pattern: str) -> list[Path]:
    return sorted(INSTANCES_DIR.glob(pattern))


@pytest.mark.parametrize("path", _bundled("*.yaml"), ids=lambda p: p.stem)
def test_every_bundled_instance_passes_the_instance_schema(path: Path) -> None:
    InstanceFile.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))


@pytest.mark.parametrize("path", _bundled("clusters/*.yaml"), ids=lambda p: p.stem)
def test_every_bundled_cluster_file_passes_the_cluster_schema(path: Path) -> None:
    ClusterFile.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))


@pytest.mark.parametrize("path", sorted(MODELS_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_bundled_model_passes_the_model_schema(path: Path) -> None:
    ModelSpec.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))


def test_a_key_the_reader_refuses_the_schema_refuses() -> None:
    data = yaml.safe_load(_examples("cluster")[0]) | {"nic_bandwidth_gbps": 50}
    with pytest.raises(ValueError, match="nic_bandwidth_gbps"):
        ClusterFile.model_validate(data)
    with pytest.raises(ValueError, match="nic_bandwidth_gbps"):
        cluster_from_mapping(data)


def test_one_schema_and_one_page_per_file_kind(made: dict[str, str]) -> None:
    names = [k.name for k in FILE_KINDS]
    assert sorted(schemas()) == sorted(f"{n}.schema.json" for n in names)
    assert sorted(made) == sorted(["README.md", *(f"{n}.md" for n in names)])
    for name in names:  # every page says what uses the file and shows an example
        assert "Used by:" in made[f"{name}.md"] and "```" in made[f"{name}.md"]
