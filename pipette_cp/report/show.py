"""Rich tables describing an instance: model, cluster bandwidth, training."""

from __future__ import annotations

import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text

from pipette_cp.clusters.stats import DEGRADED_BELOW, cluster_stats
from pipette_cp.specs import ClusterSpec, Instance, ModelSpec, TrainingSpec
from pipette_cp.units import GB, GiB


def _kv_table(title: str, rows: list[tuple[str, str]]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left", box=None, pad_edge=False)
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column()
    for key, value in rows:
        table.add_row(key, value)
    return table


def _count(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def _attention_row(model: ModelSpec) -> str:
    """Heads, and latent attention's ranks or the attention extras."""
    if model.is_mla:
        q_rank = model.q_lora_rank or "-"
        return (
            f"{model.num_attention_heads} (latent attention: q rank {q_rank}, kv rank "
            f"{model.kv_lora_rank}, qk {model.qk_nope_head_dim} + {model.qk_rope_head_dim} "
            f"rope, v {model.v_head_dim})"
        )
    extras = [name for flag, name in ((model.qk_norm, "q/k norm"), (model.attention_sinks, "sinks")) if flag]  # fmt: skip
    if model.sliding_window is not None:
        n = model.sliding_window_pattern
        full = f" (whole context on 1 layer in {n})" if n else ""
        extras.append(f"{model.sliding_window}-token sliding window{full}")
    gqa = f"{model.num_attention_heads} / {model.kv_heads} kv (head dim {model.head_size})"
    return gqa + (f", {', '.join(extras)}" if extras else "")


def _experts_row(model: ModelSpec) -> str:
    """Routed and shared experts, and which layers have them."""
    text = f"{model.num_experts} x {model.expert_width}, top {model.moe_top_k}"
    if model.num_shared_experts:
        text += f", {model.num_shared_experts} shared ({model.shared_expert_width})"
    layers = f"{model.num_moe_layers} of {model.num_layers} layers"
    if model.first_k_dense_layers or model.moe_layer_freq > 1:
        layers += f" (from layer {model.first_k_dense_layers}, every {model.moe_layer_freq})"
    return f"{text}; {layers}"


def model_table(model: ModelSpec) -> Table:
    """Architecture and derived parameter counts (total and, with experts, active)."""
    rows = [
        ("layers x hidden", f"{model.num_layers} x {model.hidden_size}"),
        ("heads", _attention_row(model)),
        ("ffn", f"{model.ffn_hidden_size} ({model.activation})"),
    ]
    if model.is_moe:
        rows.append(("experts", _experts_row(model)))
    rows += [
        ("vocab", f"{model.vocab_size} ({'tied' if model.tied_embeddings else 'untied'})"),
        ("norm / positions", f"{model.norm} / {model.position_embedding}"),
    ]
    if model.is_moe:
        rows.append(("params per MoE layer", _count(model.moe_layer_params)))
        if model.num_dense_layers:
            rows.append(("params per dense layer", _count(model.dense_layer_params)))
    else:
        rows.append(("params per layer", _count(model.dense_layer_params)))
    rows.append(("embedding params", _count(model.embedding_params)))
    if model.mtp_layers:
        rows.append(("MTP modules", f"{model.mtp_layers}: {_count(model.mtp_params)}"))
    rows.append(("total params", _count(model.total_params)))
    if model.is_moe:
        rows.append(("active params", f"{_count(model.active_params)} per token"))
    rows.append(("source", model.source or "-"))
    return _kv_table(f"Model {model.name}", rows)


def training_table(training: TrainingSpec) -> Table:
    """The fixed training settings."""
    tokens = training.global_batch_size * training.seq_length
    return _kv_table(
        "Training",
        [
            (
                "global batch",
                f"{training.global_batch_size} x {training.seq_length} = {_count(tokens)} tokens",
            ),
            ("precision / optimizer", f"{training.precision} / {training.optimizer}"),
            ("FlashAttention available", "yes" if training.flash_attention_available else "no"),
            (
                "attention kernel",
                training.attention_kernel or "default (cudnn on Hopper, else flash2)",
            ),
            ("norm kernels", "fused" if training.fused_norm else "PyTorch (unfused RMSNorm)"),
        ],
    )


def cluster_table(cluster: ClusterSpec, slowest: int = 5) -> Group:
    """Summary, bandwidth statistics, slowest node pairs and failed pairs (a fabric:
    its levels and exceptions, :func:`fabric_table`; no matrix is built)."""
    if cluster.fabric is not None:
        return fabric_table(cluster, slowest)
    nodes = cluster.node_matrix()
    g = cluster.gpus_per_node
    intra = [
        cluster.links[np.ix_(cluster.gpus_of_node(n), cluster.gpus_of_node(n))]
        for n in range(cluster.num_nodes)
    ]
    intra_vals = (
        np.concatenate([m[~np.eye(g, dtype=bool)] for m in intra]) if g > 1 else np.zeros(1)
    )
    rows = [
        ("shape", cluster.describe()),
        (
            "GPU memory",
            ", ".join(
                f"{t.name}: {t.memory_bytes / GiB:.1f} GiB" for t in cluster.gpu_types.values()
            ),
        ),
        (
            "intra-node GB/s",
            f"min {intra_vals.min() / GB:.1f}, median {np.median(intra_vals) / GB:.1f}",
        ),
        ("source", cluster.source or "-"),
    ]
    if cluster.num_nodes == 1:
        rows.insert(3, ("inter-node", "none (one node: every transfer stays inside it)"))
    parts: list = [_kv_table(f"Cluster {cluster.name}", rows)]
    if cluster.num_nodes > 1:
        stats = cluster_stats(cluster)
        ratio = stats.cross_vs_same_group_ratio
        parts.append(
            _kv_table(
                "Inter-node bandwidth (node pairs)",
                [
                    ("median", f"{stats.median_bytes_per_s / GB:.2f} GB/s"),
                    ("healthy CV", f"{stats.healthy_cv:.2%}"),
                    (
                        f"degraded (< {DEGRADED_BELOW:.0%} of median)",
                        f"{stats.degraded_fraction:.1%} of pairs, mean {stats.degraded_ratio_mean:.2f} x median",
                    ),
                    ("failed", f"{stats.failed_fraction:.1%} of pairs"),
                    (
                        "asymmetry",
                        f"mean {stats.asymmetry_mean:.1%}, max {stats.asymmetry_max:.1%}",
                    ),
                    ("cross / same group", f"{ratio:.3f}" if ratio is not None else "-"),
                ],
            )
        )
        parts.append(_slowest_pairs(cluster, nodes, slowest))
    if cluster.failed_mask.any():
        parts.append(_failed(cluster, nodes))
    return Group(*_spaced(parts))


def _spaced(parts: list) -> list:
    """Renderables separated by blank lines."""
    out: list = []
    for part in parts:
        out.extend([part, Text("")])
    return out[:-1]


def _node_pairs(
    cluster: ClusterSpec, nodes: np.ndarray, mask: np.ndarray
) -> list[tuple[int, int, str]]:
    """Node pairs selected by ``mask``, each unordered pair once when symmetric."""
    pairs = []
    for i, j in zip(*np.nonzero(mask), strict=True):
        symmetric = nodes[i, j] == nodes[j, i] and mask[j, i]
        if symmetric and j < i:
            continue
        pairs.append((int(i), int(j), "<->" if symmetric else "->"))
    return pairs


def _slowest_pairs(cluster: ClusterSpec, nodes: np.ndarray, count: int) -> Table:
    table = Table(title="Slowest node pairs", title_justify="left")
    for col in ("pair", "GB/s", "x median"):
        table.add_column(col, justify="left" if col == "pair" else "right")
    off = ~np.eye(cluster.num_nodes, dtype=bool)
    alive = off & (nodes > 0)
    median = float(np.median(nodes[alive])) if alive.any() else 1.0
    names = cluster.node_names
    pairs = sorted(_node_pairs(cluster, nodes, alive), key=lambda p: nodes[p[0], p[1]])[:count]
    for i, j, arrow in pairs:
        table.add_row(
            f"{names[i]} {arrow} {names[j]}",
            f"{nodes[i, j] / GB:.2f}",
            f"{nodes[i, j] / median:.2f}",
        )
    return table


def _failed(cluster: ClusterSpec, nodes: np.ndarray) -> Table:
    """Failed node pairs (every GPU pair failed) and the count of failed GPU pairs."""
    off = ~np.eye(cluster.num_nodes, dtype=bool)
    dead = _node_pairs(cluster, nodes, off & (nodes <= 0))
    names = cluster.node_names
    shown = ", ".join(f"{names[i]} {arrow} {names[j]}" for i, j, arrow in dead[:6])
    more = f" (+{len(dead) - 6} more)" if len(dead) > 6 else ""
    rows = [("GPU pairs", str(len(cluster.failed_pairs())))]
    if dead:
        rows.append((f"{len(dead)} node pairs", shown + more))
    return _kv_table("Failed pairs (never used)", rows)


def fabric_table(cluster: ClusterSpec, slowest: int = 5) -> Group:
    """A hierarchical cluster: shape, levels, NVLink, exception counts, the slowest and
    the failed node pairs among the exceptions; O(levels + exceptions), no matrix."""
    f = cluster.fabric
    assert f is not None
    memory = ", ".join(
        f"{t.name}: {t.memory_bytes / GiB:.1f} GiB" for t in cluster.gpu_types.values()
    )
    rows = [
        ("shape", cluster.describe()),
        ("GPU memory", memory),
        (
            "NVLink",
            f"{f.nvlink_bandwidth_bytes_per_s / GB:.1f} GB/s, {f.nvlink_latency_s * 1e6:g} us",
        ),
    ]
    rows += [
        (
            f"level {lv.name}",
            f"groups of {lv.nodes} nodes, {lv.bandwidth_bytes_per_s / GB:.2f} GB/s, "
            f"{lv.latency_s * 1e6:g} us",
        )
        for lv in f.levels
    ]
    nics = f.slow_nics
    low, high = (nics.nic_factor.min(), nics.nic_factor.max()) if nics.node.size else (1, 1)
    span = f"x {low:.2f}" + (f"-{high:.2f}" if high > low else "")
    factors = f", {span}" if nics.node.size else ""
    rows.append(("slow NICs", f"{nics.node.size:,} nodes{factors}"))
    for what, pairs in (("node pairs", f.node_pairs), ("GPU pairs", f.gpu_pairs)):
        dead = int((pairs.bandwidth_bytes_per_s <= 0).sum())
        rows.append((f"exception {what}", f"{pairs.src.size - dead:,} degraded, {dead:,} failed"))
    rows.append(("source", cluster.source or "-"))
    parts: list = [_kv_table(f"Cluster {cluster.name} (switch levels + exceptions)", rows)]
    pairs, names = f.node_pairs, cluster.node_names
    bw = pairs.bandwidth_bytes_per_s
    alive = np.flatnonzero(bw > 0)
    if alive.size:
        table = Table(title="Slowest node pairs (exceptions)", title_justify="left")
        for col in ("pair", "GB/s", "x its level"):
            table.add_column(col, justify="left" if col == "pair" else "right")
        pick = alive[np.argsort(bw[alive], kind="stable")[:slowest]]
        g = cluster.gpus_per_node
        level = f.level_of(pairs.src[pick] * g, pairs.dst[pick] * g)
        for k, lv in zip(pick.tolist(), level.tolist(), strict=True):
            nominal = f.levels[lv].bandwidth_bytes_per_s
            table.add_row(f"{names[pairs.src[k]]} -> {names[pairs.dst[k]]}",
                          f"{bw[k] / GB:.2f}", f"{bw[k] / nominal:.2f}")  # fmt: skip
        parts.append(table)
    failed = np.flatnonzero(bw <= 0)
    if failed.size:
        shown = ", ".join(
            f"{names[pairs.src[k]]} -> {names[pairs.dst[k]]}" for k in failed[:6].tolist()
        )
        more = f" (+{failed.size - 6} more)" if failed.size > 6 else ""
        parts.append(
            _kv_table("Failed pairs (never used)", [(f"{failed.size} node pairs", shown + more)])
        )
    return Group(*_spaced(parts))


def instance_report(instance: Instance) -> Group:
    """Everything `pipette-cp show` displays."""
    header = _kv_table(
        f"Instance {instance.name}",
        [("family", instance.family or "-"), ("description", instance.description or "-")],
    )
    return Group(
        header,
        model_table(instance.model),
        cluster_table(instance.cluster),
        training_table(instance.training),
    )
