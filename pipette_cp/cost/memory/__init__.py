"""Memory per GPU: weights, gradients and optimizer state, activations, recomputation, the usable limit."""
