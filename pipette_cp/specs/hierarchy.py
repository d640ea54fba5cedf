"""A cluster fabric as levels plus sparse exceptions: O(nodes + exceptions) memory.

GPUs sit in nodes (NVLink inside), nodes in nested groups (a leaf switch's nodes, a
pod's leaves, the spine's pods): ``levels[k].nodes`` consecutive nodes form one group
of level ``k``, innermost first, each level's groups whole groups of the level below.
Two GPUs of one node talk over NVLink; two GPUs of different nodes at the bandwidth
and latency of the innermost level whose group holds both nodes.  Measured departures
from that are sparse exceptions: a slow NIC (a node's inter-node bandwidth scaled
down), a degraded or failed node pair, a degraded or failed GPU pair.  Every query
(:meth:`HierarchicalFabric.bandwidth`) is vectorised over GPU pairs and never builds
the GPU x GPU matrix; :meth:`HierarchicalFabric.dense` builds it for small clusters
(the dense matrix stays one input format of :class:`~pipette_cp.specs.cluster.ClusterSpec`).
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from pydantic import Field, PlainSerializer, PlainValidator, WithJsonSchema, model_validator

from pipette_cp.errors import SpecError
from pipette_cp.specs._base import FrozenSpec

#: Largest cluster a hierarchy describes (GPU ids and pair keys stay exact in int64).
MAX_HIERARCHY_GPUS = 1 << 24


class _ArraySpec(FrozenSpec):
    """A spec holding numpy arrays: equal when every field is (arrays element-wise)."""

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(
            np.array_equal(mine, theirs) if isinstance(mine, np.ndarray) else mine == theirs
            for mine, theirs in ((getattr(self, f), getattr(other, f))
                                 for f in type(self).model_fields)
        )  # fmt: skip

    def __hash__(self) -> int:
        return hash(tuple(
            (v.size, float(v.sum())) if isinstance(v, np.ndarray) else hash(v)
            for v in (getattr(self, f) for f in type(self).model_fields)
        ))  # fmt: skip


class FabricLevel(FrozenSpec):
    """One level of switches above the nodes."""

    name: str = Field(description="What the level is: leaf, rack, pod, spine, ...")
    nodes: int = Field(gt=0, description="Consecutive nodes in one group of this level.")
    bandwidth_bytes_per_s: float = Field(
        gt=0,
        description="One stream between GPUs of two nodes that first meet at this level, bytes/s.",
    )
    latency_s: float = Field(ge=0, le=1.0, description="Start-up latency of such a stream, s.")


def _ids(value: Any) -> np.ndarray:
    array = np.array(value, dtype=np.int64, copy=True).reshape(-1)
    array.flags.writeable = False
    return array


def _values(value: Any) -> np.ndarray:
    array = np.array(value, dtype=np.float64, copy=True).reshape(-1)
    array.flags.writeable = False
    return array


#: 1-D read-only arrays (JSON: lists)
Ids = Annotated[
    np.ndarray, PlainValidator(_ids), PlainSerializer(lambda a: a.tolist(), return_type=list),
    WithJsonSchema({"type": "array", "items": {"type": "integer"}}),
]  # fmt: skip
Values = Annotated[
    np.ndarray, PlainValidator(_values), PlainSerializer(lambda a: a.tolist(), return_type=list),
    WithJsonSchema({"type": "array", "items": {"type": "number"}}),
]  # fmt: skip


class NodeExceptions(_ArraySpec):
    """Nodes whose NICs deliver ``nic_factor`` of the nominal inter-node bandwidth."""

    node: Ids = Field(default_factory=lambda: np.zeros(0, np.int64), description="Node indices.")
    nic_factor: Values = Field(
        default_factory=lambda: np.zeros(0), description="Share of nominal, in (0, 1]."
    )


class PairExceptions(_ArraySpec):
    """Measured pairs (of nodes or of GPUs) ``src[i] -> dst[i]``: bandwidth, 0 = failed."""

    src: Ids = Field(default_factory=lambda: np.zeros(0, np.int64), description="Sources.")
    dst: Ids = Field(default_factory=lambda: np.zeros(0, np.int64), description="Destinations.")
    bandwidth_bytes_per_s: Values = Field(
        default_factory=lambda: np.zeros(0), description="Measured bandwidth, bytes/s; 0 = failed."
    )


def _check_once(field: str, pairs: PairExceptions, top: int) -> None:
    """Each directed pair listed once: a second entry would contradict or repeat the
    first (which one the cost model used would be an accident of the order)."""
    keys = pairs.src * top + pairs.dst
    _, first, counts = np.unique(keys, return_index=True, return_counts=True)
    if (counts > 1).any():
        i = int(first[np.flatnonzero(counts > 1)[0]])
        again = int(np.flatnonzero(keys == keys[i])[1])
        bw = pairs.bandwidth_bytes_per_s
        raise SpecError(f"{field}.src[{again}]", int(pairs.src[again]),
                        f"the pair {int(pairs.src[i])} -> {int(pairs.dst[i])} is listed again "
                        f"(entries {i} and {again}: {bw[i] / 1e9:g} and {bw[again] / 1e9:g} "
                        "GB/s); give each pair once")  # fmt: skip


class HierarchicalFabric(_ArraySpec):
    """Nodes of ``gpus_per_node`` GPUs in nested switch levels, plus exceptions."""

    num_nodes: int = Field(gt=0, description="Number of nodes.")
    gpus_per_node: int = Field(gt=0, le=1024, description="GPUs per node (NVLink inside).")
    nvlink_bandwidth_bytes_per_s: float = Field(gt=0, description="GPU pair in one node, bytes/s.")
    nvlink_latency_s: float = Field(ge=0, le=1.0, description="Latency inside a node, s.")
    levels: tuple[FabricLevel, ...] = Field(
        min_length=1, description="Switch levels, innermost first; the last holds every node."
    )
    slow_nics: NodeExceptions = Field(default_factory=NodeExceptions,
                                      description="Nodes with slow NICs.")  # fmt: skip
    node_pairs: PairExceptions = Field(
        default_factory=PairExceptions,
        description="Degraded or failed node pairs (every GPU pair between them).",
    )
    gpu_pairs: PairExceptions = Field(
        default_factory=PairExceptions, description="Degraded or failed GPU pairs."
    )

    @model_validator(mode="after")
    def _levels_nest(self) -> HierarchicalFabric:
        prev = 1
        for k, level in enumerate(self.levels):
            if level.nodes % prev:
                raise SpecError(f"levels[{k}].nodes", level.nodes,
                                f"must be a multiple of the level below's {prev} nodes "
                                "(each group whole groups of the level below)")  # fmt: skip
            prev = level.nodes
        if self.levels[-1].nodes != self.num_nodes:
            raise SpecError(f"levels[{len(self.levels) - 1}].nodes", self.levels[-1].nodes,
                            f"the last level must hold every one of the {self.num_nodes} nodes")  # fmt: skip
        if self.num_gpus > MAX_HIERARCHY_GPUS:
            raise SpecError("num_nodes", self.num_nodes,
                            f"{self.num_gpus} GPUs: at most {MAX_HIERARCHY_GPUS}")  # fmt: skip
        nics = self.slow_nics
        _check_ids("slow_nics.node", nics.node, self.num_nodes, "node")
        _check_lengths("slow_nics", nics.node, nics.nic_factor)
        bad = np.flatnonzero(~((nics.nic_factor > 0) & (nics.nic_factor <= 1)))
        if bad.size:
            raise SpecError(f"slow_nics.nic_factor[{bad[0]}]", float(nics.nic_factor[bad[0]]),
                            "must be in (0, 1]")  # fmt: skip
        for field, pairs, top, what in (("node_pairs", self.node_pairs, self.num_nodes, "node"),
                                        ("gpu_pairs", self.gpu_pairs, self.num_gpus, "GPU")):  # fmt: skip
            _check_ids(f"{field}.src", pairs.src, top, what)
            _check_ids(f"{field}.dst", pairs.dst, top, what)
            _check_lengths(field, pairs.src, pairs.dst, pairs.bandwidth_bytes_per_s)
            bw = pairs.bandwidth_bytes_per_s
            bad = np.flatnonzero(~(np.isfinite(bw) & (bw >= 0)))
            if bad.size:
                raise SpecError(f"{field}.bandwidth_bytes_per_s[{bad[0]}]", float(bw[bad[0]]),
                                "must be a finite number of bytes/s >= 0 (0: failed)")  # fmt: skip
            same = np.flatnonzero(pairs.src == pairs.dst)
            if same.size:
                raise SpecError(f"{field}.dst[{same[0]}]", int(pairs.dst[same[0]]),
                                "a pair needs two different ends")  # fmt: skip
            _check_once(field, pairs, top)
        return self

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    def _tables(self) -> dict[str, np.ndarray]:
        cached = self.__dict__.get("_cache")
        if cached is None:
            factor = np.ones(self.num_nodes)
            factor[self.slow_nics.node] = self.slow_nics.nic_factor

            def keyed(pairs: PairExceptions, n: int) -> tuple[np.ndarray, np.ndarray]:
                keys = pairs.src * n + pairs.dst
                order = np.argsort(keys, kind="stable")
                return keys[order], pairs.bandwidth_bytes_per_s[order]

            node_keys, node_bw = keyed(self.node_pairs, self.num_nodes)
            gpu_keys, gpu_bw = keyed(self.gpu_pairs, self.num_gpus)
            cached = {
                "factor": factor, "node_keys": node_keys, "node_bw": node_bw,
                "gpu_keys": gpu_keys, "gpu_bw": gpu_bw,
                "sizes": np.array([lv.nodes for lv in self.levels], dtype=np.int64),
                "level_bw": np.array([lv.bandwidth_bytes_per_s for lv in self.levels]),
                "level_lat": np.array([lv.latency_s for lv in self.levels]),
            }  # fmt: skip
            object.__setattr__(self, "__dict__", {**self.__dict__, "_cache": cached})
        return cached

    def level_of(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Innermost level holding both GPUs' nodes (-1: the same node)."""
        t = self._tables()
        a, b = np.asarray(src) // self.gpus_per_node, np.asarray(dst) // self.gpus_per_node
        # groups nest: the levels apart are the innermost ones; the last holds every node
        level = np.where(a == b, -1, 0).astype(np.int8)
        for size in t["sizes"][:-1].tolist():
            level += (a // size) != (b // size)
        return level

    def bandwidth(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Bandwidth of every stream ``src[i] -> dst[i]`` (GPU ids), bytes/s (0: failed;
        ``src == dst``: 0, as the dense matrix's diagonal)."""
        t = self._tables()
        src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        level = self.level_of(src, dst)
        g = self.gpus_per_node
        nodes_a, nodes_b = src // g, dst // g
        out = np.where(level < 0, self.nvlink_bandwidth_bytes_per_s,
                       t["level_bw"][np.maximum(level, 0)])  # fmt: skip
        apart = level >= 0
        out = np.where(apart, out * np.minimum(t["factor"][nodes_a], t["factor"][nodes_b]), out)
        out = _override(
            out, nodes_a * self.num_nodes + nodes_b, t["node_keys"], t["node_bw"], apart
        )
        out = _override(out, src * self.num_gpus + dst, t["gpu_keys"], t["gpu_bw"], src != dst)
        return np.where(src == dst, 0.0, out)

    def latency(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Start-up latency of every stream, s."""
        t = self._tables()
        level = self.level_of(np.asarray(src), np.asarray(dst))
        return np.where(level < 0, self.nvlink_latency_s, t["level_lat"][np.maximum(level, 0)])

    def dense(self) -> np.ndarray:
        """The GPU x GPU bandwidth matrix (small clusters: N^2 floats)."""
        ids = np.arange(self.num_gpus)
        return self.bandwidth(ids[:, None], ids[None, :])

    def node_bandwidth_sums(self) -> tuple[np.ndarray, np.ndarray]:
        """Per node, the sum over the other nodes of the mean GPU-pair bandwidth to them
        (sent) and from them (received), bytes/s: O(nodes x (levels + slow NICs) +
        exceptions), no pair table."""
        t, n, g = self._tables(), self.num_nodes, self.gpus_per_node
        nodes = np.arange(n)
        factor = t["factor"]
        sent = np.zeros(n)
        inner = 1  # nodes of the group below: the ones met before this level
        for size, bw in zip(t["sizes"], t["level_bw"], strict=True):
            sent += (size - inner) * bw * factor  # every partner first met at this level
            inner = int(size)
        # a slow partner b caps the pair at min(f_a, f_b): correct those pairs
        for b, fb in zip(self.slow_nics.node.tolist(), self.slow_nics.nic_factor.tolist(),
                         strict=True):  # fmt: skip
            level = self.level_of(nodes * g, np.full(n, b * g))
            bw = t["level_bw"][np.maximum(level, 0)]
            fix = np.where(level >= 0, bw * (np.minimum(factor, fb) - factor), 0.0)
            sent += fix
        received = sent.copy()  # the nominal part is symmetric
        pairs = self.node_pairs
        if pairs.src.size:  # a measured node pair replaces its nominal value
            nominal = self._nominal(pairs.src, pairs.dst)
            delta = pairs.bandwidth_bytes_per_s - nominal
            sent += np.bincount(pairs.src, delta, minlength=n)
            received += np.bincount(pairs.dst, delta, minlength=n)
        gp = self.gpu_pairs
        if gp.src.size:  # a GPU pair moves its node pair's mean by its change / g^2
            a, b = gp.src // g, gp.dst // g
            apart = a != b
            before = self.bandwidth(gp.src, gp.dst)  # with the GPU exception itself ...
            without = self._without_gpu_pairs(gp.src, gp.dst)
            delta = np.where(apart, (before - without) / (g * g), 0.0)
            sent += np.bincount(a, delta, minlength=n)
            received += np.bincount(b, delta, minlength=n)
        return sent, received

    def _nominal(self, src_nodes: np.ndarray, dst_nodes: np.ndarray) -> np.ndarray:
        """Level bandwidth x the slower NIC factor of node pairs (no pair exceptions)."""
        t, g = self._tables(), self.gpus_per_node
        level = self.level_of(src_nodes * g, dst_nodes * g)
        bw = t["level_bw"][np.maximum(level, 0)]
        return bw * np.minimum(t["factor"][src_nodes], t["factor"][dst_nodes])

    def _without_gpu_pairs(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """What GPU pairs between two nodes would get from their node pair alone."""
        t, g, n = self._tables(), self.gpus_per_node, self.num_nodes
        a, b = src // g, dst // g
        out = self._nominal(a, b)
        return _override(out, a * n + b, t["node_keys"], t["node_bw"], a != b)

    def slowest_working_bytes_per_s(self) -> float:
        """A lower bound on every working GPU pair's bandwidth, bytes/s: the slowest
        level at the slowest NIC factor, NVLink, the slowest working exception."""
        t = self._tables()
        working = [float(t["level_bw"].min() * t["factor"].min())]
        if self.gpus_per_node > 1:
            working.append(self.nvlink_bandwidth_bytes_per_s)
        for pairs in (self.node_pairs, self.gpu_pairs):
            bw = pairs.bandwidth_bytes_per_s
            working.append(float(bw[bw > 0].min(initial=np.inf)))
        return min(working)

    def without_failures(self) -> HierarchicalFabric:
        """This fabric with every failed pair at the slowest working bandwidth."""
        slowest = self.slowest_working_bytes_per_s()
        update = {
            field: pairs.model_copy(update={"bandwidth_bytes_per_s": np.where(
                pairs.bandwidth_bytes_per_s > 0, pairs.bandwidth_bytes_per_s, slowest)})
            for field, pairs in (("node_pairs", self.node_pairs), ("gpu_pairs", self.gpu_pairs))
        }  # fmt: skip
        return self.model_copy(update=update)

    def view(self) -> LinkView:
        """The fabric's :class:`LinkView` (one per fabric, so caches keyed on it hold)."""
        t = self._tables()
        if "view" not in t:
            t["view"] = LinkView(self)  # type: ignore[assignment]
        return t["view"]  # type: ignore[return-value]

    def gpu_bounds(self) -> np.ndarray:
        """Per GPU, an upper bound on its fastest outgoing and its fastest incoming link,
        bytes/s: NVLink, the fastest level at its NICs' factor, its exceptions."""
        t, g = self._tables(), self.gpus_per_node
        node = np.maximum(t["level_bw"].max() * t["factor"], 0.0)
        node = np.maximum(node, self.nvlink_bandwidth_bytes_per_s if g > 1 else 0.0)
        for pairs in (self.node_pairs,):
            np.maximum.at(node, pairs.src, pairs.bandwidth_bytes_per_s)
            np.maximum.at(node, pairs.dst, pairs.bandwidth_bytes_per_s)
        out = np.repeat(node, g)
        gp = self.gpu_pairs
        np.maximum.at(out, gp.src, gp.bandwidth_bytes_per_s)
        np.maximum.at(out, gp.dst, gp.bandwidth_bytes_per_s)
        return out

    def memory_bytes(self) -> int:
        """Bytes of the lookup tables (what a query needs besides its own arrays)."""
        return int(sum(a.nbytes for a in self._tables().values() if isinstance(a, np.ndarray)))


def _check_ids(field: str, ids: np.ndarray, top: int, what: str) -> None:
    bad = np.flatnonzero((ids < 0) | (ids >= top))
    if bad.size:
        raise SpecError(f"{field}[{bad[0]}]", int(ids[bad[0]]),
                        f"no such {what}: the fabric has {top} (0..{top - 1})")  # fmt: skip


def _check_lengths(field: str, *arrays: np.ndarray) -> None:
    if len({a.size for a in arrays}) > 1:
        raise SpecError(field, [a.size for a in arrays], "its arrays must have one length")


def _override(out: np.ndarray, keys: np.ndarray, table: np.ndarray, values: np.ndarray,
              where: np.ndarray) -> np.ndarray:  # fmt: skip
    """``out`` with the entries whose key is in the sorted ``table`` set to its value."""
    if not table.size:
        return out
    pos = np.clip(np.searchsorted(table, keys), 0, table.size - 1)
    hit = (table[pos] == keys) & where
    return np.where(hit, values[pos], out)


#: Largest hierarchical cluster whose GPU x GPU matrix :class:`LinkView` builds on request
#: (a whole-matrix operation on a larger one is refused: it would need N^2 memory).
MAX_DENSE_VIEW_GPUS = 4096


class LinkView:
    """The bandwidth "matrix" of a :class:`HierarchicalFabric`, read by indexing.

    ``view[src, dst]`` with integer arrays (broadcast as numpy's advanced indexing,
    ``np.ix_`` included), integers or slices answers from the fabric's tables without
    building the matrix, so the cost model's gathers work on it as on the dense
    ``ClusterSpec.bandwidth_bytes_per_s``; ``np.asarray(view)`` builds the matrix only up
    to :data:`MAX_DENSE_VIEW_GPUS` GPUs.
    """

    __slots__ = ("fabric",)

    def __init__(self, fabric: HierarchicalFabric) -> None:
        self.fabric = fabric

    @property
    def shape(self) -> tuple[int, int]:
        n = self.fabric.num_gpus
        return n, n

    ndim = 2
    dtype = np.dtype(np.float64)

    def __len__(self) -> int:
        return self.fabric.num_gpus

    def __getitem__(self, key: Any) -> Any:
        if not (isinstance(key, tuple) and len(key) == 2):
            raise IndexError("index a link view by a (source, destination) pair")
        n = self.fabric.num_gpus
        parts = [np.arange(n)[k] if isinstance(k, slice) else np.asarray(k, dtype=np.int64)
                 for k in key]  # fmt: skip
        src, dst = parts
        if isinstance(key[0], slice) and isinstance(key[1], slice):
            src, dst = src[:, None], dst[None, :]  # basic indexing: the outer block
        elif isinstance(key[0], slice) or isinstance(key[1], slice):
            src = src.reshape(src.shape + (1,) * dst.ndim)  # one slice: an outer product
        out = self.fabric.bandwidth(*np.broadcast_arrays(src, dst))
        return out if out.ndim else float(out)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        n = self.fabric.num_gpus
        if n > MAX_DENSE_VIEW_GPUS:
            raise SpecError("cluster.fabric", f"{n} GPUs",
                            "this operation needs the GPU x GPU matrix, built only up to "
                            f"{MAX_DENSE_VIEW_GPUS} GPUs of a hierarchical fabric")  # fmt: skip
        dense = self.fabric.dense()
        return dense if dtype is None else dense.astype(dtype)
