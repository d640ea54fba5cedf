"""The files users write, as schemas: cluster (dense or fabric) and instance files.

The readers (:mod:`pipette_cp.io.cluster_file`, :mod:`pipette_cp.io.fabric_file`,
:mod:`pipette_cp.io.instance_file`) check every rule and convert to SI units; these
models say what each key is, in the units the file uses, for ``pipette-cp schema`` (a
JSON Schema an editor can check a file against) and for the reference pages.  The
key sets are the readers' own (tests hold them equal), so neither can drift.  The model
file is :class:`~pipette_cp.specs.ModelSpec` itself and the profile file
:class:`~pipette_cp.specs.LayerProfile`; the plan file is in the report layer.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pipette_cp.specs import BestKnown, ModelSpec, SearchSpace, TrainingSpec

_STRICT = ConfigDict(extra="forbid")
#: A GB/s matrix row: null or 0 is a failed pair.
Row = list[float | None]
Gpu = str | dict[str, Any]


class FabricLevel(BaseModel):
    """One switch level of a fabric, innermost first."""

    model_config = _STRICT
    name: str = Field(description="The level's name (leaf, pod, spine, ...).")
    nodes: int = Field(gt=0, description="Nodes under one switch of this level; each level's "
                       "count divides the next one's, and the last level holds every node.")  # fmt: skip
    bandwidth_gb_per_s: float = Field(gt=0, description="GB/s of one GPU-to-GPU stream "
                                      "between two nodes whose lowest common level is this one.")  # fmt: skip
    latency_us: float | None = Field(None, ge=0, description="Latency across this level, us "
                                     "(default: inter_node_latency_us).")  # fmt: skip


class SlowNics(BaseModel):
    """NICs slower than their level says: parallel lists."""

    model_config = _STRICT
    node: list[int] = Field(description="Node index (from 0, in node_names order).")
    nic_factor: list[float] = Field(description="Each node's NIC bandwidth as a fraction of "
                                    "nominal (0-1].")  # fmt: skip


class PairList(BaseModel):
    """Pairs whose bandwidth differs from their level's: parallel lists, one direction each."""

    model_config = _STRICT
    src: list[int] = Field(description="Sending node (or GPU) index, from 0.")
    dst: list[int] = Field(description="Receiving node (or GPU) index, from 0.")
    bandwidth_gb_per_s: list[float] = Field(description="GB/s of the pair; 0 = failed.")


class Fabric(BaseModel):
    """Switch levels plus sparse exceptions: a cluster of any size without a matrix."""

    model_config = _STRICT
    nvlink_bandwidth_gb_per_s: float | None = Field(
        None, gt=0, description="GB/s between two GPUs of one node (default: the GPU's NVLink)."
    )
    nvlink_latency_us: float | None = Field(
        None, ge=0, description="Latency between two GPUs of one node, us "
        "(default: intra_node_latency_us).")  # fmt: skip
    levels: list[FabricLevel] = Field(min_length=1, description="Switch levels, innermost first.")
    slow_nics: SlowNics | None = Field(None, description="Nodes whose NICs are slow.")
    node_pairs: PairList | None = Field(None, description="Node pairs off their level's bandwidth.")
    gpu_pairs: PairList | None = Field(None, description="GPU pairs off their nodes' bandwidth.")
    exceptions: str | None = Field(
        None, description="Instead of the three lists: a NAME.npz file beside the YAML, "
        "written by the tool beyond 10,000 exceptions.")  # fmt: skip


class ClusterFile(BaseModel):
    """A cluster: its GPUs and the bandwidth between every pair of them.

    Give exactly one of ``node_bandwidth_gb_per_s``, ``gpu_bandwidth_gb_per_s``,
    ``nominal: true`` (with ``inter_node_bandwidth_gb_per_s``) or ``fabric`` (a
    one-node cluster may give none).  GB/s is 1e9 bytes/s, as nccl-tests prints it:
    what one GPU-to-GPU stream delivers under load, one direction."""

    model_config = _STRICT
    format: Literal["pipette-cp-cluster/1"] = Field(
        description="The file's format; required in a cluster file, optional inline."
    )
    name: str | None = Field(None, description="The cluster's name (default: the file's).")
    source: str | None = Field(None, description="Where the numbers come from (free text).")
    gpu: Gpu | None = Field(None, description="GPU of every node: a catalogue name or alias "
                            "(`pipette-cp list gpus`), or a mapping of GPU fields.")  # fmt: skip
    node_gpu_types: list[Gpu] | None = Field(
        None, description="Instead of gpu: one GPU per node (a mixed cluster)."
    )
    gpus_per_node: int = Field(gt=0, description="GPUs in each node.")
    num_nodes: int | None = Field(None, gt=0, description="Nodes (default: the matrix's size, "
                                  "the node_names or a fabric's last level).")  # fmt: skip
    nics_per_node: int | None = Field(None, gt=0, description="NICs of a node for traffic "
                                      "between nodes (default: gpus_per_node).")  # fmt: skip
    nic_bandwidth_gb_per_s: float | None = Field(
        None, gt=0, description="GB/s of one NIC, one direction, under load (default: the "
        "median healthy inter-node pair, or a fabric's leaf level).")  # fmt: skip
    intra_node_bandwidth_gb_per_s: float | list[Row] | None = Field(
        None, description="GB/s between GPUs of one node: a number or a G x G matrix "
        "(default: the GPU's NVLink, named as an assumption).")  # fmt: skip
    inter_node_bandwidth_gb_per_s: float | None = Field(
        None, gt=0, description="With nominal: true, GB/s of every node pair."
    )
    intra_node_latency_us: float | None = Field(None, ge=0, description="Latency inside a "
                                                "node, us (default 5).")  # fmt: skip
    inter_node_latency_us: float | None = Field(None, ge=0, description="Latency between "
                                                "nodes, us (default 10).")  # fmt: skip
    node_names: list[str] | None = Field(None, description="Host names, one per node, in "
                                         "the matrix's order (default node000, ...).")  # fmt: skip
    node_groups: list[int] | None = Field(None, description="Switch group of each node "
                                          "(leaf, rail), for reports and the search.")  # fmt: skip
    nodes_per_nvlink_domain: int | None = Field(
        None, gt=0, description="Nodes sharing one NVLink domain (GB200 NVL72: 18 trays)."
    )
    nvlink_domains: list[int] | None = Field(
        None, description="Instead of nodes_per_nvlink_domain: the domain of every node "
        "(or every GPU, as nvidia-smi -q reports its NVLink clique).")  # fmt: skip
    node_bandwidth_gb_per_s: list[Row] | None = Field(
        None, description="N x N GB/s between nodes, row = sender; null or 0 = failed pair; "
        "the diagonal is ignored.")  # fmt: skip
    gpu_bandwidth_gb_per_s: list[Row] | None = Field(
        None, description="The full GPU x GPU GB/s matrix (nodes in order, each node's "
        "GPUs together); null or 0 = failed pair.")  # fmt: skip
    nominal: bool | None = Field(None, description="true: every node pair at "
                                 "inter_node_bandwidth_gb_per_s (a cluster on paper).")  # fmt: skip
    fabric: Fabric | None = Field(None, description="Switch levels and exceptions, instead "
                                  "of a matrix (any size).")  # fmt: skip


class Generator(BaseModel):
    """A seeded synthetic cluster (`pipette-cp list generators`; each generator's own
    parameters: `pipette-cp cluster generate KIND --help`)."""

    model_config = ConfigDict(extra="allow")
    kind: str = Field(description="Generator name or alias (degraded, fat-tree, g3, ...).")
    nodes: int | None = Field(None, gt=0, description="Nodes (or give gpus).")
    gpus: int | None = Field(None, gt=0, description="GPUs, instead of nodes.")
    seed: int = Field(description="Random seed: the same seed gives the same cluster.")
    snapshot: int | None = Field(None, ge=0, description="Timeline generators: which snapshot.")


class GeneratedCluster(BaseModel):
    model_config = _STRICT
    generator: Generator = Field(description="Generate the cluster.")


class ClusterReference(BaseModel):
    model_config = _STRICT
    file: str = Field(description="A cluster file, relative to the instance file, then to "
                      "the bundled instances.")  # fmt: skip


class HfConfigReference(BaseModel):
    model_config = _STRICT
    hf_config: str = Field(description="A Hugging Face config.json (or its folder), "
                           "relative to the instance file, then to the working folder.")  # fmt: skip


class InlineCluster(ClusterFile):
    format: Literal["pipette-cp-cluster/1"] | None = Field(  # type: ignore[assignment]
        None, description="Optional inline."
    )


class InstanceFile(BaseModel):
    """A training job: a model, a cluster and the training settings, plus optional
    restrictions of the search."""

    model_config = _STRICT
    name: str | None = Field(None, description="The instance's name (default: the file's).")
    description: str | None = Field(None, description="Free text.")
    family: str | None = Field(None, description="A label grouping instances in reports.")
    model: str | HfConfigReference | ModelSpec = Field(
        description="A bundled model name (`pipette-cp list models`); a model file or a "
        "Hugging Face config.json, relative to the instance file, then to the working "
        "folder; {hf_config: PATH}; or the model's fields inline (see the model file).")  # fmt: skip
    cluster: str | GeneratedCluster | ClusterReference | InlineCluster = Field(
        description="A cluster file's path, {generator: ...}, {file: PATH}, or a cluster "
        "file's fields inline.")  # fmt: skip
    training: TrainingSpec = Field(description="Batch, sequence, precision, kernels, "
                                   "optimizer and memory settings.")  # fmt: skip
    search_space: SearchSpace | None = Field(None, description="Restrictions of the search "
                                             "(each a list of allowed values).")  # fmt: skip
    best_known: BestKnown | None = Field(None, description="Written by `pipette-cp bench "
                                         "update-best-known`.")  # fmt: skip
    profile: str | None = Field(None, description="A layer profile (`pipette-cp profile`), "
                                "relative to the instance file.")  # fmt: skip
