"""The environment Megatron-LM's ranks need (``CUDA_DEVICE_MAX_CONNECTIONS``), and the
facts of a plan and a cluster it depends on (Megatron FSDP, GPUs before Blackwell).

Re-exported by :mod:`pipette_cp.report.megatron.flags`.
"""

from __future__ import annotations

from pipette_cp.specs import Instance, Plan


def uses_fsdp(plan: Plan) -> bool:
    """Whether the plan runs Megatron FSDP (``--use-megatron-fsdp``)."""
    return plan.sharding in ("optim_grads", "optim_grads_params")


def before_blackwell(instance: Instance) -> bool:
    """Whether some node's GPU predates Blackwell: CUDA compute capability < 10, from its
    ``architecture``; an AMD or unknown architecture (no compute capability) counts as
    older (the safe side of the rule below)."""
    cluster = instance.cluster
    gpus = [cluster.gpu_of_node(n) for n in range(cluster.num_nodes)]
    return any((gpu.compute_capability or (0, 0)) < (10, 0) for gpu in gpus)


def megatron_environment(instance: Instance, plan: Plan) -> dict[str, str | None]:
    """Environment variables the launcher must set (None: must unset).

    Megatron's ``validate_args`` asserts ``CUDA_DEVICE_MAX_CONNECTIONS=1`` when tensor
    (or context) parallelism > 1 runs on GPUs before Blackwell, so that one CUDA
    stream orders the TP communication before the GEMMs it overlaps; with Megatron
    FSDP it must instead be unset or > 1.  Otherwise nothing is required.

    >>> from pipette_cp.io.instance_file import load_instance
    >>> from pipette_cp.specs.layouts import make_plan
    >>> inst = load_instance("gpt3-1.3b-nominal-8")
    >>> megatron_environment(inst, make_plan(num_layers=24, dp=4, pp=1, tp=2, micro_batch_size=1))
    {'CUDA_DEVICE_MAX_CONNECTIONS': '1'}
    >>> megatron_environment(inst, make_plan(num_layers=24, dp=8, pp=1, tp=1, micro_batch_size=1))
    {}
    """
    if uses_fsdp(plan):
        return {"CUDA_DEVICE_MAX_CONNECTIONS": None}
    if (plan.tp > 1 or plan.cp > 1) and before_blackwell(instance):
        return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    return {}
