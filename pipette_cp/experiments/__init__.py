"""Benchmarks of the cost models against published measurements (may import anything)."""
