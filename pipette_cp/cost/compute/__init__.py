"""Compute time on one GPU: GEMMs, a layer's work, a model chunk per micro-batch, the first and last stage's extras."""
