"""Hypothesis strategies for the fuzz tests: random valid models, clusters, training
settings and search spaces, as specs and as the mappings the file loaders read.

Everything is small (at most ~3 B parameters, 64 GPUs) so that a search takes
well under a second with a cheap method.  ``HYPOTHESIS_PROFILE=fuzz`` (registered
in ``conftest.py``) multiplies the example counts by :data:`LONG_FACTOR`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import HealthCheck, currently_in_test_context, settings
from hypothesis import event as hypothesis_event
from hypothesis import note as hypothesis_note
from hypothesis import strategies as st

from pipette_cp.clusters.generators.registry import GENERATORS, generate
from pipette_cp.io.cluster_file import cluster_from_mapping
from pipette_cp.specs import (
    GPU_CATALOG,
    ClusterSpec,
    Instance,
    ModelSpec,
    SearchSpace,
    TrainingSpec,
    validate_spec,
)

#: Largest model drawn (parameters) and largest cluster (GPUs).
MAX_PARAMS = 3e9
MAX_GPUS = 64

#: The long profile (HYPOTHESIS_PROFILE=fuzz) runs this many times the default examples.
LONG_FACTOR = 60


def fuzz_settings(examples: int, *, deadline_ms: float | None = None) -> settings:
    """``examples`` examples (x :data:`LONG_FACTOR` under the ``fuzz`` profile)."""
    long = settings.get_current_profile_name() == "fuzz"
    return settings(
        max_examples=examples * LONG_FACTOR if long else examples,
        deadline=deadline_ms,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        derandomize=False,
    )


def note(text: str) -> None:
    """hypothesis.note, also callable from plain (non-hypothesis) tests."""
    if currently_in_test_context():
        hypothesis_note(text)


def event(text: str) -> None:
    """hypothesis.event, also callable from plain (non-hypothesis) tests."""
    if currently_in_test_context():
        hypothesis_event(text)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# ------------------------------------------------------------------ models
@st.composite
def model_fields(draw: st.DrawFn) -> dict[str, Any]:
    """The fields of a valid dense :class:`ModelSpec` of at most :data:`MAX_PARAMS`."""
    heads = draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 32]))
    kv = draw(st.sampled_from(divisors(heads)))
    head_dim = draw(st.sampled_from([16, 32, 64, 128]))
    fields: dict[str, Any] = {
        "name": draw(st.sampled_from(["fuzz", "m", "gpt-x"])),
        "num_layers": draw(st.integers(1, 40)),
        "num_attention_heads": heads,
        "vocab_size": draw(st.integers(100, 64000)),
        "max_seq_length": draw(st.sampled_from([128, 512, 1024, 2048, 4096])),
        "activation": draw(st.sampled_from(["gelu", "swiglu"])),
        "norm": draw(st.sampled_from(["layernorm", "rmsnorm"])),
        "position_embedding": draw(st.sampled_from(["learned", "rope", "alibi"])),
        "linear_bias": draw(st.booleans()),
        "tied_embeddings": draw(st.booleans()),
    }
    if draw(st.booleans()):  # explicit head_dim, any width
        fields["head_dim"] = head_dim
        fields["hidden_size"] = draw(st.integers(1, 64)) * 64
    else:
        fields["hidden_size"] = heads * head_dim
    if kv != heads or draw(st.booleans()):
        fields["num_kv_heads"] = kv
    fields["ffn_hidden_size"] = fields["hidden_size"] * draw(st.sampled_from([1, 2, 3, 4]))
    return fields


@st.composite
def models(draw: st.DrawFn) -> ModelSpec:
    model = validate_spec(ModelSpec, draw(model_fields()), "model")
    if model.total_params > MAX_PARAMS:  # shrink the depth until it fits
        per_layer = max(model.params_per_layer, 1)
        rest = model.total_params - model.num_layers * per_layer
        layers = max(1, int((MAX_PARAMS - rest) // per_layer))
        model = model.model_copy(update={"num_layers": min(layers, model.num_layers)})
    return model


# ------------------------------------------------------------------ training, search space
@st.composite
def training_fields(draw: st.DrawFn, gpus: int | None = None) -> dict[str, Any]:
    """Training fields; with ``gpus``, the global batch is usually a multiple of it (else
    most layouts cannot split the batch and the search has little to do)."""
    batch = st.one_of(st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128, 256]), st.integers(1, 300))
    if gpus is not None and draw(st.integers(0, 3)):
        batch = st.sampled_from([gpus, 2 * gpus, 4 * gpus, 8 * gpus])
    return {
        "global_batch_size": draw(batch),
        "seq_length": draw(st.sampled_from([128, 256, 512, 1024, 2048, 4096])),
        "precision": draw(st.sampled_from(["bf16", "fp16"])),
        "optimizer": draw(st.sampled_from(["adam", "sgd"])),
        "flash_attention_available": draw(st.booleans()),
        "overlap_grad_reduce": draw(st.booleans()),
        "overlap_param_gather": draw(st.booleans()),
        "tp_comm_overlap": draw(st.booleans()),
        "dropout": draw(st.booleans()),
    }


def _subset(values: list[Any]) -> st.SearchStrategy[tuple[Any, ...]]:
    return st.lists(st.sampled_from(values), min_size=1, max_size=len(values), unique=True).map(
        tuple
    )


@st.composite
def search_space_fields(draw: st.DrawFn) -> dict[str, Any]:
    """Restrictions of some knobs (the others keep their defaults)."""
    options: dict[str, st.SearchStrategy[Any]] = {
        "tp": _subset([1, 2, 4, 8]),
        "pp": _subset([1, 2, 3, 4, 8]),
        "dp": _subset([1, 2, 4, 8, 16]),
        "micro_batch_size": _subset([1, 2, 4, 8]),
        "vpp": _subset([1, 2, 3, 4]),
        "sequence_parallel": _subset([True, False]),
        "recompute": _subset(["none", "selective", "full"]),
        "distributed_optimizer": _subset([True, False]),
        "flash_attention": _subset([True, False]),
        "use_all_gpus": st.booleans(),
    }
    chosen = draw(st.lists(st.sampled_from(sorted(options)), max_size=3, unique=True))
    return {key: list(v) if isinstance(v := draw(options[key]), tuple) else v for key in chosen}


# ------------------------------------------------------------------ clusters
@st.composite
def generated_clusters(draw: st.DrawFn) -> ClusterSpec:
    """A generator cluster (G1-G6) of 1-8 nodes (G4: 3-8) and at most :data:`MAX_GPUS` GPUs."""
    kind = draw(st.sampled_from(sorted(GENERATORS)))
    gpn = 8 if kind == "v100-cube" else draw(st.sampled_from([1, 2, 4, 8]))
    nodes = draw(st.integers(3 if kind == "oversubscribed" else 1, min(8, MAX_GPUS // gpn)))
    params: dict[str, Any] = {}
    if kind == "oversubscribed":
        params["pod_size"] = draw(st.integers(1, nodes - 1))
    seed = draw(st.integers(0, 2**16))
    return generate(kind, nodes=nodes, seed=seed, gpus_per_node=gpn, **params)


_GPU_NAMES = sorted(GPU_CATALOG)


@st.composite
def cluster_file_fields(draw: st.DrawFn, max_nodes: int = 6) -> dict[str, Any]:
    """The fields of a cluster file with a random node matrix: failed (0 / null) pairs,
    asymmetric links, and sometimes mixed GPU types (of one vendor)."""
    gpn = draw(st.sampled_from([1, 2, 4, 8]))
    n = draw(st.integers(1, min(max_nodes, MAX_GPUS // gpn)))
    failed = st.sampled_from([0, None])  # both mean a failed pair
    link = st.floats(0.5, 400).map(lambda x: round(x, 3))
    odds = draw(st.sampled_from([0, 10, 4]))  # no failed pair, about 1 in 10, 1 in 4

    def pair() -> float | None:
        return draw(failed) if odds and draw(st.integers(1, odds)) == 1 else draw(link)

    rows = [[None if i == j else pair() for j in range(n)] for i in range(n)]
    for i in range(n):  # no node may lose every link (that is a bad input, fuzzed elsewhere)
        if n > 1 and not any(rows[i][j] for j in range(n) if j != i):
            j = (i + 1) % n
            rows[i][j] = rows[j][i] = 10.0
        if n > 1 and not any(rows[j][i] for j in range(n) if j != i):
            j = (i + 1) % n
            rows[j][i] = 10.0
    fields: dict[str, Any] = {
        "format": "pipette-cp-cluster/1",
        "name": "fuzz",
        "gpus_per_node": gpn,
        "node_bandwidth_gb_per_s": rows,
        "nics_per_node": draw(st.integers(1, 8)),
        "nic_bandwidth_gb_per_s": draw(st.floats(1, 100).map(lambda x: round(x, 2))),
        "intra_node_bandwidth_gb_per_s": draw(st.floats(10, 500).map(lambda x: round(x, 1))),
    }
    if draw(st.booleans()):  # mixed types of one vendor (one job runs on one vendor's GPUs)
        vendor = draw(st.sampled_from(sorted({g.vendor for g in GPU_CATALOG.values()})))
        names = [k for k in _GPU_NAMES if GPU_CATALOG[k].vendor == vendor]
        fields["node_gpu_types"] = [draw(st.sampled_from(names)) for _ in range(n)]
    else:
        fields["gpu"] = draw(st.sampled_from([*_GPU_NAMES, "a100", "h100", "v100"]))
    return fields


@st.composite
def matrix_clusters(draw: st.DrawFn) -> ClusterSpec:
    return cluster_from_mapping(draw(cluster_file_fields()), "cluster")


def clusters() -> st.SearchStrategy[ClusterSpec]:
    return st.one_of(generated_clusters(), matrix_clusters())


# ------------------------------------------------------------------ instances
@st.composite
def instances(draw: st.DrawFn) -> Instance:
    """A valid instance: model, cluster, training and a (possibly restricted) search space."""
    cluster = draw(clusters())
    training = draw(training_fields(cluster.num_gpus))
    space = draw(search_space_fields()) if draw(st.booleans()) else {}
    return Instance(
        name="fuzz",
        model=draw(models()),
        cluster=cluster,
        training=validate_spec(TrainingSpec, training, "training"),
        search_space=validate_spec(SearchSpace, space, "search_space"),
    )


# ------------------------------------------------------------------ validity of what is accepted
#: Fields (any spec) that must be > 0 wherever they appear in a dump.
POSITIVE_FIELDS = frozenset({
    "num_nodes", "gpus_per_node", "nics_per_node", "nic_bandwidth_bytes_per_s",
    "global_batch_size", "seq_length", "num_layers", "hidden_size", "num_attention_heads",
    "ffn_hidden_size", "vocab_size", "max_seq_length", "memory_bytes", "peak_flops_per_s",
    "hbm_bandwidth_bytes_per_s", "iteration_time_s",
})  # fmt: skip


#: Largest cluster whose spec is round-tripped (JSON, cluster-file mapping) when accepted.
ROUND_TRIP_MAX_GPUS = 256


def assert_valid(spec: object) -> None:
    """What an accepted input must satisfy, not only "it did not crash": the spec
    round-trips (JSON dump and load give an equal spec), every number in it is finite
    and >= 0, the sizes are > 0, and a cluster's matrix holds 0 (failed) or a
    bandwidth in the range the cluster files can hold, and round-trips through the
    cluster-file mapping."""
    from pydantic import BaseModel

    assert isinstance(spec, BaseModel), type(spec)
    clusters = _clusters_in(spec)
    if all(c.num_gpus <= ROUND_TRIP_MAX_GPUS for c in clusters):
        again = type(spec).model_validate_json(spec.model_dump_json())
        assert again == spec, f"{type(spec).__name__} does not round-trip through JSON"
    exclude: Any = None  # the matrix is checked with numpy (as nested lists it is slow)
    if isinstance(spec, ClusterSpec):
        exclude = {"bandwidth_bytes_per_s"}
    elif clusters:
        exclude = {"cluster": {"bandwidth_bytes_per_s"}}
    _check_numbers(spec.model_dump(exclude=exclude), type(spec).__name__)
    for cluster in clusters:
        _check_cluster(cluster)


def _clusters_in(spec: object) -> list[ClusterSpec]:
    if isinstance(spec, ClusterSpec):
        return [spec]
    if isinstance(spec, Instance):
        return [spec.cluster]
    return []


def _check_numbers(data: Any, where: str) -> None:
    stack = [(data, where)]
    while stack:
        value, path = stack.pop()
        if isinstance(value, dict):
            stack.extend((v, f"{path}.{k}") for k, v in value.items())
        elif isinstance(value, list | tuple):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(value))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            assert math.isfinite(value), f"{path}={value} is not finite"
            assert value >= 0, f"{path}={value} is negative"
            if path.rsplit(".", 1)[-1] in POSITIVE_FIELDS:
                assert value > 0, f"{path}={value} must be > 0"


def _check_cluster(cluster: ClusterSpec) -> None:
    from pipette_cp.io.cluster_file import cluster_from_mapping, cluster_to_mapping
    from pipette_cp.specs.cluster import MAX_GPUS, MAX_LINK_BYTES_PER_S, MIN_LINK_BYTES_PER_S

    matrix = cluster.bandwidth_bytes_per_s
    assert 0 < cluster.num_gpus <= MAX_GPUS and matrix.shape == (cluster.num_gpus,) * 2
    assert np.isfinite(matrix).all() and not np.diagonal(matrix).any()
    assert np.min(matrix, where=matrix > 0, initial=np.inf) >= MIN_LINK_BYTES_PER_S
    assert matrix.max() <= MAX_LINK_BYTES_PER_S
    if cluster.num_gpus > ROUND_TRIP_MAX_GPUS:
        return  # valid as checked; the round trips of a 10k-GPU matrix take minutes
    again = cluster_from_mapping(cluster_to_mapping(cluster, decimals=None), "cluster")
    assert again.num_nodes == cluster.num_nodes and again.node_names == cluster.node_names
    np.testing.assert_allclose(again.bandwidth_bytes_per_s, matrix, rtol=1e-12)
