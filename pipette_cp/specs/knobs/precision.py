"""The precision knobs of Megatron-Core's mixed precision: FP8 primary weights and bf16
main gradients."""

from __future__ import annotations

from pipette_cp.specs.knobs.base import Job, switch
from pipette_cp.specs.knobs.recompute import MEGATRON_CORE
from pipette_cp.specs.training import Sharding


def megatron_refusal(job: Job, flag: str) -> str | None:
    """Why Megatron's ``flag`` is not modelled for the job's framework and precision (None:
    it is): Megatron-Core's frameworks, bf16 weights (precision bf16 or fp8)."""
    t = job.training
    if t.framework.name not in MEGATRON_CORE:
        known = ", ".join(MEGATRON_CORE)
        return f"is Megatron-Core's {flag} (framework {known}), not {t.framework.name}"
    if t.precision == "fp16":
        return f"{flag} needs bf16 weights (precision bf16 or fp8), precision is fp16"
    return None


# ------------------------------------------------------------ FP8 primary weights
def _fp8_params_refusal(job: Job, sharding: Sharding) -> str | None:
    """Why FP8 primary weights cannot run (None: they can): FP8 training (Transformer
    Engine keeps the weights as FP8 tensors), Megatron-Core's distributed optimizer
    (Megatron's ``validate_args`` also allows Megatron-FSDP and FSDP2, whose FP8 weights
    are not modelled)."""
    if why := megatron_refusal(job, "--fp8-param-gather"):
        return why
    if job.training.precision != "fp8":
        return f"needs FP8 training (precision fp8), precision is {job.training.precision}"
    if sharding != "optim":
        return f"needs the distributed optimizer (dp_sharding optim), dp_sharding is {sharding}"
    return None


#: Priced by :func:`pipette_cp.cost.memory.state.stage_fp8_weight_bytes` (the FP8 copies
#: are the weights: no bf16 copy), :func:`pipette_cp.cost.network.data_parallel.
#: param_wire_bytes` (the parameter all-gather in FP8, read by the evaluator and the
#: placement masters) and :func:`pipette_cp.cost.stack.frameworks.optimizer_state_bytes`
#: (no 16-bit remainders of FP8 weights).
FP8_PARAM_GATHER = switch(
    "fp8_param_gather",
    refusal=_fp8_params_refusal,
    megatron=[("--fp8-param-gather", None)],
    label="fp8param",
    solve_flag=(
        "--fp8-param-gather",
        "FP8 primary weights (gathered in FP8) off / on to try: false, true or false,true "
        "(with FP8 training and the distributed optimizer) [default: false].",
    ),
    predict_flag=(
        "fp8_param_gather",
        "--fp8-param-gather/--no-fp8-param-gather",
        "FP8 primary weights, gathered in FP8 (Megatron --fp8-param-gather; needs "
        "precision fp8 and --dist-opt).",
    ),
)


#: Priced by :func:`pipette_cp.cost.stack.frameworks.gradient_bytes` (the gradient buffer,
#: the data-parallel collectives' bytes, the optimizer step's reads), which every part of
#: the cost model and the placement masters read.
GRAD_REDUCE_IN_BF16 = switch(
    "grad_reduce_in_bf16",
    refusal=lambda job, sharding: megatron_refusal(job, "--grad-reduce-in-bf16"),
    megatron=[("--grad-reduce-in-bf16", None)],
    label="bf16grad",
    solve_flag=(
        "--grad-reduce-in-bf16",
        "Main gradients kept and reduced in bf16 off / on to try: false, true or "
        "false,true [default: false].",
    ),
    predict_flag=(
        "grad_reduce_in_bf16",
        "--grad-reduce-in-bf16/--no-grad-reduce-in-bf16",
        "Main gradients kept and reduced in bf16 (Megatron --grad-reduce-in-bf16).",
    ),
)

KNOBS = (FP8_PARAM_GATHER, GRAD_REDUCE_IN_BF16)
