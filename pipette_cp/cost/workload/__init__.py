"""What the model computes and holds, whatever runs it: FLOPs, parameter counts, token volumes, attention variants."""
