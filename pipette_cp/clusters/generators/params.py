"""Parameter checks and the leaf-structured base fabric shared by the generators.

Checks raise :class:`~pipette_cp.errors.SpecError` with the field named
``<kind>.<parameter>`` and the allowed range, e.g.
``oversubscribed.oversubscription=5: must be one of 2.8, 7, 15``.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Real
from typing import Any

import numpy as np

from pipette_cp.clusters.generators.fabric import Fabric, Noise, persistent_noise
from pipette_cp.clusters.generators.noise import group_log_factor, log_split_of, upper_pairs
from pipette_cp.errors import SpecError
from pipette_cp.specs.cluster import MAX_GPUS_PER_NODE
from pipette_cp.specs.gpu import GpuSpec, resolve_gpu
from pipette_cp.units import GB

#: Docstring of the noise parameters every generator takes (numbers: docs/design.md, section 5).
NOISE_DOC = """
    noise_sigma : float
        Lognormal standard deviation of a healthy pair around its switch-group level,
        direction part (0.024) included: about the healthy CV within one leaf.
        docs/design.md, section 5 gives "sigma ~0.03" and healthy CVs of 0.2-4 % (xxrjun
        H100 clusters: 0.5 % and, leaf structure included, 4.1 %); 0.026 keeps a
        cluster of two leaves at 0.95 x under 4 % (about 3.7 %).
    direction_sigma : float
        Standard deviation of each direction's own log-deviation; the mean relative
        asymmetry is ``2 direction_sigma / sqrt(pi)`` = 4.0 % for docs/design.md's 0.035.
    persistent_share : float
        Share of the noise variance that persists between snapshots: the pair
        correlation of two snapshots of one leaf (docs/design.md: ~0.55); leaf structure
        and the outlier pair, which persist, raise it.
    asymmetry_clip : float
        Cap on any pair's relative direction asymmetry (docs/design.md: max 15 %).
    asymmetry_outlier : float
        Asymmetry of one random outlier pair in clusters of 8 or more nodes
        (docs/design.md: 31 % on one pair); 0 for none."""

#: Docstring of the parameters :func:`leaf_generator` adds before a generator's own, with
#: the generator's defaults filled in (its docstring says where they come from).
COMMON_DOC = """
    rng : numpy.random.Generator
        The random stream (``numpy.random.default_rng(seed)``).
    nodes : int
        Number of servers (>= 1; one node has no inter-node pair).
    gpus_per_node : int
        GPUs per server ({gpus_per_node} by default).
    gpu : str
        Catalogue GPU name (:func:`~pipette_cp.specs.gpu.resolve_gpu`; ``{gpu}`` by default).
    nics_per_node : int
        NICs per server for the traffic between nodes ({nics_per_node} by default).
    nic_gbytes_per_s : float
        What one GPU-to-GPU stream between two nodes delivers over one NIC under load,
        GB/s ({nic_gbytes_per_s:g} by default)."""

#: Defaults of the noise parameters of :data:`NOISE_DOC` (a generator may override some).
NOISE_DEFAULTS: dict[str, float] = {
    "noise_sigma": 0.026,
    "direction_sigma": 0.035,
    "persistent_share": 0.55,
    "asymmetry_clip": 0.15,
    "asymmetry_outlier": 0.31,
}

#: Clusters smaller than this get no asymmetry outlier pair.
OUTLIER_MIN_NODES = 8


# ------------------------------------------------------------------ checks
def number(field: str, value: Any, low: float, high: float, *, open_low: bool = False) -> float:
    """``value`` as a float in ``[low, high]`` (``(low, high]`` if ``open_low``)."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise SpecError(field, value, "expected a number")
    number_ = float(value)
    bad_low = number_ <= low if open_low else number_ < low
    if bad_low or number_ > high:
        left = "(" if open_low else "["
        raise SpecError(field, value, f"must be in {left}{low:g}, {high:g}]")
    return float(value)


def bandwidth(field: str, value: Any) -> float:
    """``value`` as a bandwidth in GB/s, in ``(0, 1e4]``."""
    return number(field, value, 0.0, 1e4, open_low=True)


def factor(field: str, value: Any) -> float:
    """``value`` as a bandwidth factor or share, in ``(0, 1]``."""
    return number(field, value, 0.0, 1.0, open_low=True)


def factor_range(kind: str, name: str, low: Any, high: Any) -> tuple[float, float]:
    """``<name>_low`` and ``<name>_high`` as factors (:func:`factor`), the low one first."""
    low_, high_ = factor(f"{kind}.{name}_low", low), factor(f"{kind}.{name}_high", high)
    if high_ < low_:
        raise SpecError(f"{kind}.{name}_high", high, f"must be >= {name}_low={low_:g}")
    return low_, high_


def integer(field: str, value: Any, low: int, why: str = "") -> int:
    """``value`` as an int ``>= low``; ``why`` explains the bound in the message."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise SpecError(field, value, "expected an integer")
    if value < low:
        raise SpecError(field, value, f"must be >= {low}" + (f" {why}" if why else ""))
    return int(value)


def choice(field: str, value: Any, options: tuple[Any, ...], why: str = "") -> Any:
    """``value`` if it equals one of ``options`` (numbers compared to 1e-9)."""
    for option in options:
        if isinstance(option, Real) and isinstance(value, Real) and not isinstance(value, bool):
            if abs(float(value) - float(option)) <= 1e-9 * max(1.0, abs(float(option))):
                return option
        elif value == option:
            return option
    listed = ", ".join(f"{o:g}" if isinstance(o, float) else str(o) for o in options)
    raise SpecError(field, value, f"must be one of {listed}" + (f" {why}" if why else ""))


def gpu_type(field: str, value: Any) -> GpuSpec:
    """A catalogue GPU by name (see :func:`pipette_cp.specs.gpu.resolve_gpu`)."""
    return resolve_gpu(value, field)


def noise_model(kind: str, params: dict[str, Any]) -> Noise:
    """Check the noise parameters of ``kind`` and build the :class:`Noise`."""
    direction = number(f"{kind}.direction_sigma", params["direction_sigma"], 0.0, 0.06)
    clip = factor(f"{kind}.asymmetry_clip", params["asymmetry_clip"])
    if 2.0 * direction / math.sqrt(math.pi) >= 0.95 * clip:
        raise SpecError(
            f"{kind}.asymmetry_clip",
            clip,
            f"must exceed the mean asymmetry 2 direction_sigma/sqrt(pi) = "
            f"{2 * direction / math.sqrt(math.pi):.3f} of direction_sigma={direction:g}",
        )
    noise = Noise(
        sigma=number(f"{kind}.noise_sigma", params["noise_sigma"], 0.0, 0.5),
        direction_sigma=direction,
        persistent_share=number(f"{kind}.persistent_share", params["persistent_share"], 0.0, 1.0),
        asymmetry_clip=clip,
    )
    floor = math.sqrt(noise.direction_variance)
    if noise.sigma < floor - 1e-12:
        raise SpecError(
            f"{kind}.noise_sigma",
            noise.sigma,
            f"must be >= {floor:.4f}, the part that direction_sigma={direction:g} already adds",
        )
    number(f"{kind}.asymmetry_outlier", params["asymmetry_outlier"], 0.0, 1.0)
    return noise


def parameters_of(builder: Callable[..., Fabric]) -> dict[str, Any]:
    """The keyword parameters of a generator and their defaults (``nodes`` has none)."""
    skip = {"rng", "nodes", "base_params"}
    return {
        name: p.default
        for name, p in inspect.signature(builder).parameters.items()
        if name not in skip and p.kind is inspect.Parameter.KEYWORD_ONLY
    }


def call_builder(
    kind: str,
    builder: Callable[..., Fabric],
    rng: np.random.Generator,
    nodes: int,
    params: dict[str, Any],
    extra: tuple[str, ...] = (),
) -> Fabric:
    """Call ``builder`` after rejecting unknown parameter names with a :class:`SpecError`.

    ``extra`` names parameters the builder forwards to another one (a base generator).
    """
    known = parameters_of(builder)
    for name in params:
        if name not in known and name not in extra:
            listed = ", ".join(sorted([*known, *extra]))
            raise SpecError(f"{kind}.{name}", params[name], f"unknown parameter; known: {listed}")
    return builder(rng, nodes=nodes, **params)


# ------------------------------------------------------------------ leaf generators
@dataclass(frozen=True)
class Common:
    """The parameters every leaf-structured generator (G1, G2, G4, G5) takes, as given.

    :func:`leaf_generator` checks all but ``gpu`` (resolved by :func:`leaf_fabric`, after
    the generator's own checks) and ``noise`` (checked by :func:`leaf_fabric` too).
    """

    kind: str
    nodes: int
    gpus_per_node: int
    gpu: str
    nics_per_node: int
    nic_gbytes_per_s: float
    noise: dict[str, Any]


def _keyword(
    name: str, annotation: str, default: Any = inspect.Parameter.empty
) -> inspect.Parameter:
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
    )


def leaf_generator(
    kind: str,
    *,
    gpu: str,
    nics_per_node: int,
    nic_gbytes_per_s: float,
    gpus_per_node: int = 8,
    **noise: float,
) -> Callable[[Callable[..., Fabric]], Callable[..., Fabric]]:
    """Decorator of a leaf-structured generator ``func(rng, common, *, own parameters)``.

    The generator it makes takes ``rng`` and, keyword-only, ``nodes``,
    ``gpus_per_node``, ``gpu``, ``nics_per_node`` and ``nic_gbytes_per_s``
    (defaults given here, ``gpus_per_node`` 8 unless given), ``func``'s own parameters, then the noise parameters
    (:data:`NOISE_DEFAULTS`, ``noise`` overriding some); its signature lists them all
    (:func:`parameters_of` reads it).  It checks ``nodes >= 1``, ``gpus_per_node >= 1``,
    ``nics_per_node >= 1`` and ``nic_gbytes_per_s`` in (0, 1e4], then calls ``func``
    with the common ones as a :class:`Common`.  In ``func``'s docstring ``{common}``
    becomes :data:`COMMON_DOC` (with these defaults) and ``{noise}`` :data:`NOISE_DOC`.
    """
    unknown = set(noise) - set(NOISE_DEFAULTS)
    assert not unknown, f"not noise parameters: {sorted(unknown)}"
    noise_defaults = {**NOISE_DEFAULTS, **noise}

    def wrap(func: Callable[..., Fabric]) -> Callable[..., Fabric]:
        signature = inspect.signature(func)
        rng, _, *own = signature.parameters.values()
        head = [
            _keyword("nodes", "int"),
            _keyword("gpus_per_node", "int", gpus_per_node),
            _keyword("gpu", "str", gpu),
            _keyword("nics_per_node", "int", nics_per_node),
            _keyword("nic_gbytes_per_s", "float", nic_gbytes_per_s),
        ]
        tail = [_keyword(name, "float", value) for name, value in noise_defaults.items()]
        public = signature.replace(parameters=[rng, *head, *own, *tail])

        @functools.wraps(func)
        def generator(*args: Any, **kwargs: Any) -> Fabric:
            bound = public.bind(*args, **kwargs)
            bound.apply_defaults()
            values = dict(bound.arguments)
            common = Common(
                kind=kind,
                **{p.name: values.pop(p.name) for p in head},
                noise={name: values.pop(name) for name in noise_defaults},
            )
            integer("nodes", common.nodes, 1)
            integer("gpus_per_node", common.gpus_per_node, 1)
            integer(f"{kind}.nics_per_node", common.nics_per_node, 1)
            for name in ("gpus_per_node", "nics_per_node"):
                if getattr(common, name) > MAX_GPUS_PER_NODE:  # before any matrix is built
                    raise SpecError(name, getattr(common, name),
                                    f"at most {MAX_GPUS_PER_NODE} are modelled")  # fmt: skip
            bandwidth(f"{kind}.nic_gbytes_per_s", common.nic_gbytes_per_s)
            return func(values.pop(rng.name), common, **values)

        generator.__signature__ = public  # type: ignore[attr-defined]
        if func.__doc__:
            defaults = {p.name: p.default for p in head[1:]}
            common_doc = COMMON_DOC.strip("\n").format(**defaults)
            doc = func.__doc__.replace("    {common}", common_doc)
            generator.__doc__ = doc.replace("    {noise}", NOISE_DOC.strip("\n"))
        return generator

    return wrap


# ------------------------------------------------------------------ base fabric
def leaf_fabric(
    rng: np.random.Generator,
    common: Common,
    *,
    groups: np.ndarray,
    level_bytes_per_s: float,
    cross_group_factor: float,
    intra_node: float | np.ndarray,
) -> Fabric:
    """A healthy fabric: ``level`` inside a group, ``x cross_group_factor`` across, plus noise.

    Checks ``common.gpu`` and the noise parameters first.  Draw order: persistent
    symmetric noise, persistent direction normals, outlier pair.
    """
    gpu = gpu_type(f"{common.kind}.gpu", common.gpu)
    nodes = groups.size
    noise = noise_model(common.kind, common.noise)
    symmetric, direction = persistent_noise(rng, nodes, noise)
    log_level = math.log(level_bytes_per_s) + group_log_factor(groups, cross_group_factor)
    log_level = log_level + symmetric
    np.fill_diagonal(log_level, 0.0)
    outlier = None
    asym = float(common.noise["asymmetry_outlier"])
    if asym > 0.0 and nodes >= OUTLIER_MIN_NODES:
        rows, cols = upper_pairs(nodes)
        pick = int(rng.integers(rows.size))
        sign = 1.0 if rng.random() < 0.5 else -1.0
        outlier = (int(rows[pick]), int(cols[pick]), sign * log_split_of(asym))
    return Fabric(
        label="",
        gpu=gpu,
        gpus_per_node=common.gpus_per_node,
        intra_node=intra_node,
        nics_per_node=common.nics_per_node,
        nic_bandwidth_bytes_per_s=common.nic_gbytes_per_s * GB,
        groups=np.asarray(groups, dtype=np.int64),
        log_level=log_level,
        failed=np.zeros((nodes, nodes), dtype=bool),
        direction_z=direction,
        noise=noise,
        source="",
        outlier=outlier,
    )
