"""Options shared by the commands that take an instance (``predict``, ``solve``).

An instance bundles model, cluster and training; these options replace a part of
it, so a measured cluster or another model can be used without writing an
instance file::

    pipette-cp solve --model llama-2-7b --cluster cluster.yaml --global-batch 512
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipette_cp.io.cluster_file import read_cluster_file
from pipette_cp.io.instance_file import load_instance
from pipette_cp.io.model_file import load_model
from pipette_cp.io.profile_file import load_layer_profile
from pipette_cp.specs import Instance, TrainingSpec, validate_spec

ModelOption = Annotated[
    str | None,
    typer.Option(
        "--model", help="Replace the instance's model: bundled name, YAML, or HF config.json."
    ),
]
ClusterOption = Annotated[
    Path | None,
    typer.Option(
        "--cluster", help="Replace the instance's cluster: a cluster file (e.g. from import)."
    ),
]
ProfileOption = Annotated[
    Path | None,
    typer.Option("--profile", help="Measured layer times (pipette-cp profile) for the compute."),
]
GlobalBatchOption = Annotated[
    int | None, typer.Option("--global-batch", help="Replace the global batch (sequences).")
]
SeqLengthOption = Annotated[
    int | None, typer.Option("--seq-length", help="Replace the sequence length (tokens).")
]


def resolve_instance(
    instance: str,
    *,
    model: str | None = None,
    cluster: Path | None = None,
    profile: Path | None = None,
    global_batch: int | None = None,
    seq_length: int | None = None,
) -> Instance:
    """Load ``instance`` and apply the command-line replacements (validated)."""
    inst = load_instance(instance)
    update: dict = {}
    if model is not None:
        update["model"] = load_model(model)
    if cluster is not None:
        update["cluster"] = read_cluster_file(cluster)
    if profile is not None:
        update["profile"] = load_layer_profile(profile)
    training = {
        k: v
        for k, v in (("global_batch_size", global_batch), ("seq_length", seq_length))
        if v is not None
    }
    if training:
        update["training"] = validate_spec(
            TrainingSpec, {**inst.training.model_dump(), **training}, "training"
        )
    if not update:
        return inst
    if model is not None or cluster is not None:
        update["best_known"] = None  # it belonged to the original pair
        model_name = update["model"].name if model is not None else inst.model.name
        update["name"] = f"{model_name}-on-{cluster.stem if cluster is not None else inst.name}"
    return validate_spec(Instance, {**dict(inst), **update}, "instance")
