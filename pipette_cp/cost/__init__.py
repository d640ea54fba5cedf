"""Cost models: memory, compute, communication, iteration time, simulator."""
