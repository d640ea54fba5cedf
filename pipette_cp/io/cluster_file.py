"""The project's cluster file (YAML, ``format: pipette-cp-cluster/1``).

Every number is in user units with the unit in its name (GB/s = 1e9 bytes/s as
nccl-tests prints it, us), converted to SI once, here::

    format: pipette-cp-cluster/1
    name: h100-cluster00
    source: nccl-tests sendrecv_perf, ...
    gpu: H100-SXM5-80GB            # catalogue name or alias, or a GpuSpec mapping
    gpus_per_node: 8
    nics_per_node: 8               # default: gpus_per_node
    nic_bandwidth_gb_per_s: 12.41  # one NIC, one direction, under load
    intra_node_bandwidth_gb_per_s: 150.7   # scalar or G x G list; default: NVLink
    intra_node_latency_us: 5
    inter_node_latency_us: 10
    node_names: [cnode2-001, ...]
    node_groups: [0, 0, 1, ...]    # optional (switch group of each node)
    nodes_per_nvlink_domain: 18    # optional (GB200 NVL72: 18 trays a domain)
    node_bandwidth_gb_per_s:       # N x N; null or 0 = failed; diagonal ignored
    - [null, 13.54, 0, ...]

Instead of ``gpu``, a mixed cluster lists ``node_gpu_types`` (one name or
mapping per node).  Instead of ``node_bandwidth_gb_per_s``, a file holds either
``gpu_bandwidth_gb_per_s`` (the full GPU x GPU matrix) or ``nominal: true``
with ``inter_node_bandwidth_gb_per_s`` and ``num_nodes`` or ``node_names`` (one
node may give none of them, and then its ``nic_bandwidth_gb_per_s``).
:func:`write_cluster_file` writes the node form when the GPU matrix is exactly
a node expansion, ``nominal`` when in addition all node pairs are equal, and
the GPU form otherwise.  A cluster of any size gives ``fabric`` (switch levels and
sparse exceptions, :mod:`pipette_cp.io.fabric_file`) instead of a matrix.  Instead of
``nodes_per_nvlink_domain``, ``nvlink_domains`` maps every node (or every GPU, as ``nvidia-smi -q`` reports its NVLink clique) to a
domain id; it must cut the nodes into runs of consecutive whole nodes of one size
(:func:`~pipette_cp.specs.cluster.nodes_per_domain`).  CSV matrices and Pipette's
JSON are in :mod:`pipette_cp.io.matrix_files`, the checks of single fields (and the
expansion of a node matrix to GPUs) in :mod:`pipette_cp.io.cluster_fields`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import yaml

from pipette_cp.clusters.expand import node_matrix_fabric
from pipette_cp.errors import InputFileError, SpecError
from pipette_cp.io.cluster_fields import bandwidth_rows, intra_node_bandwidth, require_size
from pipette_cp.io.cluster_fields import default_names as _default_names
from pipette_cp.io.cluster_fields import expand_gpu_matrix as _expand
from pipette_cp.io.cluster_fields import link_range as _link_range
from pipette_cp.io.cluster_fields import node_gpus as _node_gpus
from pipette_cp.io.cluster_fields import number as _number
from pipette_cp.io.cluster_fields import positive_int as _positive_int
from pipette_cp.io.cluster_fields import same_node as _same_node
from pipette_cp.io.fabric_file import (
    INLINE_EXCEPTIONS_MAX,
    exception_count,
    fabric_from_mapping,
    fabric_num_nodes,
    fabric_to_mapping,
    read_latency_s,
)
from pipette_cp.io.files import read_mapping
from pipette_cp.specs._base import validate_spec
from pipette_cp.specs.cluster import MAX_GPUS_PER_NODE, MAX_LATENCY_S, ClusterSpec, nodes_per_domain
from pipette_cp.specs.gpu import GPU_CATALOG, GpuSpec
from pipette_cp.specs.hierarchy import MAX_DENSE_VIEW_GPUS
from pipette_cp.units import GB, US

FORMAT = "pipette-cp-cluster/1"
#: The three ways of giving the inter-node bandwidth as a matrix (exactly one per file,
#: or a ``fabric``).
MATRIX_KEYS = ("node_bandwidth_gb_per_s", "gpu_bandwidth_gb_per_s", "nominal")
_WAYS = (*MATRIX_KEYS, "fabric")
_KEYS = {
    "format", "name", "source", "gpu", "node_gpu_types", "gpus_per_node", "num_nodes",
    "nics_per_node", "nic_bandwidth_gb_per_s", "intra_node_bandwidth_gb_per_s",
    "inter_node_bandwidth_gb_per_s", "intra_node_latency_us", "inter_node_latency_us",
    "node_names", "node_groups", "nodes_per_nvlink_domain", "nvlink_domains", *_WAYS,
}  # fmt: skip


# ------------------------------------------------------------------ YAML reading
def cluster_from_mapping(
    data: dict[str, Any], where: str = "cluster", base_dir: Path | None = None
) -> ClusterSpec:
    """A :class:`ClusterSpec` from the cluster-file fields (module doc).

    Parameters
    ----------
    data : dict
        The fields, in user units; ``format`` is optional here (an instance file
        may hold a cluster inline).
    where : str
        Prefix of the field names in errors.
    base_dir : Path, optional
        Where a fabric's ``exceptions:`` sidecar is looked for (the file's folder).

    Returns
    -------
    ClusterSpec

    Raises
    ------
    SpecError
        One line naming ``where.field``, the value and what was expected.

    Examples
    --------
    >>> c = cluster_from_mapping({"gpu": "h100", "gpus_per_node": 8, "num_nodes": 2,
    ...     "nominal": True, "inter_node_bandwidth_gb_per_s": 40, "nic_bandwidth_gb_per_s": 50})
    >>> c.describe(), c.matrix[0, 8]
    ('2 x 8 H100-SXM5-80GB, 8 NICs x 50.0 GB/s', np.float64(40000000000.0))
    """
    if not isinstance(data, dict):
        raise SpecError(where, data, "expected a mapping of cluster fields")
    unknown = sorted(set(data) - _KEYS, key=repr)  # YAML keys may be null or numbers
    if unknown:
        key = unknown[0]
        raise SpecError(
            f"{where}.{key if isinstance(key, str) else repr(key)}",
            data[key],
            "unknown field (check its spelling and its unit suffix)",
        )
    if data.get("format", FORMAT) != FORMAT:
        raise SpecError(f"{where}.format", data["format"], f"expected {FORMAT!r}")
    given = [k for k in _WAYS if data.get(k) not in (None, False)]
    names = data.get("node_names")
    one_node = not given and (len(names) if isinstance(names, list) else data.get("num_nodes")) == 1
    if len(given) != 1 and not one_node:
        ways = _WAYS if "fabric" in given else MATRIX_KEYS
        raise SpecError(where, given, f"give exactly one of {', '.join(ways)}")
    g = _positive_int(data, "gpus_per_node", where)
    if g > MAX_GPUS_PER_NODE:
        raise SpecError(f"{where}.gpus_per_node", g, f"at most {MAX_GPUS_PER_NODE} are modelled")
    if one_node:  # no inter-node pair: a 1 x 1 node matrix
        given, node_matrix, n = ["node_bandwidth_gb_per_s"], np.zeros((1, 1)), 1
    elif given[0] == "gpu_bandwidth_gb_per_s":
        gpu_matrix = bandwidth_rows(data[given[0]], f"{where}.{given[0]}")
        if gpu_matrix.shape[0] % g:
            raise SpecError(
                f"{where}.{given[0]}",
                f"{gpu_matrix.shape[0]} rows",
                f"must be a multiple of gpus_per_node={g}",
            )
        n = gpu_matrix.shape[0] // g
    elif given[0] == "fabric":
        n = fabric_num_nodes(data, where)
    elif given[0] == "node_bandwidth_gb_per_s":
        node_matrix = bandwidth_rows(data[given[0]], f"{where}.{given[0]}")
        n = node_matrix.shape[0]
    else:
        n = len(names) if isinstance(names, list) else _positive_int(data, "num_nodes", where)
        require_size(n, g, where)
        inter = _number(data, "inter_node_bandwidth_gb_per_s", where, required=True)
        assert inter is not None  # required=True raised otherwise
        _link_range(inter, f"{where}.inter_node_bandwidth_gb_per_s", pair=False)
        node_matrix = np.full((n, n), inter * GB)
    if given[0] != "fabric":
        require_size(n, g, where)
    if data.get("num_nodes", n) != n:
        raise SpecError(f"{where}.num_nodes", data["num_nodes"], f"the matrix has {n} nodes")
    for key in ("node_names", "node_groups"):
        if isinstance(data.get(key), list) and len(data[key]) != n:
            raise SpecError(f"{where}.{key}", data[key], f"expected {n} entries, one per node")
    gpus = _node_gpus(data, n, where)
    fabric = None
    if given[0] == "fabric":
        fabric = fabric_from_mapping(data, where, num_nodes=n, gpus_per_node=g, base_dir=base_dir,
                                     nvlink_bytes_per_s=gpus[0].nvlink_bandwidth_bytes_per_s)  # fmt: skip
    elif (
        given[0] != "gpu_bandwidth_gb_per_s"
        and n * g > MAX_DENSE_VIEW_GPUS
        and _one_node_domains(data)
    ):  # a node matrix as a fabric: no GPU matrix built
        fabric = node_matrix_fabric(
            node_matrix, intra_node_bandwidth(data, gpus, g, where), g,
            intra_node_latency_s=read_latency_s(data, "intra_node_latency_us", where, 5e-6),
            inter_node_latency_s=read_latency_s(data, "inter_node_latency_us", where, 10e-6),
        )  # fmt: skip
    elif given[0] != "gpu_bandwidth_gb_per_s":
        gpu_matrix = _expand(node_matrix, data, gpus, g, where)
    nics = data.get("nics_per_node", g)
    nic = _number(data, "nic_bandwidth_gb_per_s", where)
    if nic is None and n == 1:
        raise SpecError(f"{where}.nic_bandwidth_gb_per_s", nic, "needed for one node "
                        "(no inter-node pair to take the median of)")  # fmt: skip
    if nic is None and fabric is not None:  # one stream saturates one NIC: the leaf's
        nic = fabric.levels[0].bandwidth_bytes_per_s / GB
    if nic is None:  # one stream saturates one NIC: the median healthy inter-node pair
        off = gpu_matrix[~_same_node(n, g)]
        nic = float(np.median(off[off > 0])) / GB if (off > 0).any() else 0.0
    if nic <= 0:
        raise SpecError(f"{where}.nic_bandwidth_gb_per_s", nic, "must be > 0")
    _link_range(nic, f"{where}.nic_bandwidth_gb_per_s", pair=False)
    fields = {
        "name": data.get("name", "cluster"),
        "num_nodes": n,
        "gpus_per_node": g,
        "gpu_types": {s.name: s for s in gpus},
        "node_gpu_types": tuple(s.name for s in gpus),
        "node_names": tuple(names) if isinstance(names, list) else _default_names(n),
        "node_groups": tuple(data["node_groups"]) if data.get("node_groups") is not None else None,
        "nics_per_node": nics,
        "nic_bandwidth_bytes_per_s": nic * GB,
        "bandwidth_bytes_per_s": gpu_matrix if fabric is None else None,
        "fabric": fabric,
        "source": data.get("source", ""),
    }
    per, domains = data.get("nodes_per_nvlink_domain"), data.get("nvlink_domains")
    if domains is not None:  # an explicit map, checked and turned into its run length
        if per is not None:
            both = ["nodes_per_nvlink_domain", "nvlink_domains"]
            raise SpecError(where, both, f"give at most one of {', '.join(both)}")
        per = nodes_per_domain(domains, n, g, f"{where}.nvlink_domains")
    fields |= {} if per is None else {"nodes_per_nvlink_domain": per}
    for key in ("intra_node_latency", "inter_node_latency"):
        if (value := _number(data, f"{key}_us", where)) is not None:
            if value > MAX_LATENCY_S / US:
                raise SpecError(f"{where}.{key}_us", value, f"above {MAX_LATENCY_S / US:g} us")
            fields[f"{key}_s"] = value / (1 / US)  # us -> s; keeps 5 us == 5e-6 exactly
    return validate_spec(ClusterSpec, fields, where)


def _one_node_domains(data: dict[str, Any]) -> bool:
    """Whether every NVLink domain is one node (a fabric's), as far as the file says."""
    per = data.get("nodes_per_nvlink_domain")
    return data.get("nvlink_domains") is None and (per is None or per == 1)


def read_cluster_file(path: str | Path) -> ClusterSpec:
    """Read a cluster file.

    Parameters
    ----------
    path : str or Path
        A YAML file starting with ``format: pipette-cp-cluster/1``.

    Returns
    -------
    ClusterSpec
        Named after the file when it has no ``name``.

    Raises
    ------
    InputFileError
        Any problem, as one line naming the file (a bad field's SpecError text included).
    """
    data = read_mapping(path)
    if data.get("format") != FORMAT:
        raise InputFileError(path, f"format={data.get('format')!r}: expected {FORMAT!r}")
    data.setdefault("name", Path(path).stem)
    try:
        return cluster_from_mapping(data, where="cluster", base_dir=Path(path).parent)
    except SpecError as exc:
        raise InputFileError(path, str(exc)) from None


# ------------------------------------------------------------------ YAML writing
class _Row(list):  # type: ignore[type-arg]
    """A list dumped in flow style (one matrix row per line)."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(
    _Row, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True)
)


def cluster_to_mapping(
    cluster: ClusterSpec, decimals: int | None = 3, exceptions_file: Path | None = None
) -> dict[str, Any]:
    """The cluster-file fields of ``cluster`` (GB/s rounded to ``decimals``); a fabric's
    exceptions go to ``exceptions_file`` (a ``.npz``) when given, else inline."""

    def gb(x: float) -> float:
        return round(float(x) / GB, decimals) if decimals is not None else float(x) / GB

    n, g = cluster.num_nodes, cluster.gpus_per_node
    types = [cluster.gpu_of_node(k) for k in range(n)]
    out: dict[str, Any] = {"format": FORMAT, "name": cluster.name, "source": cluster.source}
    if cluster.is_homogeneous:
        out["gpu"] = _gpu_entry(types[0])
    else:
        out["node_gpu_types"] = [_gpu_entry(t) for t in types]
    out |= {
        "gpus_per_node": g,
        "nics_per_node": cluster.nics_per_node,
        "nic_bandwidth_gb_per_s": gb(cluster.nic_bandwidth_bytes_per_s),
        "intra_node_latency_us": round(cluster.intra_node_latency_s / US, 6),
        "inter_node_latency_us": round(cluster.inter_node_latency_s / US, 6),
        "node_names": _Row(cluster.node_names),
    }
    if cluster.node_groups is not None:
        out["node_groups"] = _Row(cluster.node_groups)
    if cluster.nodes_per_nvlink_domain > 1:
        out["nodes_per_nvlink_domain"] = cluster.nodes_per_nvlink_domain
    if cluster.fabric is not None:
        fabric = fabric_to_mapping(cluster.fabric, decimals, exceptions_file, _Row)
        return out | {"num_nodes": n, "fabric": fabric}
    blocks = cluster.matrix.reshape(n, g, n, g).transpose(0, 2, 1, 3)
    intra = blocks[0, 0]
    off = ~np.eye(g, dtype=bool)
    is_node_level = all(
        np.array_equal(blocks[a, a][off], intra[off]) if a == b else np.ptp(blocks[a, b]) == 0
        for a in range(n)
        for b in range(n)
    )
    if not is_node_level:
        out["gpu_bandwidth_gb_per_s"] = [_Row(gb(x) for x in row) for row in cluster.matrix]
        return out
    if g > 1:
        uniform = np.ptp(intra[off]) == 0 and intra[off][0] > 0  # a scalar 0 reads as unset
        out["intra_node_bandwidth_gb_per_s"] = (
            gb(intra[off][0]) if uniform else [_Row(gb(x) for x in row) for row in intra]
        )
    node = blocks[:, :, 0, 0]
    inter = node[~np.eye(n, dtype=bool)]
    if n > 1 and np.ptp(inter) == 0 and inter[0] > 0:
        return out | {"nominal": True, "inter_node_bandwidth_gb_per_s": gb(inter[0])}
    rows = [_Row(None if a == b else gb(node[a, b]) for b in range(n)) for a in range(n)]
    return out | {"node_bandwidth_gb_per_s": rows}


def _gpu_entry(gpu: GpuSpec) -> str | dict[str, Any]:
    return gpu.name if GPU_CATALOG.get(gpu.name) == gpu else gpu.model_dump()


def write_cluster_file(
    cluster: ClusterSpec, path: str | Path, header: str = "", *, decimals: int | None = 3
) -> None:
    """Write ``cluster`` as a cluster file.

    Parameters
    ----------
    cluster : ClusterSpec
    path : str or Path
        Parent folders are created.
    header : str
        Written first, each line as a ``#`` comment (source, licence, method).
    decimals : int or None
        GB/s are rounded to this many decimals (3 = 1 MB/s); None keeps full precision.
        A fabric of more than ``INLINE_EXCEPTIONS_MAX`` exceptions writes them, exactly,
        to ``<path stem>.npz`` beside the file.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    big = cluster.fabric is not None and exception_count(cluster.fabric) > INLINE_EXCEPTIONS_MAX
    sidecar = p.with_name(p.stem + ".npz") if big else None
    comment = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    p.write_text(comment + yaml_text(cluster_to_mapping(cluster, decimals, sidecar)),
                 encoding="utf-8")  # fmt: skip


def yaml_text(document: dict[str, Any]) -> str:
    """YAML of a document holding :func:`cluster_to_mapping` parts (rows in flow style)."""
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=4096)
