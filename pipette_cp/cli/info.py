"""``pipette-cp list``, ``show`` and ``schema``."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from pipette_cp.cli.console import console
from pipette_cp.clusters.generators.registry import ALL_GENERATORS
from pipette_cp.clusters.generators.trees import TREE_GENERATORS
from pipette_cp.io.cluster_file import read_cluster_file
from pipette_cp.io.files import read_mapping
from pipette_cp.io.huggingface.config import is_hf_config
from pipette_cp.io.instance_file import DEFAULT_INSTANCE, list_instances, load_instance
from pipette_cp.io.model_file import list_models, load_model
from pipette_cp.io.output_paths import check_output_dir, output_error
from pipette_cp.report.reference import schemas as file_schemas
from pipette_cp.report.show import cluster_table, instance_report, model_table
from pipette_cp.specs import GPU_CATALOG, SCHEMA_SPECS


class Catalogue(StrEnum):
    instances = "instances"
    models = "models"
    gpus = "gpus"
    generators = "generators"


def list_(
    what: Annotated[Catalogue, typer.Argument(help="What to list.")] = Catalogue.instances,
) -> None:
    """List bundled instances, models, GPU types or cluster generators."""
    if what is Catalogue.gpus:
        table = Table(
            "name", "architecture", "memory GiB", "bf16 TFLOP/s", "fp8 TFLOP/s", "fp4 TFLOP/s",
            "HBM GB/s", "NVLink GB/s (1 dir)",
        )  # fmt: skip
        for gpu in GPU_CATALOG.values():
            fp8, fp4 = gpu.peak_fp8_flops_per_s, gpu.peak_fp4_flops_per_s
            table.add_row(
                gpu.name,
                gpu.architecture,
                f"{gpu.memory_bytes / 2**30:.1f}",
                f"{gpu.peak_flops_per_s / 1e12:.0f}",
                f"{fp8 / 1e12:.0f}" if fp8 is not None else "-",
                f"{fp4 / 1e12:.0f}" if fp4 is not None else "-",
                f"{gpu.hbm_bandwidth_bytes_per_s / 1e9:.0f}",
                f"{gpu.nvlink_bandwidth_bytes_per_s / 1e9:.0f}",
            )
        console.print(table)
        return
    names = {
        Catalogue.instances: list_instances,
        Catalogue.models: list_models,
        Catalogue.generators: lambda: sorted([*ALL_GENERATORS, *TREE_GENERATORS]),
    }[what]()
    for name in names:
        suffix = "  (default)" if what is Catalogue.instances and name == DEFAULT_INSTANCE else ""
        console.print(name + suffix, highlight=False)


def show(
    instance: Annotated[
        str,
        typer.Argument(
            help="Bundled instance name, or path to an instance file, a cluster file, or a "
            "model (a Hugging Face config.json or the folder holding one)."
        ),
    ] = DEFAULT_INSTANCE,
) -> None:
    """Model parameters, cluster summary (bandwidth statistics, slowest and failed pairs).

    A cluster file (``format: pipette-cp-cluster/1``) shows the cluster part only; a
    Hugging Face ``config.json`` (or its folder) the model part only."""
    path = Path(instance)
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if path.is_file():
        data = read_mapping(path)
        if str(data.get("format", "")).startswith("pipette-cp-cluster"):
            console.print(cluster_table(read_cluster_file(path)))
            return
        if is_hf_config(data):
            console.print(model_table(load_model(path)))
            return
    console.print(instance_report(load_instance(instance)))


def schema(
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Directory to write the .schema.json files into.")
    ],
    specs: Annotated[
        bool,
        typer.Option(
            "--specs",
            help="The Python API's specs (<Spec>.schema.json, SI units) "
            "instead of the files users write.",
        ),
    ] = False,
) -> None:
    """Write the JSON Schema of every file users write: cluster, instance, model, plan
    and profile (<kind>.schema.json; an editor can check a file against it)."""
    check_output_dir(out, "--out")
    documents = (
        {f"{s.__name__}.schema.json": s.model_json_schema() for s in SCHEMA_SPECS}
        if specs
        else file_schemas()
    )
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, document in documents.items():
            path = out / name
            path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
            console.print(f"wrote {path}", highlight=False)
    except OSError as exc:
        raise output_error("--out", out, exc) from None
