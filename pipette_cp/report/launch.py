"""Launch files that make Megatron's default rank grouping realise a plan's placement.

Megatron builds its groups from the global rank in ``tp-cp-dp-pp`` order
(``RankGenerator`` in ``megatron/core/parallel_state.py``; expert groups re-split a
stage's ranks): rank ``r = t + tp * (u + dp * cp * s)`` is tensor rank ``t`` of replica
``u = d * cp + c`` (DP rank ``d``, CP rank ``c``) of stage ``s``.  The plan says which
GPU holds unit ``(s, u)``, so rank ``r`` must run on ``placement[s * dp * cp + u][t]``.
:func:`write_launch_files` writes:

* ``rank_map.csv``: rank, host, GPU, stage, DP rank, (CP rank when cp > 1,) TP rank;
* ``rank_wrapper.sh``: what every launcher starts once per rank.  It takes the rank
  from the launcher (``SLURM_PROCID``, ``OMPI_COMM_WORLD_RANK`` or torchrun's
  ``RANK``), checks that it runs on the host the plan gives it, exports ``RANK``,
  ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` and ``LOCAL_RANK`` = the plan's GPU
  index on the node (Megatron's ``_initialize_distributed`` in
  ``megatron/training/initialize.py`` calls ``torch.cuda.set_device(args.local_rank)``
  and ``parse_args`` reads ``LOCAL_RANK``; every GPU of the node stays visible, as
  NCCL's peer-to-peer and IPC paths want), sets or unsets
  ``CUDA_DEVICE_MAX_CONNECTIONS`` as
  :func:`~pipette_cp.report.megatron.flags.megatron_environment` requires, and runs
  ``pretrain_gpt.py`` (a hybrid Mamba model: ``pretrain_hybrid.py``,
  :func:`~pipette_cp.report.megatron.hybrid_flags.train_script`) with the Megatron
  arguments (a bash array, every token quoted);
* ``slurm_hostfile`` + ``launch_slurm.sh``: one host per rank for ``srun
  --distribution=arbitrary`` (Slurm reads ``SLURM_HOSTFILE``);
* ``rankfile`` + ``launch_mpirun.sh``: the same host list for Open MPI's sequential
  mapper (``mpirun --hostfile rankfile --map-by seq``: line R's host runs rank R;
  no ``slot=``, which in an Open MPI rankfile names CPUs, not GPUs);
* ``launch_torchrun.sh`` + ``torchrun.txt``: one static-rendezvous torchrun per node,
  possible only when every node's ranks are consecutive (torchrun gives node k ranks
  ``k * nproc .. (k + 1) * nproc - 1``); otherwise both say so.

Host names reach these files and scripts, so each must be an RFC 1123 name
(:func:`pipette_cp.io.hostfile.is_host_name`).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipette_cp.io.hostfile import check_host_name
from pipette_cp.report.megatron import flags as megatron
from pipette_cp.report.megatron.hybrid_flags import train_script
from pipette_cp.specs import Instance, Plan

#: The port rank 0 listens on unless MASTER_PORT is set.
MASTER_PORT = 6000
_PLACEHOLDER = re.compile(r"@[A-Z_]+@")
#: The scripts :func:`write_launch_files` marks executable.
SCRIPTS = ("rank_wrapper.sh", "launch_slurm.sh", "launch_mpirun.sh", "launch_torchrun.sh")


@dataclass(frozen=True)
class RankSlot:
    """Where one Megatron rank runs and what it is."""

    rank: int
    host: str
    local_gpu: int
    stage: int
    replica: int
    tp_rank: int
    dp_rank: int = 0
    cp_rank: int = 0


def rank_map(instance: Instance, plan: Plan) -> list[RankSlot]:
    """Rank -> (host, local GPU) in Megatron's tp-cp-dp-pp rank order: rank
    ``t + tp * (replica + replicas * stage)`` with ``replica = dp_rank * cp + cp_rank``."""
    cluster = instance.cluster
    out = []
    for stage in range(plan.pp):
        for replica in range(plan.replicas):
            for t, gpu in enumerate(plan.unit_gpus(stage, replica)):
                rank = t + plan.tp * (replica + plan.replicas * stage)
                host, local = cluster.node_names[cluster.node_of(gpu)], gpu % cluster.gpus_per_node
                dp_rank, cp_rank = divmod(replica, plan.cp)
                out.append(RankSlot(rank, host, local, stage, replica, t, dp_rank, cp_rank))
    return sorted(out, key=lambda r: r.rank)


def torchrun_layout(slots: list[RankSlot]) -> list[tuple[str, list[int]]] | None:
    """Node order and each node's GPUs (in local-rank order) for torchrun, or None when
    the ranks of some node are not consecutive (torchrun gives node k ranks
    ``k * nproc .. (k + 1) * nproc - 1``)."""
    if not slots:
        return []
    per_node: dict[str, list[int]] = {}
    for slot in slots:
        per_node.setdefault(slot.host, []).append(slot.local_gpu)
    sizes = {len(g) for g in per_node.values()}
    if len(sizes) != 1:
        return None
    nproc = sizes.pop()
    order: list[tuple[str, list[int]]] = []
    for k in range(0, len(slots), nproc):
        block = slots[k : k + nproc]
        if len({s.host for s in block}) != 1:
            return None
        order.append((block[0].host, [s.local_gpu for s in block]))
    return order


def write_launch_files(
    instance: Instance, plan: Plan, directory: Path, megatron_args: Sequence[str] | None = None
) -> list[Path]:
    """Write the files of the module doc into ``directory``; return their paths.

    ``megatron_args`` are ``"--flag value"`` strings with shell-quoted values, as
    :func:`pipette_cp.report.megatron.flags.megatron_args` returns them (its result when
    None); each token is quoted again for the wrapper's argument array.

    Raises
    ------
    SpecError
        A node name that is not an RFC 1123 host name, naming
        ``cluster.node_names[i]`` and the name.
    """
    for i, name in enumerate(instance.cluster.node_names):
        check_host_name(name, f"cluster.node_names[{i}]")
    args = megatron.megatron_args(instance, plan) if megatron_args is None else megatron_args
    argv = [token for text in args for token in shlex.split(text)]
    slots = rank_map(instance, plan)
    env = megatron.megatron_environment(instance, plan)
    layout = torchrun_layout(slots)
    files = {
        "rank_map.csv": _rank_csv(plan, slots),
        "rankfile": "# Open MPI hostfile for the sequential mapper: the R-th host line runs rank R\n"
        "# (mpirun --hostfile rankfile --map-by seq; see launch_mpirun.sh)\n"
        + "".join(f"{s.host}\n" for s in slots),
        "slurm_hostfile": "".join(f"{s.host}\n" for s in slots),
        "rank_wrapper.sh": _wrapper(plan, slots, argv, env),
        "launch_slurm.sh": _slurm(plan, slots),
        "launch_mpirun.sh": _mpirun(plan, slots),
        "launch_torchrun.sh": _torchrun_script(plan, slots, layout),
        "torchrun.txt": _torchrun_text(slots, layout),
    }
    # the templates' default training script, the model's own where it differs
    script = train_script(instance.model)
    paths = []
    for name, text in files.items():
        text = text.replace(GPT_SCRIPT, script)
        path = directory / name
        directory.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        if name in SCRIPTS:
            path.chmod(0o755)
        paths.append(path)
    return paths


def _rank_csv(plan: Plan, slots: list[RankSlot]) -> str:
    """``rank_map.csv`` (a cp_rank column only with context parallelism)."""
    cp = ("cp_rank",) if plan.cp > 1 else ()
    cols = ("rank", "host", "local_gpu", "stage", "dp_rank", *cp, "tp_rank")
    rows = [cols, *([getattr(s, c) for c in cols] for s in slots)]
    return "".join(",".join(map(str, row)) + "\n" for row in rows)


def _fill(template: str, **values: object) -> str:
    """``template`` with each ``@KEY@`` replaced by its value (every one must be given)."""
    for key, value in values.items():
        template = template.replace(f"@{key.upper()}@", str(value))
    assert not _PLACEHOLDER.search(template), _PLACEHOLDER.search(template)
    return template


def _header(plan: Plan, slots: list[RankSlot], what: str) -> str:
    nodes = len({s.host for s in slots})
    return (
        "#!/usr/bin/env bash\n"
        f"# Generated by pipette-cp: plan {plan.layout()}, {len(slots)} Megatron-LM ranks on "
        f"{nodes} node{'s' if nodes > 1 else ''}.\n# {what}\n"
    )


def _hosts(slots: list[RankSlot]) -> list[str]:
    """The nodes the ranks use, in order of their first rank."""
    return list(dict.fromkeys(s.host for s in slots))


def _wrapper(plan: Plan, slots: list[RankSlot], argv: list[str], env: dict[str, str | None]) -> str:
    pairs: list[list[str]] = []
    for token in argv:
        if token.startswith("--") or not pairs:
            pairs.append([token])
        else:
            pairs[-1].append(token)
    lines = "".join(f"  {' '.join(map(shlex.quote, p))}\n" for p in pairs)
    env_lines = "".join(
        f"unset {k}\n" if v is None else f"export {k}={shlex.quote(v)}\n" for k, v in env.items()
    )
    return _header(plan, slots, "One rank: the rank, its host and GPU, its environment.") + _fill(
        _WRAPPER,
        world=len(slots),
        hosts=" ".join(shlex.quote(s.host) for s in slots),
        gpus=" ".join(str(s.local_gpu) for s in slots),
        master=shlex.quote(slots[0].host),
        port=MASTER_PORT,
        args=lines,
        env=env_lines or "# (no CUDA_DEVICE_MAX_CONNECTIONS rule applies to this plan)\n",
        parallelism="tensor or context parallelism" if plan.cp > 1 else "tensor parallelism",
    )


def _slurm(plan: Plan, slots: list[RankSlot]) -> str:
    hosts = _hosts(slots)
    gpus_per_node = max(sum(1 for s in slots if s.host == h) for h in hosts)
    usage = shlex.join([
        "sbatch", f"--nodes={len(hosts)}", f"--nodelist={','.join(hosts)}",
        f"--ntasks={len(slots)}", f"--gpus-per-node={gpus_per_node}", "--exclusive",
        "launch_slurm.sh",
    ])  # fmt: skip
    return _header(plan, slots, "Slurm: one task per rank on its host.") + _fill(
        _SLURM, usage=usage, ntasks=len(slots), master=shlex.quote(slots[0].host), port=MASTER_PORT
    )


def _mpirun(plan: Plan, slots: list[RankSlot]) -> str:
    return _header(plan, slots, "Open MPI: one process per rank on its host.") + _fill(
        _MPIRUN, np=len(slots), master=shlex.quote(slots[0].host), port=MASTER_PORT
    )


def _torchrun_command(slots: list[RankSlot], nnodes: int, node_rank: str, wrapper: str) -> str:
    nproc = len(slots) // nnodes
    return (
        f"torchrun --nnodes={nnodes} --nproc-per-node={nproc} --node-rank={node_rank} "
        f"--master-addr={shlex.quote(slots[0].host)} --master-port={MASTER_PORT} "
        f"--no-python {wrapper} torchrun"
    )


def _torchrun_script(
    plan: Plan, slots: list[RankSlot], layout: list[tuple[str, list[int]]] | None
) -> str:
    head = _header(plan, slots, "torchrun: one static-rendezvous torchrun per node.")
    if layout is None:
        return head + _NO_TORCHRUN
    per_node = "".join(
        f"#   on {host}: bash launch_torchrun.sh {k}\n" for k, (host, _) in enumerate(layout)
    )
    command = _torchrun_command(slots, len(layout), "K", "rank_wrapper.sh")
    return head + _fill(
        _TORCHRUN,
        per_node=per_node,
        command=command,
        nnodes=len(layout),
        last=len(layout) - 1,
        nproc=len(slots) // len(layout),
        hosts=" ".join(shlex.quote(h) for h, _ in layout),
        master=shlex.quote(slots[0].host),
        port=MASTER_PORT,
    )


def _torchrun_text(slots: list[RankSlot], layout: list[tuple[str, list[int]]] | None) -> str:
    if layout is None:
        return (
            "# torchrun cannot realise this placement: some node's ranks are not consecutive.\n"
            "# Use launch_slurm.sh (srun --distribution=arbitrary) or launch_mpirun.sh (mpirun).\n"
        )
    lines = ["# node_rank host GPUs of local ranks 0.. (rank_wrapper.sh sets LOCAL_RANK to them)"]
    lines += [f"{k} {host} {','.join(map(str, gpus))}" for k, (host, gpus) in enumerate(layout)]
    lines.append("# the command on each node, from the launch directory (launch_torchrun.sh K):")
    lines += [
        f"{host}: {_torchrun_command(slots, len(layout), str(k), 'rank_wrapper.sh')}"
        for k, (host, _) in enumerate(layout)
    ]
    return "\n".join(lines) + "\n"


# The launch directory: PIPETTE_CP_LAUNCH_DIR, this script's, or sbatch's submit directory
# (sbatch runs a copy of the script from its spool directory).
_FIND_DIR = """here=${PIPETTE_CP_LAUNCH_DIR:-}
if [[ -z "$here" ]]; then
  for dir in "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)" "${SLURM_SUBMIT_DIR:-}"; do
    if [[ -n "$dir" && -f "$dir/rank_wrapper.sh" ]]; then here=$dir; break; fi
  done
fi
if [[ -z "$here" || ! -f "$here/rank_wrapper.sh" ]]; then
  echo "rank_wrapper.sh not found: run from the launch directory or set PIPETTE_CP_LAUNCH_DIR" >&2
  exit 2
fi
"""
#: The Megatron-LM training script the templates name (a GPT model's).
GPT_SCRIPT = "pretrain_gpt.py"
_SETTINGS = """# Extra arguments go to every rank's Megatron-LM: data and tokenizer (--data-path,
# --tokenizer-type, --tokenizer-model), --train-iters, --lr, --save, --load, ...
# Settings: MASTER_PORT [@PORT@], PIPETTE_CP_PYTHON [python], PIPETTE_CP_TRAIN_SCRIPT
# [pretrain_gpt.py], PIPETTE_CP_LAUNCH_DIR [this directory; every node must see it].
"""
_WRAPPER = """# Started once per rank by launch_slurm.sh, launch_mpirun.sh or launch_torchrun.sh:
#   rank_wrapper.sh slurm|mpirun|torchrun [extra Megatron-LM arguments]
# LOCAL_RANK is the plan's GPU on the node (Megatron: torch.cuda.set_device(LOCAL_RANK));
# every GPU of the node stays visible.  PIPETTE_CP_SKIP_HOST_CHECK=1 skips the host check
# (for host names that differ from the cluster file's by more than a domain).
set -euo pipefail
world_size=@WORLD@
hosts=(@HOSTS@)
gpus=(@GPUS@)
megatron_args=(
@ARGS@)
fail() { echo "rank_wrapper.sh: $*" >&2; exit 2; }
launcher=${1:-}
shift || true
case "$launcher" in
  slurm) rank=${SLURM_PROCID:-}; size=${SLURM_NTASKS:-}; host=${SLURMD_NODENAME:-$(hostname)} ;;
  mpirun) rank=${OMPI_COMM_WORLD_RANK:-}; size=${OMPI_COMM_WORLD_SIZE:-}; host=$(hostname) ;;
  torchrun) rank=${RANK:-}; size=${WORLD_SIZE:-}; host=$(hostname) ;;
  *) fail "usage: rank_wrapper.sh slurm|mpirun|torchrun [extra Megatron-LM arguments]" ;;
esac
if [[ ! "$rank" =~ ^[0-9]+$ ]] || (( rank >= world_size )); then
  fail "rank '$rank' from $launcher is not one of 0..$((world_size - 1))"
fi
if [[ "$size" != "$world_size" ]]; then
  fail "$launcher started '$size' ranks; the plan has $world_size"
fi
want=${hosts[rank]}
if [[ "${PIPETTE_CP_SKIP_HOST_CHECK:-0}" != 1 && "$host" != "$want" \\
      && "${host%%.*}" != "${want%%.*}" ]]; then
  fail "rank $rank runs on '$host'; the plan puts it on '$want'"
fi
gpu=${gpus[rank]}
if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
  IFS=, read -ra visible <<< "$CUDA_VISIBLE_DEVICES"
  if (( gpu >= ${#visible[@]} )); then
    fail "rank $rank needs GPU $gpu but CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES; keep every GPU of the node visible"
  fi
fi
export RANK=$rank WORLD_SIZE=$world_size LOCAL_RANK=$gpu
export MASTER_ADDR=${MASTER_ADDR:-@MASTER@} MASTER_PORT=${MASTER_PORT:-@PORT@}
# Megatron's validate_args: CUDA_DEVICE_MAX_CONNECTIONS=1 with @PARALLELISM@ before
# Blackwell; unset with Megatron FSDP.
@ENV@exec "${PIPETTE_CP_PYTHON:-python}" "${PIPETTE_CP_TRAIN_SCRIPT:-pretrain_gpt.py}" \\
  "${megatron_args[@]}" "$@"
"""
_SLURM = (
    """# srun --distribution=arbitrary reads the hosts from SLURM_HOSTFILE (slurm_hostfile:
# line R is the host of rank R); rank_wrapper.sh picks the GPU.  From this directory:
#   @USAGE@ [extra Megatron-LM arguments]
# or inside an allocation of those nodes: bash launch_slurm.sh [extra Megatron-LM arguments]
"""
    + _SETTINGS
    + """# SRUN_ARGS: extra srun options (no --gpus-per-task or --gpu-bind: every GPU stays visible).
set -euo pipefail
"""
    + _FIND_DIR
    + """export SLURM_HOSTFILE="$here/slurm_hostfile"
export MASTER_ADDR=${MASTER_ADDR:-@MASTER@} MASTER_PORT=${MASTER_PORT:-@PORT@}
read -ra srun_extra <<< "${SRUN_ARGS:-}"
exec srun --distribution=arbitrary --ntasks=@NTASKS@ --kill-on-bad-exit=1 \\
  ${srun_extra[@]+"${srun_extra[@]}"} "$here/rank_wrapper.sh" slurm "$@"
"""
)
_MPIRUN = (
    """# Open MPI's sequential mapper (mpirun(1), --map-by seq; Open MPI 4 also --mca rmaps seq)
# starts rank R on the R-th host line of rankfile; rank_wrapper.sh picks the GPU.
# Run where mpirun reaches every node (ssh or a scheduler), from this directory:
#   bash launch_mpirun.sh [extra Megatron-LM arguments]
"""
    + _SETTINGS
    + """# MPIRUN_ARGS: extra mpirun options, e.g. "-x LD_LIBRARY_PATH -x NCCL_IB_HCA".
set -euo pipefail
"""
    + _FIND_DIR
    + """export MASTER_ADDR=${MASTER_ADDR:-@MASTER@} MASTER_PORT=${MASTER_PORT:-@PORT@}
export PIPETTE_CP_PYTHON=${PIPETTE_CP_PYTHON:-python}
export PIPETTE_CP_TRAIN_SCRIPT=${PIPETTE_CP_TRAIN_SCRIPT:-pretrain_gpt.py}
read -ra extra <<< "${MPIRUN_ARGS:-}"
exec mpirun -np @NP@ --hostfile "$here/rankfile" --map-by seq --bind-to none \\
  -x MASTER_ADDR -x MASTER_PORT -x PIPETTE_CP_PYTHON -x PIPETTE_CP_TRAIN_SCRIPT \\
  ${extra[@]+"${extra[@]}"} "$here/rank_wrapper.sh" mpirun "$@"
"""
)
_TORCHRUN = (
    """# Node K runs ranks K * @NPROC@ .. K * @NPROC@ + @NPROC@ - 1; from this directory:
@PER_NODE@#   (each followed by the extra Megatron-LM arguments), i.e. on node K:
#   @COMMAND@
"""
    + _SETTINGS
    + """set -euo pipefail
"""
    + _FIND_DIR
    + """hosts=(@HOSTS@)
node_rank=${1:-}
if [[ ! "$node_rank" =~ ^[0-9]+$ ]] || (( node_rank >= @NNODES@ )); then
  echo "usage: launch_torchrun.sh NODE_RANK [extra Megatron-LM arguments];" \\
    "node ranks 0..@LAST@ are the hosts ${hosts[*]}" >&2
  exit 2
fi
shift
exec torchrun --nnodes=@NNODES@ --nproc-per-node=@NPROC@ --node-rank="$node_rank" \\
  --master-addr=@MASTER@ --master-port="${MASTER_PORT:-@PORT@}" \\
  --no-python "$here/rank_wrapper.sh" torchrun "$@"
"""
)
_NO_TORCHRUN = """# torchrun cannot realise this placement: some node's ranks are not consecutive
# (torchrun gives node K ranks K * nproc .. (K + 1) * nproc - 1).
echo "torchrun cannot realise this placement: use launch_slurm.sh or launch_mpirun.sh" >&2
exit 2
"""
