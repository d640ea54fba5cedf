"""The ``fabric:`` section of a cluster file: switch levels plus sparse exceptions.

A cluster of any size is given by its switch levels instead of a bandwidth matrix
(:class:`~pipette_cp.specs.hierarchy.HierarchicalFabric`; GB/s and us as elsewhere in
the file, node and GPU indices from 0 in ``node_names`` order)::

    num_nodes: 2048                        # or node_names; default: the last level's
    fabric:
      nvlink_bandwidth_gb_per_s: 367       # default: the GPU's NVLink
      nvlink_latency_us: 2                 # default: intra_node_latency_us
      levels:                              # innermost first; the last holds every node
      - {name: leaf, nodes: 32, bandwidth_gb_per_s: 46, latency_us: 5}
      - {name: pod, nodes: 512, bandwidth_gb_per_s: 42.78, latency_us: 7}
      - {name: spine, nodes: 2048, bandwidth_gb_per_s: 38.502, latency_us: 9}
      slow_nics: {node: [3, 17], nic_factor: [0.5, 0.5]}
      node_pairs: {src: [0, 5], dst: [5, 0], bandwidth_gb_per_s: [0, 20.1]}  # 0 = failed
      gpu_pairs: {src: [1], dst: [9], bandwidth_gb_per_s: [12.5]}
      # instead of the three lists: exceptions: NAME.npz  (next to the YAML)

A level's ``latency_us`` defaults to ``inter_node_latency_us``.  The sidecar
``.npz`` (:func:`write_exceptions`, numpy's compressed format, read without pickle)
holds the arrays ``slow_nics.node``, ``slow_nics.nic_factor``, ``node_pairs.src``,
``node_pairs.dst``, ``node_pairs.bandwidth_bytes_per_s`` and the same three of
``gpu_pairs``, bandwidths in bytes/s at full precision; :func:`write_cluster_file
<pipette_cp.io.cluster_file.write_cluster_file>` writes one when a fabric holds more
than :data:`INLINE_EXCEPTIONS_MAX` exceptions.
"""

from __future__ import annotations

import io
import math
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from pipette_cp.errors import InputFileError, SpecError
from pipette_cp.io.files import read_bytes
from pipette_cp.specs._base import spec_error_from
from pipette_cp.specs.cluster import MAX_LATENCY_S, MAX_LINK_BYTES_PER_S, MIN_LINK_BYTES_PER_S
from pipette_cp.specs.hierarchy import FabricLevel, HierarchicalFabric
from pipette_cp.units import GB, US

#: Most exceptions written inline in the YAML; beyond, they go to a ``.npz`` sidecar.
INLINE_EXCEPTIONS_MAX = 10_000
#: Largest sidecar read, bytes (compressed), and the most its arrays may expand to.
MAX_SIDECAR_BYTES = 1 << 30
MAX_SIDECAR_EXPANDED_BYTES = 8 << 30
SIDECAR_FORMAT = "pipette-cp-fabric-exceptions/1"

_SECTION_KEYS = {"nvlink_bandwidth_gb_per_s", "nvlink_latency_us", "levels", "slow_nics",
                 "node_pairs", "gpu_pairs", "exceptions"}  # fmt: skip
_LEVEL_KEYS = {"name", "nodes", "bandwidth_gb_per_s", "latency_us"}
#: The exception groups: file field -> (spec field, its array fields in the file)
_GROUPS = {
    "slow_nics": ("node", "nic_factor"),
    "node_pairs": ("src", "dst", "bandwidth_gb_per_s"),
    "gpu_pairs": ("src", "dst", "bandwidth_gb_per_s"),
}
_NPZ_KEYS = {f"{group}.{a.replace('gb_per_s', 'bytes_per_s')}"
             for group, arrays in _GROUPS.items() for a in arrays}  # fmt: skip


def exception_count(fabric: HierarchicalFabric) -> int:
    """Slow NICs, node pairs and GPU pairs the fabric lists."""
    return int(fabric.slow_nics.node.size + fabric.node_pairs.src.size + fabric.gpu_pairs.src.size)


def fabric_summary(fabric: HierarchicalFabric) -> str:
    """One line: 'levels leaf 32 x 46 GB/s, spine 2048 x 42.8 GB/s; 20 slow NICs, 83,845 node
    pairs (0 failed), 0 GPU pairs'."""
    levels = ", ".join(f"{lv.name} {lv.nodes} x {lv.bandwidth_bytes_per_s / GB:.4g} GB/s"
                       for lv in fabric.levels)  # fmt: skip
    pairs = [f"{p.src.size:,} {what} pairs ({int((p.bandwidth_bytes_per_s <= 0).sum()):,} failed)"
             for what, p in (("node", fabric.node_pairs), ("GPU", fabric.gpu_pairs))]  # fmt: skip
    return f"levels {levels}; {fabric.slow_nics.node.size:,} slow NICs, {', '.join(pairs)}"


# ------------------------------------------------------------------ reading
def fabric_num_nodes(data: dict[str, Any], where: str) -> int:
    """The node count of a fabric cluster file: ``num_nodes``, the ``node_names`` or,
    given neither, the last level's ``nodes``."""
    if isinstance(data.get("node_names"), list):
        return len(data["node_names"])
    if data.get("num_nodes") is not None:
        return _int(data["num_nodes"], f"{where}.num_nodes", 1)
    levels = _levels_list(data["fabric"], f"{where}.fabric")
    last = levels[-1]
    if not isinstance(last, dict) or "nodes" not in last:
        raise SpecError(f"{where}.fabric.levels[{len(levels) - 1}].nodes", None,
                        "missing (or give num_nodes or node_names)")  # fmt: skip
    return _int(last["nodes"], f"{where}.fabric.levels[{len(levels) - 1}].nodes", 1)


def fabric_from_mapping(
    data: dict[str, Any], where: str, *, num_nodes: int, gpus_per_node: int,
    nvlink_bytes_per_s: float, base_dir: Path | None = None,
) -> HierarchicalFabric:  # fmt: skip
    """The :class:`HierarchicalFabric` of a cluster file's fields ``data`` (module doc).

    ``nvlink_bytes_per_s`` is the default NVLink bandwidth (the GPU's); ``base_dir`` is
    where a sidecar is looked for (the YAML's folder; default: the working directory).

    Raises
    ------
    SpecError
        One line naming ``where.fabric.<field>`` (a sidecar's arrays as
        ``where.fabric.exceptions[NAME.npz].<array>``), the value and the rule.
    """
    section, field = data["fabric"], f"{where}.fabric"
    if not isinstance(section, dict):
        raise SpecError(field, section, "expected a mapping with levels (and exceptions)")
    _no_unknown(section, _SECTION_KEYS, field)
    if data.get("intra_node_bandwidth_gb_per_s") is not None:
        raise SpecError(f"{where}.intra_node_bandwidth_gb_per_s",
                        data["intra_node_bandwidth_gb_per_s"],
                        "a fabric gives fabric.nvlink_bandwidth_gb_per_s instead")  # fmt: skip
    intra_s = read_latency_s(data, "intra_node_latency_us", where, 5e-6)
    inter_s = read_latency_s(data, "inter_node_latency_us", where, 10e-6)
    nvlink = _gb(section, "nvlink_bandwidth_gb_per_s", field, nvlink_bytes_per_s / GB)
    if nvlink <= 0 and gpus_per_node > 1:
        raise SpecError(f"{field}.nvlink_bandwidth_gb_per_s", None,
                        "needed (a GPU type without NVLink)")  # fmt: skip
    fields: dict[str, Any] = {
        "num_nodes": num_nodes, "gpus_per_node": gpus_per_node,
        "nvlink_bandwidth_bytes_per_s": nvlink * GB if nvlink > 0 else MIN_LINK_BYTES_PER_S,
        "nvlink_latency_s": read_latency_s(section, "nvlink_latency_us", field, intra_s),
        "levels": parse_levels(section.get("levels"), f"{field}.levels", num_nodes, inter_s),
    }  # fmt: skip
    inline = [g for g in _GROUPS if section.get(g) is not None]
    if section.get("exceptions") is not None:
        if inline:
            raise SpecError(f"{field}.{inline[0]}", "{...}",
                            "give the exceptions inline or in fabric.exceptions, not both")  # fmt: skip
        arrays, at = read_exceptions(section["exceptions"], f"{field}.exceptions", base_dir)
    else:
        arrays, at = {g: _inline_group(section.get(g), g, f"{field}.{g}") for g in _GROUPS}, field
    return build_fabric({**fields, **arrays}, field, at)


def parse_levels(
    value: Any, field: str, num_nodes: int | None, latency_s: float, *, need_bandwidth: bool = True
) -> tuple[FabricLevel, ...]:
    """Levels from a list of ``{name, nodes, bandwidth_gb_per_s, latency_us}`` (the last
    level's ``nodes`` defaults to ``num_nodes``; with ``need_bandwidth`` False a
    missing bandwidth is left 0, for the caller to fill in)."""
    if not isinstance(value, list) or not value:
        raise SpecError(field, value, "expected a non-empty list of levels, innermost first")
    levels = []
    for k, level in enumerate(value):
        at = f"{field}[{k}]"
        if not isinstance(level, dict):
            raise SpecError(at, level, "expected a mapping {name, nodes, bandwidth_gb_per_s}")
        _no_unknown(level, _LEVEL_KEYS, at)
        last = k == len(value) - 1
        if level.get("nodes") is None and not (last and num_nodes is not None):
            raise SpecError(f"{at}.nodes", None, "missing: the consecutive nodes of one group")
        nodes = num_nodes if level.get("nodes") is None else _int(level["nodes"], f"{at}.nodes", 1)
        bandwidth = _gb(level, "bandwidth_gb_per_s", at, None if need_bandwidth else 0.0)
        name = level.get("name", f"level{k}")
        if not isinstance(name, str) or not name.strip():
            raise SpecError(f"{at}.name", name, "expected a non-empty name (leaf, pod, spine)")
        values: dict[str, Any] = {"name": name, "nodes": nodes, "bandwidth_bytes_per_s": bandwidth * GB,
                                  "latency_s": read_latency_s(level, "latency_us", at, latency_s)}  # fmt: skip
        # a bandwidth left 0 (need_bandwidth False) is the caller's to fill in
        levels.append(FabricLevel(**values) if bandwidth else FabricLevel.model_construct(**values))
    return tuple(levels)


def _inline_group(value: Any, group: str, field: str) -> dict[str, np.ndarray]:
    names = _GROUPS[group]
    if value is None:
        return {a.replace("gb_per_s", "bytes_per_s"): np.zeros(0) for a in names}
    if not isinstance(value, dict):
        raise SpecError(field, value, f"expected a mapping of lists {', '.join(names)}")
    _no_unknown(value, set(names), field)
    out: dict[str, np.ndarray] = {}
    for name in names:
        items = value.get(name, [])
        if not isinstance(items, list):
            raise SpecError(f"{field}.{name}", items, "expected a list")
        if name in ("node", "src", "dst"):
            for i, x in enumerate(items):
                if isinstance(x, bool) or not isinstance(x, int) or x < 0:
                    raise SpecError(f"{field}.{name}[{i}]", x, "expected an index >= 0")
            out[name] = np.array(items, dtype=np.int64)
            continue
        for i, x in enumerate(items):
            if x is not None and (isinstance(x, bool) or not isinstance(x, int | float)
                                  or not math.isfinite(x) or x < 0):  # fmt: skip
                raise SpecError(f"{field}.{name}[{i}]", x, "expected a finite number >= 0")
        values = np.array([0.0 if x is None else float(x) for x in items])
        if name == "bandwidth_gb_per_s":
            _check_links(values * GB, f"{field}.{name}", GB)
            out["bandwidth_bytes_per_s"] = values * GB
        else:
            out[name] = values
    return out


def read_exceptions(
    name: Any, field: str, base_dir: Path | None = None
) -> tuple[dict[str, dict[str, np.ndarray]], str]:
    """The exception groups of a sidecar ``.npz`` (module doc), and the field path its
    arrays' errors are named under."""
    if not isinstance(name, str) or not name.endswith(".npz"):
        raise SpecError(field, name, "expected the file name of a .npz next to the YAML")
    path = Path(name) if base_dir is None or Path(name).is_absolute() else base_dir / name
    at = f"{field}[{name}]"
    try:
        blob = read_bytes(path, MAX_SIDECAR_BYTES)
    except InputFileError as exc:
        raise SpecError(field, name, f"{exc.problem} ({path})") from None
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as npz:
            expanded = sum(i.file_size for i in npz.zip.infolist())
            if expanded > MAX_SIDECAR_EXPANDED_BYTES:
                raise SpecError(at, f"{expanded} bytes", "its arrays expand beyond "
                                f"{MAX_SIDECAR_EXPANDED_BYTES} bytes")  # fmt: skip
            _check_headers(npz.zip, at)  # before numpy allocates what a header claims
            stored = {k: npz[k] for k in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        if isinstance(exc, SpecError):
            raise
        raise SpecError(field, name, f"not a readable .npz file ({type(exc).__name__})") from None
    marker = stored.pop("format", None)
    if marker is None or marker.shape != () or str(marker) != SIDECAR_FORMAT:
        raise SpecError(f"{at}.format", None if marker is None else str(marker)[:40],
                        f"expected {SIDECAR_FORMAT!r}")  # fmt: skip
    unknown = sorted(set(stored) - _NPZ_KEYS)
    if unknown:
        raise SpecError(f"{at}.{unknown[0]}", "array", f"unknown array; known: {sorted(_NPZ_KEYS)}")
    out: dict[str, dict[str, np.ndarray]] = {}
    for group, names in _GROUPS.items():
        out[group] = {}
        for a in names:
            key = a.replace("gb_per_s", "bytes_per_s")
            ids = a in ("node", "src", "dst")
            array = stored.get(f"{group}.{key}", np.zeros(0, np.int64 if ids else np.float64))
            kinds = "iu" if ids else "iuf"
            if array.ndim != 1 or array.dtype.kind not in kinds:
                raise SpecError(f"{at}.{group}.{key}", f"{array.dtype}{list(array.shape)}",
                                "expected a 1-D array of " + ("integers" if ids else "numbers"))  # fmt: skip
            out[group][key] = array
        bw = out[group].get("bandwidth_bytes_per_s")
        if bw is not None:
            _check_links(bw.astype(np.float64), f"{at}.{group}.bandwidth_bytes_per_s", 1.0)
    return out, at


def _check_headers(archive: zipfile.ZipFile, at: str) -> None:
    """Every ``.npy`` member's header claims no more data than the member holds (a header
    may claim any shape: numpy would allocate it before reading a byte)."""
    for info in archive.infolist():
        with archive.open(info) as member:
            version = np.lib.format.read_magic(member)
            read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                           (2, 0): np.lib.format.read_array_header_2_0}.get(version)  # fmt: skip
            if read_header is None:
                raise SpecError(f"{at}.{info.filename}", str(version), "an .npy version 1.0 or 2.0")
            shape, _, dtype = read_header(member)
            claimed = math.prod(shape) * dtype.itemsize
            if claimed > info.file_size:
                raise SpecError(f"{at}.{info.filename}", f"shape {list(shape)}",
                                f"its header claims {claimed} bytes, the file holds "
                                f"{info.file_size}")  # fmt: skip


def build_fabric(fields: dict[str, Any], field: str, arrays_at: str = "") -> HierarchicalFabric:
    """The fabric, its validators' errors named under ``field`` (levels) or
    ``arrays_at`` (exceptions; a sidecar's own path)."""
    try:
        return HierarchicalFabric.model_validate(fields)
    except ValidationError as exc:
        cause = exc.errors()[0].get("ctx", {}).get("error")
        if isinstance(cause, SpecError):
            inner = cause.field
            prefix = field if inner.startswith(("levels", "num_nodes")) else arrays_at or field
            if prefix == field:  # inline: the file's own unit
                inner = inner.replace("bandwidth_bytes_per_s", "bandwidth_gb_per_s")
            raise SpecError(f"{prefix}.{inner}", cause.value, cause.expected) from None
        raise spec_error_from(exc, field) from None


def _check_links(bw: np.ndarray, field: str, unit: float) -> None:
    """Every bandwidth finite, 0 (failed) or in the range a cluster accepts."""
    bad = np.flatnonzero(~np.isfinite(bw) | (bw < 0) | ((bw > 0) & (bw < MIN_LINK_BYTES_PER_S))
                         | (bw > MAX_LINK_BYTES_PER_S))  # fmt: skip
    if bad.size:
        i = int(bad[0])
        raise SpecError(f"{field}[{i}]", float(bw[i]) / unit,
                        f"expected 0 (failed) or {MIN_LINK_BYTES_PER_S / unit:g} to "
                        f"{MAX_LINK_BYTES_PER_S / unit:g}")  # fmt: skip


def _levels_list(section: Any, field: str) -> list[Any]:
    levels = section.get("levels") if isinstance(section, dict) else None
    if not isinstance(levels, list) or not levels:
        raise SpecError(f"{field}.levels", levels, "expected a non-empty list of levels")
    return levels


def _no_unknown(mapping: dict[Any, Any], known: set[str], field: str) -> None:
    unknown = sorted(set(mapping) - known, key=repr)
    if unknown:
        key = unknown[0]
        raise SpecError(f"{field}.{key if isinstance(key, str) else repr(key)}", mapping[key],
                        f"unknown field; known: {', '.join(sorted(known))}")  # fmt: skip


def _int(value: Any, field: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise SpecError(field, value, f"expected an integer >= {low}")
    return value


def _gb(mapping: dict[str, Any], key: str, field: str, default: float | None) -> float:
    value = mapping.get(key)
    if value is None:
        if default is None:
            raise SpecError(f"{field}.{key}", None, "missing")
        return default
    bad = isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
    low, high = MIN_LINK_BYTES_PER_S / GB, MAX_LINK_BYTES_PER_S / GB
    if bad or not low <= value <= high:
        raise SpecError(
            f"{field}.{key}", value, f"expected a bandwidth of {low:g} to {high:g} GB/s"
        )
    return float(value)


def read_latency_s(mapping: dict[str, Any], key: str, field: str, default: float) -> float:
    """``mapping[key]`` (us) in seconds, ``default`` when absent; a one-line error naming
    ``field.key`` outside 0 to the largest latency a spec takes."""
    value = mapping.get(key)
    if value is None:
        return default
    bad = isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
    if bad or not 0 <= value <= MAX_LATENCY_S / US:
        raise SpecError(f"{field}.{key}", value, f"expected 0 to {MAX_LATENCY_S / US:g} us")
    return float(value) / (1 / US)  # us -> s; keeps 5 us == 5e-6 exactly


# ------------------------------------------------------------------ writing
def fabric_to_mapping(
    fabric: HierarchicalFabric, decimals: int | None = 3, sidecar: Path | None = None,
    row: Callable[[list[Any]], list[Any]] = list,
) -> dict[str, Any]:  # fmt: skip
    """The ``fabric:`` section of ``fabric`` (GB/s rounded to ``decimals``); with
    ``sidecar``, the exceptions are written there (:func:`write_exceptions`) and the
    section names it.  ``row`` wraps each exception list (the writer's flow style)."""

    def gb(x: float) -> float:
        return round(float(x) / GB, decimals) if decimals is not None else float(x) / GB

    def us(x: float) -> float:
        return round(x / US, 6)

    out: dict[str, Any] = {
        "nvlink_bandwidth_gb_per_s": gb(fabric.nvlink_bandwidth_bytes_per_s),
        "nvlink_latency_us": us(fabric.nvlink_latency_s),
        "levels": [{"name": lv.name, "nodes": lv.nodes,
                    "bandwidth_gb_per_s": gb(lv.bandwidth_bytes_per_s),
                    "latency_us": us(lv.latency_s)} for lv in fabric.levels],
    }  # fmt: skip
    if sidecar is not None:
        write_exceptions(fabric, sidecar)
        return out | {"exceptions": sidecar.name}
    nics, nodes, gpus = fabric.slow_nics, fabric.node_pairs, fabric.gpu_pairs
    if nics.node.size:
        out["slow_nics"] = {"node": row(nics.node.tolist()),
                            "nic_factor": row(nics.nic_factor.tolist())}  # fmt: skip
    for key, pairs in (("node_pairs", nodes), ("gpu_pairs", gpus)):
        if pairs.src.size:
            out[key] = {"src": row(pairs.src.tolist()), "dst": row(pairs.dst.tolist()),
                        "bandwidth_gb_per_s": row([gb(x) for x in pairs.bandwidth_bytes_per_s])}  # fmt: skip
    return out


def write_exceptions(fabric: HierarchicalFabric, path: Path) -> None:
    """The fabric's exceptions as a compressed ``.npz`` (module doc): indices as int32
    when they fit, bandwidths in bytes/s as float64 (read back exactly)."""
    small = np.int32 if fabric.num_gpus < 2**31 else np.int64
    arrays: dict[str, np.ndarray] = {"format": np.array(SIDECAR_FORMAT)}
    for group in _GROUPS:
        spec = getattr(fabric, group)
        for name in type(spec).model_fields:
            value = getattr(spec, name)
            arrays[f"{group}.{name}"] = value.astype(small) if value.dtype.kind == "i" else value
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as fh:
        np.savez_compressed(fh, **arrays)  # type: ignore[arg-type]  # no object arrays: no pickle
