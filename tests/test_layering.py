"""No import cycle anywhere in the package (the layer contracts in pyproject.toml
order the layers; this catches circles inside a layer too).  Imports under
``TYPE_CHECKING`` count too: a module that names another's type for the checker
depends on it as much as one that calls it."""

from __future__ import annotations

import grimp
import networkx as nx


def test_no_import_cycle() -> None:
    graph = grimp.build_graph("pipette_cp", exclude_type_checking_imports=False)
    imports = nx.DiGraph()
    for module in graph.modules:
        imports.add_node(module)
        for imported in graph.find_modules_directly_imported_by(module):
            imports.add_edge(module, imported)
    cycles = [sorted(c) for c in nx.strongly_connected_components(imports) if len(c) > 1]
    assert cycles == []
