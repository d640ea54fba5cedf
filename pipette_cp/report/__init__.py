"""Formatting of specs, statistics and plans as rich renderables (never printed here)."""
