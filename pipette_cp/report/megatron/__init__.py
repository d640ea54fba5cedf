"""Megatron-LM exports: the flags that realise a plan, their check against Megatron's argument table."""
