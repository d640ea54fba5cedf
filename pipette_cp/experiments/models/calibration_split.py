"""A deterministic fit / held-out split of the published-run rows.

Every row of the three CSVs in ``instances/calibration/`` gets a side,
:data:`FIT` or :data:`HELD_OUT`, by :func:`assign_split`:

- ``published_runs_calibration.csv`` is all :data:`FIT`: the constants in
  :mod:`pipette_cp.cost.stack.calibration` were already fitted on those rows.
- The rows of ``published_runs_more.csv`` and ``published_runs_moe_cp.csv`` are
  grouped into *sweeps* (:func:`sweep_key`): one Hagemann et al. run sheet and
  attention kernel, one BigScience date, one llm-foundry model on one GPU type,
  one DGX Cloud / NeMo / torchtitan / Megatron-MoE model.  A sweep stays whole
  on one side, so that within-sweep comparisons (how throughput moves with one
  knob) can be measured on held-out rows.
- Within each source family (:func:`family`) the sweeps are ordered by a
  SHA-256 of their key and taken in that order into the held-out side while it
  stays within :data:`HELD_OUT_MAX` of the family's rows (the first sweep that
  fits always goes in, and one sweep always stays on the fit side): about 30 %
  held out, every family with rows on both sides.  A family with a single sweep
  is split row by row on the hash of the row's identifying columns instead.

``modern_runs.csv`` is split by :func:`assign_modern_split` with the same rules: the
family is the source (MLPerf logs, Megatron-Bridge tables) x GPU generation (Hopper,
B200/B300, GB200/GB300), the sweep is source x model x GPU type.

The split depends only on the rows' contents (not on their order or on Python's
hash seed), so it is the same on every machine and every run.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict

FIT = "fit"
HELD_OUT = "held-out"

#: Target share of held-out rows per family, and the most a family may hold out.
HELD_OUT_TARGET = 0.30
HELD_OUT_MAX = 0.40

#: Columns that identify a run (with the source and notes).
IDENTITY = (
    "source",
    "model_name",
    "gpu_type",
    "num_gpus",
    "seq_len",
    "global_batch_size",
    "micro_batch_size",
    "tp",
    "pp",
    "dp",
    "virtual_pp",
    "sequence_parallel",
    "recompute",
    "notes",
)


def family(row: dict[str, str]) -> str:
    """The source family of a row (one name per publication or benchmark suite)."""
    source, notes = row["source"], row.get("notes", "")
    if source.startswith("Hagemann"):
        return "hagemann"
    if "bigscience" in source:
        return "bloom"
    if "llm-foundry" in source:
        return "mpt"
    if "dgxc-benchmarking" in source:
        return "dgxc-moe" if "kind=moe" in notes else "dgxc"
    if "NeMo" in source or "nemo" in source.lower().split()[0]:
        return "nemo"
    if "torchtitan" in source:
        return "torchtitan"
    if "MoE-ModelZoo" in source or "Megatron-MoE" in source:
        return "megatron-moe"
    if source.startswith("Narayanan"):
        return "sc21"
    if "GPT-3 Example" in source:
        return "gpt3"
    return "mcore"


def sweep_key(row: dict[str, str]) -> str:
    """The sweep a row belongs to (kept whole on one side of the split)."""
    fam, notes = family(row), row.get("notes", "")
    if fam == "hagemann":
        kernel = re.search(r"kernel=([^;]*)", notes)
        sheet = row["source"].rsplit("/", 1)[-1]
        return f"{fam}|{sheet}|{kernel.group(1).strip() if kernel else ''}"
    if fam == "bloom":
        date = re.search(r"date (\d\d-\d\d)", notes)
        return f"{fam}|{date.group(1) if date else row['model_name']}"
    if fam == "mpt":
        return f"{fam}|{row['model_name']}|{row['gpu_type']}"
    base = re.sub(r"\s*\(reduced-depth proxy.*\)", "", row["model_name"])
    return f"{fam}|{base}"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def row_key(row: dict[str, str]) -> str:
    """A stable identity of a row (its identifying columns joined)."""
    return "|".join(row.get(column, "") for column in IDENTITY)


def assign_split(rows: list[dict[str, str]], *, calibration: bool = False) -> list[str]:
    """:data:`FIT` or :data:`HELD_OUT` for every row, in order (see module notes).

    ``calibration=True`` marks rows of ``published_runs_calibration.csv`` (all fit).
    """
    if calibration:
        return [FIT] * len(rows)
    return _split_sweeps(
        [family(r) for r in rows], [sweep_key(r) for r in rows], [row_key(r) for r in rows]
    )


def _split_sweeps(families: list[str], sweeps_of: list[str], keys: list[str]) -> list[str]:
    """The sides of rows given each row's family, sweep and identity (module notes)."""
    sweeps: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for i, (fam, sweep) in enumerate(zip(families, sweeps_of, strict=True)):
        sweeps[fam][sweep].append(i)
    sides = [FIT] * len(keys)
    for groups in sweeps.values():
        total = sum(len(g) for g in groups.values())
        if len(groups) == 1:
            (indices,) = groups.values()
            ranked = sorted(indices, key=lambda i: _digest(keys[i]))
            take = max(1, round(HELD_OUT_TARGET * total)) if total > 1 else 0
            for i in ranked[:take]:
                sides[i] = HELD_OUT
            continue
        held = 0
        ordered = sorted(groups, key=_digest)
        for key in ordered[:-1]:
            size = len(groups[key])
            if held >= HELD_OUT_TARGET * total:
                break
            if held + size <= HELD_OUT_MAX * total:
                held += size
                for i in groups[key]:
                    sides[i] = HELD_OUT
        if held == 0:  # every sweep too large: hold out the smallest
            smallest = min(ordered, key=lambda k: (len(groups[k]), _digest(k)))
            for i in groups[smallest]:
                sides[i] = HELD_OUT
    return sides


# ------------------------------------------------------------- modern_runs.csv
#: Columns that identify a row of ``modern_runs.csv``.
MODERN_IDENTITY = (
    "row_id", "source_repo", "round", "model_name", "gpu_type", "num_gpus", "tp", "pp", "cp",
    "vp", "ep", "micro_batch", "global_batch", "precision", "fp8_recipe", "fp4_recipe",
)  # fmt: skip


def modern_source(row: dict[str, str]) -> str:
    """``mlperf`` (MLPerf Training result logs) or ``bridge`` (Megatron-Bridge tables)."""
    return "bridge" if "Megatron-Bridge" in row["source_repo"] else "mlperf"


def modern_model(row: dict[str, str]) -> str:
    """The row's model, lower case, letters and digits only, without a parenthesised
    qualifier (``Qwen3_30B_a3B (tokendrop)`` and ``Qwen3_30B_a3B`` are one model)."""
    base = re.sub(r"\s*\(.*\)\s*$", "", row["model_name"])
    return re.sub(r"[^a-z0-9]", "", base.lower())


def modern_family(row: dict[str, str]) -> str:
    """Source x GPU generation (``mlperf|H``, ``bridge|GB``, ...): the unit of the split."""
    gpu = row["gpu_type"]
    generation = "GB" if gpu.startswith("GB") else "B" if gpu.startswith("B") else "H"
    return f"{modern_source(row)}|{generation}"


def modern_sweep_key(row: dict[str, str]) -> str:
    """Source x model x GPU type: every release's and layout's runs of one model on one
    GPU stay on one side (duplicates of a run fall with it)."""
    return f"{modern_source(row)}|{modern_model(row)}|{row['gpu_type']}"


def assign_modern_split(rows: list[dict[str, str]]) -> list[str]:
    """:data:`FIT` or :data:`HELD_OUT` for every row of ``modern_runs.csv``: the rules of
    :func:`assign_split` with :func:`modern_family` as the family and
    :func:`modern_sweep_key` as the sweep."""
    keys = ["|".join(r.get(c, "") for c in MODERN_IDENTITY) for r in rows]
    return _split_sweeps(
        [modern_family(r) for r in rows], [modern_sweep_key(r) for r in rows], keys
    )
