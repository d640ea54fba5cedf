"""The layout search: enumerate, prune with bounds, solve, re-rank."""

from pipette_cp.search.loop import SearchResult, SearchStats, search
from pipette_cp.search.options import SearchOptions
from pipette_cp.search.space import enumerate_layouts

__all__ = ["SearchOptions", "SearchResult", "SearchStats", "enumerate_layouts", "search"]
