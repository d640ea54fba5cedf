"""Measured bandwidth: nccl-tests and mpiGraph logs, fabric import, and the scripts that measure a cluster."""
