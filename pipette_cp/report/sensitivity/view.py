"""A :class:`~pipette_cp.report.sensitivity.analysis.SensitivityReport` as rich tables, as the JSON
object of ``pipette-cp explain --json``, as one summary line and as a bar chart."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from matplotlib.figure import Figure
from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from pipette_cp.report.sensitivity.analysis import (
    MATTERS_PCT,
    Impact,
    LinkSensitivity,
    NodeSensitivity,
    SensitivityReport,
)
from pipette_cp.units import GB

_COLORS = {"link": "#4C72B0", "NIC": "#DD8452", "NVLink": "#55A868"}


def _change(factor: float) -> str:
    return "if it halves" if factor == 0.5 else f"at {factor:g}x its bandwidth"


def link_label(report: SensitivityReport, link: LinkSensitivity) -> str:
    """'GPU 3 (node000) <-> GPU 27 (node003)', or 'node000 <-> node003' for a node pair."""
    (na, nb), names = link.nodes, report.node_names
    if link.gpus is None:
        return f"{names[na]} <-> {names[nb]}"
    a, b = link.gpus
    return f"GPU {a} ({names[na]}) <-> GPU {b} ({names[nb]})"


def _ends(report: SensitivityReport, link: LinkSensitivity) -> tuple[str, str]:
    names = [report.node_names[n] for n in link.nodes]
    if link.gpus is None:
        return names[0], names[1]
    return f"{link.gpus[0]} ({names[0]})", f"{link.gpus[1]} ({names[1]})"


def _bandwidth(link: LinkSensitivity) -> str:
    there, back = link.bandwidth_bytes_per_s / GB, link.reverse_bandwidth_bytes_per_s / GB
    if abs(there - back) <= 0.01 * max(there, back):
        return f"{there:.1f}"
    return f"{there:.1f}/{back:.1f}"


def _most_critical(report: SensitivityReport) -> tuple[str, Impact] | None:
    """The single link, NIC or NVLink whose loss costs most (None if nothing matters)."""
    found: list[tuple[str, Impact]] = [
        (f"the link {link_label(report, link)}", link.impact) for link in report.links[:1]
    ]
    for node in report.nodes:
        found += [
            (f"{node.name}'s NIC", node.nic),
            (f"{node.name}'s NVLink", node.nvlink),
        ]
    found = [item for item in found if not item[1].is_zero]
    return max(found, key=lambda item: item[1].increase_s) if found else None


def summary_line(report: SensitivityReport) -> str:
    """'this plan depends most on node X's NIC: +7.9 % if it halves; N of M communicating
    pairs matter by > 1 %'."""
    unit = "GPU pairs" if report.granularity == "gpu" else "node pairs"
    counts = (
        f"{report.num_links_matter} of {report.num_links} communicating {unit} "
        f"matter by > {MATTERS_PCT:g} %"
    )
    top = _most_critical(report)
    if top is None:
        return f"this plan depends on no link of the cluster {_change(report.factor)}; {counts}"
    what, impact = top
    return (
        f"this plan depends most on {what}: +{impact.increase_pct:.1f} % "
        f"{_change(report.factor)}; {counts}"
    )


def _impact_cells(impact: Impact) -> list[str]:
    if impact.is_zero:
        return ["0", "0.0 %", "-"]
    return [f"+{impact.increase_s:.3g}", f"+{impact.increase_pct:.2f} %", impact.cause or "-"]


def _table(title: str) -> Table:
    """An empty table in the style of the links and nodes tables."""
    return Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        collapse_padding=True,
        pad_edge=False,
    )


def sensitivity_tables(report: SensitivityReport) -> Group:
    """Top links, top nodes, what the plan does not depend on, the headroom and the summary."""
    base = report.base.iteration_time_s
    head = Text(
        f"{report.instance}: {report.layout}, iteration {base:.3f} s (analytic); "
        f"bandwidth x{report.factor:g} for one link or node at a time",
        style="bold",
    )
    unit = "GPU pairs" if report.granularity == "gpu" else "node pairs"
    links = _table(f"Links (top {len(report.links)} of {report.num_links} communicating {unit})")
    ends = ("GPU a", "GPU b") if report.granularity == "gpu" else ("node a", "node b")
    for name in (*ends, "GB/s", "traffic", "+s", "+%", "cause"):
        justify = "right" if name[0] == "+" else "left"
        links.add_column(name, justify=justify, no_wrap=name != "traffic")  # type: ignore[arg-type]
    for link in report.links:
        links.add_row(
            *_ends(report, link),
            _bandwidth(link),
            ",".join(link.traffic),
            *_impact_cells(link.impact),
        )
    nodes = _table(f"Nodes (top {len(report.nodes)} of the {report.num_nodes} the plan uses)")
    nodes.add_column("node")
    for part in ("NIC", "NVLink"):
        nodes.add_column(f"{part} +s", justify="right")
        nodes.add_column("+%", justify="right")
        nodes.add_column("cause")
    for node in report.nodes:
        nodes.add_row(node.name, *_impact_cells(node.nic), *_impact_cells(node.nvlink))
    lines = [
        f"not depended on (+0 s): {report.num_links_zero} of {report.num_links} "
        f"communicating {unit}, {report.num_nodes_zero} of {report.num_nodes} nodes"
    ]
    if report.headroom is not None:
        h = report.headroom
        where = (
            f" ({h.bandwidth_bytes_per_s / GB:.2f} GB/s)"
            if h.bandwidth_bytes_per_s is not None
            else ""
        )
        lines.append(f"headroom of {link_label(report, h.link)}: {h.note}{where}")
    notes = [Text(f"note: {note}", style="dim") for note in report.notes]
    rest = [Text(line) for line in lines]
    summary = Text(summary_line(report), style="bold")
    return Group(head, Text(""), links, Text(""), nodes, *rest, *notes, Text(""), summary)


def _impact_json(impact: Impact) -> dict[str, Any]:
    return {**asdict(impact), "cause": impact.cause or None}


def _link_json(report: SensitivityReport, link: LinkSensitivity) -> dict[str, Any]:
    na, nb = link.nodes
    return {
        "label": link_label(report, link),
        "gpus": list(link.gpus) if link.gpus is not None else None,
        "nodes": [report.node_names[na], report.node_names[nb]],
        "bandwidth_gb_per_s": link.bandwidth_bytes_per_s / GB,
        "reverse_bandwidth_gb_per_s": link.reverse_bandwidth_bytes_per_s / GB,
        "traffic": list(link.traffic),
        **_impact_json(link.impact),
    }


def _node_json(node: NodeSensitivity) -> dict[str, Any]:
    return {"node": node.name, "nic": _impact_json(node.nic), "nvlink": _impact_json(node.nvlink)}


def sensitivity_json(report: SensitivityReport) -> dict[str, Any]:
    """The JSON contract of ``pipette-cp explain --json`` (GB = 1e9 bytes, times in s)."""
    h = report.headroom
    return {
        "instance": report.instance,
        "layout": report.layout,
        "factor": report.factor,
        "iteration_time_s": report.base.iteration_time_s,
        "breakdown": dict(report.base.breakdown_s.items()),
        "granularity": report.granularity,
        "links": [_link_json(report, link) for link in report.links],
        "nodes": [_node_json(node) for node in report.nodes],
        "num_links": report.num_links,
        "num_links_matter": report.num_links_matter,
        "num_links_zero": report.num_links_zero,
        "num_nodes": report.num_nodes,
        "num_nodes_zero": report.num_nodes_zero,
        "headroom": None
        if h is None
        else {
            "link": link_label(report, h.link),
            "factor": h.factor,
            "bandwidth_gb_per_s": None
            if h.bandwidth_bytes_per_s is None
            else h.bandwidth_bytes_per_s / GB,
            "overtaken_by": h.overtaken_by or None,
            "note": h.note,
        },
        "notes": list(report.notes),
        "summary": summary_line(report),
    }


def sensitivity_figure(report: SensitivityReport) -> Figure:
    """Two bar charts of the iteration-time increase (%): the top links (labelled with
    the cause that grows) and, per top node, its NIC and its NVLink."""
    links, nodes = report.links, report.nodes
    rows = (max(len(links), 1), max(len(nodes), 1))
    fig = Figure(figsize=(10, 2.2 + 0.3 * sum(rows)))
    top_ax, bottom_ax = fig.subplots(2, 1, gridspec_kw={"height_ratios": rows})
    y = list(range(len(links)))[::-1]
    values = [link.impact.increase_pct for link in links]
    top_ax.barh(y, values, color=_COLORS["link"], height=0.7)
    top_ax.set_yticks(y, [link_label(report, link) for link in links], fontsize=7)
    every = [*values, *(i.increase_pct for n in nodes for i in (n.nic, n.nvlink))]
    span = max(every, default=0.0) or 1.0
    for row, link in zip(y, links, strict=True):
        label = f"+{link.impact.increase_pct:.2f} % {link.impact.cause}".rstrip()
        top_ax.text(link.impact.increase_pct + span * 0.01, row, label, va="center", fontsize=7)
    top_ax.set_xlim(0, span * 1.25)
    unit = "GPU pairs" if report.granularity == "gpu" else "node pairs"
    top_ax.set_title(
        f"{report.instance}: {report.layout} ({report.base.iteration_time_s:.3f} s); "
        f"top {len(links)} of {report.num_links} {unit}",
        fontsize=9,
    )
    y = list(range(len(nodes)))[::-1]
    for offset, part in ((0.18, "NIC"), (-0.18, "NVLink")):
        impacts = [node.nic if part == "NIC" else node.nvlink for node in nodes]
        bottom_ax.barh(
            [r + offset for r in y], [i.increase_pct for i in impacts], height=0.36,
            color=_COLORS[part], label=part,
        )  # fmt: skip
    bottom_ax.set_yticks(y, [node.name for node in nodes], fontsize=7)
    bottom_ax.set_xlim(0, span * 1.25)
    bottom_ax.legend(loc="lower right", fontsize=7)
    bottom_ax.set_title(f"top {len(nodes)} of the {report.num_nodes} nodes used", fontsize=9)
    bottom_ax.set_xlabel(f"iteration-time increase (%) with the bandwidth x{report.factor:g}")
    fig.tight_layout()
    return fig
