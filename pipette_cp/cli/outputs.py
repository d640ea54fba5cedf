"""What ``solve`` writes, and how: checked before the work, written only after it.

``solve -o plan.json`` checks the output path before the search starts (its folder
exists and takes files), writes nothing until a plan exists, and then writes the
instance it solved (``plan.instance.yaml``, when the command line replaced a part
of the bundled instance) and the plan atomically: each to a temporary file in the
same folder, renamed into place (``os.replace``), the instance first, so a plan
on disk always has its instance next to it.  References to the user's files are
relative to the folder of the file that holds them, so the pair can be moved.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from pipette_cp.errors import SpecError
from pipette_cp.io.cluster_file import cluster_to_mapping, yaml_text
from pipette_cp.io.output_paths import check_output_file
from pipette_cp.search.executors.ray_actors import check_address, import_ray
from pipette_cp.search.executors.runners import EXECUTORS
from pipette_cp.search.executors.workers import check_jobs, default_jobs
from pipette_cp.specs import Instance

#: Seconds kept at the end of ``--time-limit`` for printing and writing the result.
OUTPUT_RESERVE_S = 0.3
#: Largest ``--seed``: the solvers take a 32-bit signed seed.
MAX_SEED = 2**31 - 1
#: Largest ``--time-limit``, s (a week: anything longer is a typo).
MAX_TIME_LIMIT_S = 7 * 24 * 3600.0


def check_output(out: Path | None) -> None:
    """Refuse an output path that cannot be written, before any work is done."""
    check_output_file(out, "--out")


def check_run_options(top: int, time_limit: float | None, seed: int) -> None:
    """``--top``, ``--time-limit`` and ``--seed``: one line naming the bad one."""
    if top < 1:
        raise SpecError("--top", top, "must be at least 1")
    if time_limit is not None and not (0 < time_limit <= MAX_TIME_LIMIT_S):
        raise SpecError(
            "--time-limit", time_limit, f"must be a number of seconds in (0, {MAX_TIME_LIMIT_S:g}]"
        )
    if not 0 <= seed <= MAX_SEED:
        raise SpecError("--seed", seed, f"must be in 0..{MAX_SEED}")


def check_workers(
    jobs: int | None, executor: str, ray_address: str | None, snapshots: bool
) -> dict[str, Any]:
    """``--jobs`` (default: the machine's cores), ``--executor`` and ``--ray-address``
    checked before any work, as keyword arguments of the search."""
    if executor not in EXECUTORS:
        raise SpecError("--executor", executor, f"expected one of {', '.join(EXECUTORS)}")
    if jobs is not None:
        check_jobs(jobs, executor, "--jobs")
    if snapshots and (jobs not in (None, 1) or executor != "local"):
        raise SpecError("--jobs", jobs, "the search over --snapshots runs in one process")
    if ray_address is not None and executor != "ray":
        raise SpecError("--ray-address", ray_address, "applies to --executor ray only")
    if executor == "ray":
        import_ray()
        if ray_address is not None:
            check_address(ray_address, "--ray-address")
    if snapshots:
        return {}
    return {"jobs": default_jobs() if jobs is None else jobs, "executor": executor,
            "ray_address": ray_address}  # fmt: skip


def search_budget(time_limit: float, started_at: float) -> float:
    """What is left of the command's ``time_limit`` for the search: the limit less the
    time already spent (imports, loading) and :data:`OUTPUT_RESERVE_S`, at least 10 %
    of it."""
    left = time_limit - (time.perf_counter() - started_at) - OUTPUT_RESERVE_S
    return max(left, 0.1 * time_limit)


def outside_folder(instance: str, folder: Path) -> bool:
    """Whether ``instance`` is an instance file (not a bundled name) outside ``folder``."""
    if not instance.endswith((".yaml", ".yml")) and "/" not in instance:
        return False
    return not Path(instance).resolve().is_relative_to(folder.resolve())


def instance_path(out: Path) -> Path:
    """Where the instance of a plan written to ``out`` goes."""
    return out.with_name(out.stem + ".instance.yaml")


def instance_text(inst: Instance, at: Path, cluster: Path | None, profile: Path | None) -> str:
    """The instance file for ``inst`` written at ``at``: its parts inline, or the user's
    cluster and profile files referred to relative to ``at``'s folder."""
    base = at.parent.resolve()

    def relative(path: Path) -> str:
        return os.path.relpath(path.resolve(), base)

    data = {
        "name": inst.name,
        "model": inst.model.model_dump(mode="json"),
        "cluster": {"file": relative(cluster)} if cluster else None,
        "training": inst.training.model_dump(mode="json"),
        "search_space": inst.search_space.model_dump(mode="json"),
        "profile": relative(profile) if profile else None,
    }
    if cluster is None:
        data["cluster"] = cluster_to_mapping(inst.cluster, decimals=None)
    document = {k: v for k, v in data.items() if v is not None}
    return yaml_text(document)


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file renamed into place, with the
    permissions a plain write would give it (0666 less the umask; ``mkstemp`` makes 0600)."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    mask = os.umask(0)
    os.umask(mask)
    try:
        os.fchmod(handle, 0o666 & ~mask)
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
