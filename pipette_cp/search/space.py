"""Every candidate layout of an instance: (dp, pp, tp) and the other knobs.

A *skeleton* is a :class:`~pipette_cp.specs.Plan` whose degrees and knobs are
fixed and whose layer split (even) and placement (Megatron's tp-dp-pp order)
are only starting points for the solvers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import product
from typing import Any

from pipette_cp.cost.stack.kernels import (
    NVIDIA_ONLY_ATTENTION,
    is_hopper,
    unknown_architecture_hint,
)
from pipette_cp.errors import SpecError
from pipette_cp.specs import Instance, Plan, SearchSpace
from pipette_cp.specs.knobs import KNOBS, Job
from pipette_cp.specs.layouts import even_split, megatron_placement
from pipette_cp.specs.selection import gpu_totals


def divisors(n: int, at_most: int | None = None) -> list[int]:
    """Positive divisors of ``n`` (those up to ``at_most``) in increasing order, in
    ``O(min(sqrt n, at_most))`` steps."""
    limit = n if at_most is None else min(n, at_most)
    root = math.isqrt(n)
    if limit <= root:
        return [d for d in range(1, limit + 1) if n % d == 0]
    small = [d for d in range(1, root + 1) if n % d == 0]
    large = [n // d for d in reversed(small) if n // d != d and n // d <= limit]
    return small + large


@dataclass(frozen=True)
class Degrees:
    """One (dp, pp, tp) factorisation, with context and expert parallelism."""

    dp: int
    pp: int
    tp: int
    cp: int = 1
    ep: int = 1
    etp: int | None = None

    @property
    def gpus(self) -> int:
        return self.dp * self.pp * self.tp * self.cp


#: Context parallelism is tried by default from this sequence length on, keeping at
#: least :data:`MIN_CP_TOKENS` tokens per GPU (shorter chunks leave the ring exposed).
CP_FROM_SEQ_LENGTH = 8192
MIN_CP_TOKENS = 4096


def context_sizes(instance: Instance, space: SearchSpace) -> list[int]:
    """Context-parallel sizes to try: ``space.cp``, or 1 and, for long sequences, the
    powers of two keeping :data:`MIN_CP_TOKENS` tokens per GPU; only those with
    ``2 cp`` dividing the sequence length (Megatron's load-balanced chunks)."""
    seq = instance.training.seq_length
    if space.cp is not None:
        return [c for c in space.cp if c == 1 or seq % (2 * c) == 0]
    out, c = [1], 2
    while seq >= CP_FROM_SEQ_LENGTH and seq // c >= MIN_CP_TOKENS and seq % (2 * c) == 0:
        out.append(c)
        c *= 2
    return out


def expert_sizes(instance: Instance, space: SearchSpace, tp: int) -> list[tuple[int, int | None]]:
    """(ep, etp) pairs to try: (1, None) for a dense model; for experts ``space.ep``
    (default: every divisor of num_experts) x ``space.etp`` (default: tp, as
    Megatron-Core, and 1), with etp dividing the expert FFN width."""
    model = instance.model
    if not model.is_moe:
        return [(1, None)]
    # an expert group is no larger than the job
    eps = (
        space.ep if space.ep is not None else divisors(model.num_experts, instance.cluster.num_gpus)
    )
    etps = space.etp if space.etp is not None else sorted({tp, 1})
    return [
        (e, None if t == tp else t)
        for e in eps
        if model.num_experts % e == 0
        for t in etps
        if model.expert_width % t == 0
    ]


def gpu_counts(instance: Instance, space: SearchSpace | None = None) -> list[int]:
    """GPU totals a layout may use, largest first (:func:`~pipette_cp.specs.selection.gpu_totals`:
    the GPUs of the nodes not excluded, and by default whole nodes fewer)."""
    return gpu_totals(instance.cluster, space or instance.search_space)


def tensor_sizes(instance: Instance) -> list[int]:
    """Tensor-parallel sizes a group of one node (one NVLink domain) can take: the
    divisors of gpus_per_node, and where domains span several nodes the multiples of
    it dividing the domain's GPUs (whole nodes of one domain)."""
    c = instance.cluster
    g, per = c.gpus_per_node, c.nodes_per_nvlink_domain
    return divisors(g) + [m * g for m in divisors(per) if m > 1]


def degrees(instance: Instance, space: SearchSpace | None = None) -> list[Degrees]:
    """Valid (dp, pp, tp): tp within a node (or an NVLink domain, :func:`tensor_sizes`)
    and dividing the heads and kv heads, pp <= layers, dp x pp x tp one of
    :func:`gpu_counts`, restricted by ``space``."""
    space = space or instance.search_space
    model = instance.model
    tps = [
        t
        for t in tensor_sizes(instance)
        if model.num_attention_heads % t == 0
        and model.kv_heads % t == 0
        and (space.tp is None or t in space.tp)
    ]
    found: list[Degrees] = []
    cps = context_sizes(instance, space)
    for total in gpu_counts(instance, space):
        for tp, cp in product(tps, cps):
            if total % (tp * cp):
                continue
            experts = expert_sizes(instance, space, tp)
            for pp in divisors(total // (tp * cp)):
                dp = total // (tp * cp * pp)
                if pp > model.num_layers or (space.pp is not None and pp not in space.pp):
                    continue
                if space.dp is not None and dp not in space.dp:
                    continue
                found.extend(
                    Degrees(dp, pp, tp, cp, ep, etp)
                    for ep, etp in experts
                    if (tp * cp * dp) % (ep * (tp if etp is None else etp)) == 0
                )
    return found


def check_degrees(instance: Instance, space: SearchSpace) -> None:
    """Raise :class:`SpecError` naming the knob when the space leaves no (dp, pp, tp), or
    asks for context or expert parallelism the model or sequence cannot take."""
    _check_context_and_experts(instance, space)
    if degrees(instance, space):
        return
    model, cluster = instance.model, instance.cluster
    g, domain = cluster.gpus_per_node, cluster.gpus_per_domain
    heads, kv = model.num_attention_heads, model.kv_heads
    sizes = tensor_sizes(instance)

    def why(t: int) -> str:
        if domain > g and t > domain:
            return f"{t} exceeds the {domain} GPUs of an NVLink domain"
        if domain > g and t not in sizes:
            return (f"{t} neither divides the {g} GPUs of a node nor is a multiple of them "
                    f"dividing the {domain} GPUs of an NVLink domain")  # fmt: skip
        if t > g and t not in sizes:
            return f"{t} exceeds the {g} GPUs of a node"
        if t not in sizes:
            return f"{t} does not divide the {g} GPUs of a node"
        return f"{t} does not divide the {heads} attention heads and {kv} KV heads"

    tps = [t for t in sizes if heads % t == 0 and kv % t == 0]
    if space.tp is not None and not set(space.tp) & set(tps):
        raise SpecError("search_space.tp", space.tp,
                        "no tensor-parallel size can run: " + "; ".join(why(t) for t in space.tp)
                        + f" (possible: {', '.join(map(str, tps))})")  # fmt: skip
    if space.pp is not None and min(space.pp) > model.num_layers:
        raise SpecError("search_space.pp", space.pp,
                        f"every pipeline size exceeds the model's {model.num_layers} layers")  # fmt: skip
    totals = ", ".join(map(str, gpu_counts(instance, space)))
    raise SpecError(
        "search_space", {k: getattr(space, k) for k in ("dp", "pp", "tp") if getattr(space, k)},
        f"no dp x pp x tp of the allowed sizes uses {totals} GPUs",
    )  # fmt: skip


def _check_context_and_experts(instance: Instance, space: SearchSpace) -> None:
    model, seq = instance.model, instance.training.seq_length
    if space.cp is not None and not context_sizes(instance, space):
        raise SpecError("search_space.cp", space.cp,
                        f"no context-parallel size has 2 x cp dividing seq_length={seq}")  # fmt: skip
    if not model.is_moe:
        if space.ep is not None and space.ep != (1,):
            raise SpecError("search_space.ep", space.ep, "expert parallelism needs a "
                            "mixture-of-experts model (model.num_experts)")  # fmt: skip
        if space.etp is not None:
            raise SpecError("search_space.etp", space.etp, "expert tensor parallelism needs a "
                            "mixture-of-experts model (model.num_experts)")  # fmt: skip
        return
    if space.ep is not None and not [e for e in space.ep if model.num_experts % e == 0]:
        raise SpecError("search_space.ep", space.ep,
                        f"no expert-parallel size divides num_experts={model.num_experts}")  # fmt: skip
    if space.etp is not None and not [t for t in space.etp if model.expert_width % t == 0]:
        raise SpecError("search_space.etp", space.etp, "no expert tensor-parallel size divides "
                        f"the expert FFN width {model.expert_width}")  # fmt: skip


def enumerate_layouts(instance: Instance, space: SearchSpace | None = None) -> Iterator[Plan]:
    """Every skeleton plan the search space allows and Megatron can run.

    For every (dp, pp, tp) of :func:`degrees`, the knobs' values
    (:data:`pipette_cp.specs.knobs.KNOBS`, each knob's ``choices`` given the degrees and
    the knobs before it) as nested loops, the first knob outermost.  Knobs that cannot
    matter are not duplicated: sequence parallelism needs tp > 1, the distributed
    optimizer dp > 1, FlashAttention availability on this stack; interleaving needs
    pp > 1, at least one layer per chunk, and (Megatron) pp dividing the number of
    micro-batches.

    Raises
    ------
    SpecError
        An attention kernel the cluster's GPUs cannot run (:func:`check_kernels`).
    """
    space = space or instance.search_space
    layers = instance.model.num_layers
    check_kernels(instance, space)
    job = Job(instance.model, instance.training, space)
    layout = _Layout()
    for d in degrees(instance, space):
        layout.update(dp=d.dp, pp=d.pp, tp=d.tp, cp=d.cp, ep=d.ep, etp=d.etp)
        placement = megatron_placement(d.dp * d.cp, d.pp, d.tp)
        # a chunk holds a layer at least: no split of more chunks than layers is built
        splits = {v: even_split(layers, d.pp, v) for v in space.vpp if d.pp * v <= layers}
        for chosen in _choose(job, layout):
            yield Plan(**chosen, layer_split=splits[chosen["vpp"]], placement=placement)


class _Layout(dict[str, Any]):
    """A layout being enumerated: its degrees and the knobs chosen so far, as items and
    as attributes (what the knobs' ``choices`` read)."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


#: Each knob's fields, in :data:`KNOBS` order, and whether it has only one.
_FIELDS = tuple((knob.fields, len(knob.fields) == 1) for knob in KNOBS)


def _choose(job: Job, layout: _Layout) -> Iterator[_Layout]:
    """``layout`` with every combination of the knobs' values: nested loops, the first
    knob outermost, each knob's choices asked once per combination of those before it
    (the same object, updated in place)."""
    last = len(KNOBS) - 1
    pending: list[Iterator[Any]] = [iter(KNOBS[0].choices(job, layout))]
    while pending:
        i = len(pending) - 1
        value: Any = next(pending[i], _DONE)
        if value is _DONE:
            pending.pop()
            continue
        names, single = _FIELDS[i]
        if single:
            layout[names[0]] = value
        else:
            layout.update(zip(names, value, strict=True))
        if i == last:
            yield layout
        else:
            pending.append(iter(KNOBS[i + 1].choices(job, layout)))


_DONE = object()


def check_kernels(instance: Instance, space: SearchSpace) -> None:
    """Raise :class:`SpecError` for an attention kernel of ``space`` the cluster's GPUs
    cannot run: FlashAttention 3 on GPUs other than Hopper, NVIDIA-only kernels on
    others (by each GPU's ``architecture``)."""
    if space.attention_kernel is None:
        return
    others = [g for g in instance.cluster.gpu_types.values() if not is_hopper(g)]
    if "flash3" in space.attention_kernel and others:
        raise SpecError(
            "search_space.attention_kernel",
            space.attention_kernel,
            f"flash3 runs on Hopper GPUs (H100, H200) only; the cluster has {others[0].name}"
            + unknown_architecture_hint(others[0], "hopper"),
        )
    amd = [g.name for g in instance.cluster.gpu_types.values() if g.vendor != "NVIDIA"]
    if amd and (nvidia := [k for k in space.attention_kernel if k in NVIDIA_ONLY_ATTENTION]):
        raise SpecError(
            "search_space.attention_kernel",
            space.attention_kernel,
            f"{nvidia[0]} runs on NVIDIA GPUs only; the cluster has {amd[0]}",
        )
