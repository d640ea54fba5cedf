"""Measured per-layer forward/backward times that replace the analytic estimate.

A user with a GPU times one transformer layer (forward, and backward including
any recomputation and tensor-parallel communication) for the (tp,
micro-batch) pairs they care about and writes a JSON file::

    {
      "description": "llama-2-7b layer, 8 x H100 SXM, Megatron-Core 0.8",
      "gpu": "H100-SXM5-80GB",
      "seq_length": 4096,
      "entries": [
        {"tp": 1, "micro_batch_size": 1, "forward_s": 0.0031, "backward_s": 0.0064},
        {"tp": 2, "micro_batch_size": 1, "recompute": "selective",
         "flash_attention": true, "forward_s": 0.0017, "backward_s": 0.0036}
      ]
    }

``recompute`` and ``flash_attention`` are optional: an entry without them
matches any plan with its (tp, micro-batch); one with them matches only plans
with the same settings and is preferred.

``includes_tp_comm`` (default true) says whether the times contain the
tensor-parallel all-reduces.  ``pipette-cp profile`` times one tp rank's shard
on one device, without any collective, and writes ``false``: the cost model
then adds its own analytic TP communication to the measured compute.
``peak_memory_bytes`` and ``repetitions`` are informative.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pipette_cp.errors import SpecError
from pipette_cp.specs._base import FrozenSpec
from pipette_cp.specs.plan import Plan
from pipette_cp.specs.training import Recompute, TrainingSpec


class LayerProfileEntry(FrozenSpec):
    """Measured times of one transformer layer for one micro-batch on one GPU."""

    tp: int = Field(gt=0, description="Tensor-parallel size it was measured with.")
    micro_batch_size: int = Field(gt=0, description="Sequences per micro-batch.")
    recompute: Recompute | None = Field(
        default=None, description="Recomputation it was measured with; None matches any."
    )
    flash_attention: bool | None = Field(
        default=None, description="FlashAttention on/off when measured; None matches any."
    )
    forward_s: float = Field(gt=0, description="Forward time of one layer, s.")
    backward_s: float = Field(
        gt=0,
        description="Backward time of one layer incl. recomputation (and TP comm when the "
        "profile's includes_tp_comm is true), s.",
    )
    peak_memory_bytes: int | None = Field(
        default=None,
        ge=0,
        description="Peak device memory allocated during one forward + backward of the layer "
        "(its parameters, gradients, input and activations), bytes; None = not measured.",
    )
    repetitions: int | None = Field(
        default=None, gt=0, description="Timed repetitions the medians are taken over."
    )


class LayerProfile(FrozenSpec):
    """A set of measured per-layer times, keyed by (tp, micro-batch[, recompute, flash])."""

    description: str = Field(default="", description="What was measured, where, how.")
    gpu: str = Field(
        default="",
        description="Device measured on (torch.cuda.get_device_name(), or 'cpu'); an instance "
        "whose GPU family differs refuses the profile.",
    )
    model: str = Field(
        default="",
        description="Name of the model measured (ModelSpec.name); an instance with another "
        "model refuses the profile.  Empty: not recorded (not checked).",
    )
    device: Literal["", "cuda", "cpu"] = Field(
        default="",
        description="'cuda' or 'cpu' (a CPU profile does not stand for GPU times: refused on a "
        "GPU cluster); empty: not recorded.",
    )
    seq_length: int | None = Field(
        default=None, gt=0, description="Sequence length measured with; None = not checked."
    )
    includes_tp_comm: bool = Field(
        default=True,
        description="Whether the times contain the tensor-parallel communication; when false "
        "the cost model adds its analytic TP collective time (single-device measurements).",
    )
    entries: tuple[LayerProfileEntry, ...] = Field(min_length=1, description="The measurements.")

    def keys(self) -> list[tuple[int, int]]:
        """The (tp, micro_batch_size) pairs measured, sorted."""
        return sorted({(e.tp, e.micro_batch_size) for e in self.entries})

    def lookup(self, plan: Plan, training: TrainingSpec) -> LayerProfileEntry:
        """The entry for ``plan``: same (tp, micro-batch), best matching knobs.

        >>> from pipette_cp.specs.layouts import make_plan
        >>> prof = LayerProfile(entries=[{"tp": 2, "micro_batch_size": 1,
        ...                               "forward_s": 1e-3, "backward_s": 2e-3}])
        >>> tr = TrainingSpec(global_batch_size=8, seq_length=2048)
        >>> prof.lookup(make_plan(num_layers=2, dp=1, pp=1, tp=2, micro_batch_size=1), tr).forward_s
        0.001
        """
        if self.seq_length is not None and self.seq_length != training.seq_length:
            raise SpecError(
                "profile.seq_length",
                self.seq_length,
                f"the profile was measured at this length, the job uses "
                f"seq_length={training.seq_length}",
            )
        flash = plan.flash_attention and training.flash_attention_available
        candidates = [
            e
            for e in self.entries
            if e.tp == plan.tp
            and e.micro_batch_size == plan.micro_batch_size
            and e.recompute in (None, plan.recompute)
            and e.flash_attention in (None, flash)
        ]
        if not candidates:
            raise SpecError(
                "profile",
                (plan.tp, plan.micro_batch_size),
                f"no measured layer time for tp={plan.tp}, micro_batch_size="
                f"{plan.micro_batch_size}, recompute={plan.recompute!r}, flash_attention={flash}; "
                f"measured (tp, micro_batch_size): {self.keys()}",
            )
        # Prefer the entry that pins the most knobs to the plan's values.
        return max(
            candidates, key=lambda e: (e.recompute is not None) + (e.flash_attention is not None)
        )
