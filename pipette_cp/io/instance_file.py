"""Benchmark instance files: model + cluster + training (+ search space, best known).

An instance is one YAML file.  Each part may be given inline or by reference::

    name: llama2-7b-g3-32
    family: degraded
    model: llama-2-7b                 # bundled name | path.yaml | HF config.json | mapping
    cluster:                          # exactly one of:
      generator: {kind: degraded, nodes: 4, seed: 1}
      # generator: {kind: fat-tree, gpus: 16384, seed: 0}   (any size: gpus or nodes)
      # file: clusters/h100-cluster00.yaml   (relative to this file, then instances/)
      # ...or the fields of a cluster file inline (see pipette_cp.io.cluster_file)
    training: {global_batch_size: 512, seq_length: 4096}
    search_space: {tp: [1, 2, 4, 8]}  # optional restrictions
    best_known: null                  # filled by the benchmark suite
    profile: layer-profile.json       # optional measured layer times (pipette-cp profile)
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import Any

import yaml

from pipette_cp.clusters.generators.registry import generate, generate_timeline
from pipette_cp.errors import InputFileError, SpecError
from pipette_cp.io.cluster_file import FORMAT as CLUSTER_FORMAT
from pipette_cp.io.cluster_file import cluster_from_mapping, read_cluster_file
from pipette_cp.io.files import parse_yaml, read_mapping, read_text
from pipette_cp.io.model_file import load_model, model_from_mapping
from pipette_cp.io.paths import INSTANCES_DIR
from pipette_cp.io.profile_file import load_layer_profile
from pipette_cp.specs import (
    BestKnown,
    ClusterSpec,
    Instance,
    LayerProfile,
    ModelSpec,
    SearchSpace,
    TrainingSpec,
    validate_spec,
)
from pipette_cp.specs.selection import gpu_totals

#: The instance `pipette-cp solve` uses when none is named.
DEFAULT_INSTANCE = "gpt3-2.7b-g1-64"

_PARTS = {
    "name",
    "description",
    "family",
    "model",
    "cluster",
    "training",
    "search_space",
    "best_known",
    "profile",
}


def list_instances() -> list[str]:
    """Names of the bundled instances (files ``instances/*.yaml``)."""
    return sorted(p.stem for p in INSTANCES_DIR.glob("*.yaml"))


def instance_path(name_or_path: str | Path) -> Path:
    """Resolve a bundled instance name or a path to its file."""
    path = Path(name_or_path)
    if path.suffix in {".yaml", ".yml", ".json"} or path.exists():
        if not path.exists():
            raise InputFileError(path, "no such file")
        return path
    bundled = INSTANCES_DIR / f"{name_or_path}.yaml"
    if bundled.exists():
        return bundled
    close = difflib.get_close_matches(str(name_or_path), list_instances(), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see `pipette-cp list`"
    raise SpecError("instance", str(name_or_path), f"no such file or bundled instance{hint}")


def load_instance(name_or_path: str | Path) -> Instance:
    """Load an instance by bundled name or path; errors name the offending field."""
    path = instance_path(name_or_path)
    return instance_from_mapping(read_mapping(path), base_dir=path.parent, default_name=path.stem)


def load_best_known(name_or_path: str | Path) -> BestKnown | None:
    """The ``best_known`` entry of an instance file, without building the instance."""
    path = instance_path(name_or_path)
    value = read_mapping(path).get("best_known")
    return validate_spec(BestKnown, value, "best_known") if value else None


_BEST_KNOWN_LINE = re.compile(r"^best_known\s*:")


def write_best_known(name_or_path: str | Path, best: BestKnown | None) -> Path:
    """Rewrite the ``best_known:`` entry of an instance file, keeping every other line
    (comments, order, formatting) as it is; the entry is appended if missing.

    Returns the path written.  JSON instance files are rewritten whole.  A YAML file
    whose rewritten text would not read back as its old mapping with the new entry
    (e.g. a flow-style ``{...}`` top level) is left alone: :class:`InputFileError`.
    """
    path = instance_path(name_or_path)
    value = None if best is None else best.model_dump()
    if path.suffix.lower() == ".json":
        data = read_mapping(path)
        data["best_known"] = value
        path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        return path
    entry = yaml.safe_dump({"best_known": value}, sort_keys=False, width=120)
    before = read_mapping(path)
    lines = read_text(path).splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if _BEST_KNOWN_LINE.match(line)), None)
    if start is None:
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        lines.append(entry)
    else:
        end = start + 1
        # the entry's value: indented lines (blank lines only when more indented ones follow)
        while end < len(lines) and (lines[end][:1] in (" ", "\t") or not lines[end].strip()):
            end += 1
        while end > start + 1 and not lines[end - 1].strip():
            end -= 1
        lines[start:end] = [entry]
    text = "".join(lines)
    if parse_yaml(text, path) != {**before, "best_known": value}:
        raise InputFileError(
            path,
            "cannot rewrite its best_known: entry in place (not a block mapping at the "
            "top level?); the file is left as it was",
        )
    path.write_text(text, encoding="utf-8")
    return path


def bundled_instance_file(name_or_path: str | Path) -> Path:
    """The file of a bundled instance: a regular ``.yaml``/``.json`` file inside the
    instances directory (symbolic links resolved) that is an instance file (model,
    cluster and training at its top level).  The files ``pipette-cp bench
    update-best-known`` may write.

    Raises
    ------
    SpecError
        Anything else (a file elsewhere, a cluster file, a link leading out).
    InputFileError
        The file is missing or unreadable.
    """
    path = instance_path(name_or_path)
    root = INSTANCES_DIR.resolve()
    real = path.resolve()
    if not real.is_relative_to(root) or real.suffix.lower() not in {".yaml", ".yml", ".json"}:
        raise SpecError(
            "instance", str(name_or_path), f"not an instance file under {INSTANCES_DIR}"
        )
    data = read_mapping(real)
    missing = [part for part in ("model", "cluster", "training") if part not in data]
    if missing or set(data) - _PARTS:
        what = f"no {missing[0]}:" if missing else "unknown top-level keys"
        raise SpecError("instance", str(name_or_path), f"{real} is not an instance file ({what})")
    return real


#: Keys of a cluster file that no instance has (a cluster file given as an instance).
_CLUSTER_ONLY_KEYS = frozenset({"gpu", "node_gpu_types", "gpus_per_node", "node_bandwidth_gb_per_s",
                                "gpu_bandwidth_gb_per_s", "fabric", "node_names"})  # fmt: skip


def instance_from_mapping(
    data: dict[str, Any], *, base_dir: Path = INSTANCES_DIR, default_name: str = "instance"
) -> Instance:
    """Build an :class:`Instance` from the parsed YAML of an instance file."""
    unknown = sorted(set(data) - _PARTS, key=repr)  # YAML keys may be null, numbers or ''
    if unknown and "model" not in data and set(data) & _CLUSTER_ONLY_KEYS:
        raise SpecError("format", data.get("format"), "this looks like a cluster file "
                        f"without its 'format: {CLUSTER_FORMAT}' line (add it)")  # fmt: skip
    if unknown:
        key = unknown[0]
        raise SpecError(
            key if isinstance(key, str) and key.strip() else repr(key),
            data[key],
            f"unknown instance field; expected {sorted(_PARTS)}",
        )
    for part in ("model", "cluster", "training"):
        if part not in data:
            raise SpecError(part, None, "missing; every instance needs model, cluster and training")
    instance = Instance(
        name=str(data.get("name") or default_name),
        description=str(data.get("description") or ""),
        family=str(data.get("family") or ""),
        model=_model(data["model"], base_dir),
        cluster=_cluster(data["cluster"], base_dir),
        training=validate_spec(TrainingSpec, data["training"], "training"),
        search_space=validate_spec(SearchSpace, data.get("search_space") or {}, "search_space"),
        best_known=(
            validate_spec(BestKnown, data["best_known"], "best_known")
            if data.get("best_known")
            else None
        ),
        profile=_profile(data["profile"], base_dir) if data.get("profile") else None,
    )
    gpu_totals(instance.cluster, instance.search_space)  # excluded nodes exist, min_gpus fits
    return instance


def _profile(value: Any, base_dir: Path) -> LayerProfile:
    if isinstance(value, dict):
        return validate_spec(LayerProfile, value, "profile")
    return load_layer_profile(_relative(value, base_dir))


def _model(value: Any, base_dir: Path) -> ModelSpec:
    if isinstance(value, dict):
        if "hf_config" in value:
            return load_model(_relative(value["hf_config"], base_dir))
        return model_from_mapping(value, "model")
    if isinstance(value, str):
        candidate = base_dir / value
        return load_model(candidate if candidate.is_file() else value)
    raise SpecError(
        "model", value, "expected a model name, a file path or a mapping of ModelSpec fields"
    )


def _cluster(value: Any, base_dir: Path) -> ClusterSpec:
    if isinstance(value, str):
        return read_cluster_file(_relative(value, base_dir))
    if not isinstance(value, dict):
        raise SpecError("cluster", value, "expected a mapping (generator:, file: or inline fields)")
    if "generator" in value:
        return _generated(value["generator"])
    if "file" in value:
        return read_cluster_file(_relative(value["file"], base_dir))
    return cluster_from_mapping(value, "cluster", base_dir)


def _generated(recipe: Any) -> ClusterSpec:
    if not isinstance(recipe, dict) or "kind" not in recipe:
        raise SpecError("cluster.generator", recipe, "expected a mapping with kind, nodes and seed")
    params = dict(recipe)
    kind = params.pop("kind")
    for key in ("nodes", "seed"):
        if key not in params and not (key == "nodes" and "gpus" in params):
            raise SpecError(f"cluster.generator.{key}", None, "missing")
    snapshot = params.pop("snapshot", None)
    if snapshot is None:
        return generate(kind, **params)
    if not isinstance(snapshot, int) or snapshot < 0:
        raise SpecError("cluster.generator.snapshot", snapshot, "expected a non-negative integer")
    timeline = generate_timeline(kind, snapshots=snapshot + 1, **params)
    return timeline[snapshot]


def _relative(value: Any, base_dir: Path) -> Path:
    if not isinstance(value, str | Path):
        raise SpecError("file", value, "expected a file path")
    path = Path(value)
    for candidate in (path, base_dir / path, INSTANCES_DIR / path):
        if candidate.exists():
            return candidate
    raise InputFileError(path, f"no such file (looked in . , {base_dir} and {INSTANCES_DIR})")
