"""Experiments on the cost models: accuracy against published runs, calibration, agreement, generator statistics."""
