"""Seeded synthetic clusters: the dense generators G1-G7 and the fat-tree fabrics of any size,
registered by name in :mod:`~pipette_cp.clusters.generators.registry`."""
