"""Cluster construction (expansion, generators) and bandwidth statistics."""
