"""``pipette-cp profile``: time one transformer layer with PyTorch, write a LayerProfile.

The profile feeds ``predict --profile`` and ``solve --profile``.  It measures the
compute of one tensor-parallel rank on one device; the cost model adds the TP
collectives (the file says ``includes_tp_comm: false``).  PyTorch is imported
only when the command runs.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, cast

import typer

from pipette_cp.cli.console import err_console
from pipette_cp.errors import InputFileError, SpecError
from pipette_cp.io.model_file import load_model
from pipette_cp.io.output_paths import check_output_file
from pipette_cp.profiler import require_torch
from pipette_cp.specs.profile import LayerProfileEntry
from pipette_cp.specs.training import Recompute

_RECOMPUTE = ("none", "selective", "full")


class DeviceChoice(StrEnum):
    cuda = "cuda"
    cpu = "cpu"


class DtypeChoice(StrEnum):
    bf16 = "bf16"
    fp32 = "fp32"


def _ints(option: str, text: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> ``(1, 2, 4)``, or a one-line error naming the option."""
    try:
        values = tuple(int(x) for x in text.replace(" ", "").split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise SpecError(option, text, "expected comma-separated positive integers, e.g. 1,2,4,8")
    return values


def _recompute(text: str) -> tuple[Recompute, ...]:
    values = tuple(x for x in text.replace(" ", "").split(",") if x)
    if not values or any(v not in _RECOMPUTE for v in values):
        raise SpecError("--recompute", text, f"expected a comma-separated subset of {_RECOMPUTE}")
    return cast(tuple[Recompute, ...], tuple(dict.fromkeys(values)))


def _progress(entry: LayerProfileEntry) -> None:
    peak = entry.peak_memory_bytes
    memory = f", peak {peak / 2**20:.0f} MiB" if peak is not None else ""
    err_console.print(
        f"tp={entry.tp} mb={entry.micro_batch_size} recompute={entry.recompute} "
        f"flash={entry.flash_attention}: forward {entry.forward_s * 1e3:.3f} ms, "
        f"backward {entry.backward_s * 1e3:.3f} ms{memory}",
        highlight=False,
        markup=False,
    )


def profile(
    model: Annotated[
        str, typer.Argument(help="Bundled model name, model YAML, or HF config.json.")
    ],
    seq: Annotated[int, typer.Option("--seq", "--seq-length", help="Sequence length (tokens).")],
    tp: Annotated[str, typer.Option("--tp", help="Tensor-parallel sizes, e.g. 1,2,4,8.")] = "1",
    mb: Annotated[str, typer.Option("--mb", help="Micro-batch sizes, e.g. 1,2,4.")] = "1",
    device: Annotated[
        DeviceChoice | None,
        typer.Option(help="Where to run (default: cuda when available, else cpu)."),
    ] = None,
    dtype: Annotated[DtypeChoice, typer.Option(help="Parameter and activation type.")] = (
        DtypeChoice.bf16
    ),
    recompute: Annotated[
        str, typer.Option(help="Recomputation settings, comma-separated: none,selective,full.")
    ] = "none",
    flash: Annotated[
        bool,
        typer.Option("--flash/--no-flash", help="SDPA's default kernels, or the math path only."),
    ] = True,
    dropout: Annotated[float, typer.Option(help="Dropout probability (attention, hidden).")] = 0.0,
    warmup: Annotated[int, typer.Option(help="Untimed passes first.")] = 3,
    reps: Annotated[int, typer.Option(help="Timed passes; the medians are written.")] = 10,
    seed: Annotated[int, typer.Option(help="Seed of the weights and inputs.")] = 0,
    threads: Annotated[
        int | None, typer.Option(help="CPU threads for torch (default: torch's choice).")
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Profile JSON to write (default: stdout).")
    ] = None,
) -> None:
    """Time one transformer layer (one tp rank's shard) and write a layer profile.

    The times are compute only: the cost model adds the tensor-parallel
    communication (``includes_tp_comm: false`` in the file).
    """
    spec = load_model(model)
    tps, mbs, recomputes = _ints("--tp", tp), _ints("--mb", mb), _recompute(recompute)
    check_output_file(out, "--out")  # fail before minutes of measuring
    require_torch()
    import torch

    from pipette_cp.profiler.run import ProfileRequest, profile_layer

    cuda = device is DeviceChoice.cuda or (device is None and torch.cuda.is_available())
    request = ProfileRequest(
        model=spec, seq_length=seq, tp=tps, micro_batch_size=mbs, recompute=recomputes,
        flash_attention=(flash,), device="cuda" if cuda else "cpu",
        dtype="bf16" if dtype is DtypeChoice.bf16 else "fp32",
        warmup=warmup, reps=reps, dropout=dropout, seed=seed, threads=threads,
    )  # fmt: skip
    result = profile_layer(request, on_entry=_progress)
    for note in result.notes:
        err_console.print(f"note: {note}", highlight=False, markup=False)
    text = result.profile.model_dump_json(indent=1, exclude_none=True) + "\n"
    if out is None:
        typer.echo(text, nl=False)
        return
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputFileError(out, f"cannot write: {exc.strerror or exc}") from None
    err_console.print(
        f"{len(result.profile.entries)} entries on {result.profile.gpu} written to {out} "
        "(compute only: predict/solve --profile add the TP communication)",
        highlight=False,
        markup=False,
    )
