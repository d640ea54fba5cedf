"""The generated launchers, run under bash with fake ``srun``, ``mpirun`` and ``torchrun``.

Each fake starts every rank's wrapper with the environment the real launcher gives it:

* ``srun --distribution=arbitrary`` (srun(1)): task R on the R-th line of
  ``SLURM_HOSTFILE``, with ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS`` and
  ``SLURMD_NODENAME``;
* Open MPI ``mpirun --hostfile F --map-by seq`` (mpirun(1), the sequential mapper):
  rank R on the R-th host line of F, with ``OMPI_COMM_WORLD_RANK``,
  ``OMPI_COMM_WORLD_LOCAL_RANK`` and ``OMPI_COMM_WORLD_SIZE``, and on a remote node only
  the variables given with ``-x`` (the fake starts each rank with ``env -i``);
* ``torchrun`` with static rendezvous (``torch.distributed.run``): on node K, local
  rank j is ``RANK = K * nproc + j`` with ``LOCAL_RANK = j``, ``WORLD_SIZE``,
  ``MASTER_ADDR`` and ``MASTER_PORT``; ``--no-python`` runs the wrapper itself.

``hostname`` prints the host the fake placed the rank on, and ``PIPETTE_CP_PYTHON`` is
a recorder that writes each rank's environment and argv; the test then checks every
rank's host, GPU, RANK, WORLD_SIZE, LOCAL_RANK, CUDA_DEVICE_MAX_CONNECTIONS and that the
arguments parse with Megatron-LM's argument table.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from pipette_cp.io.instance_file import load_instance
from pipette_cp.report.launch import rank_map, torchrun_layout, write_launch_files
from pipette_cp.report.megatron.check import check_megatron_argv
from pipette_cp.report.megatron.flags import megatron_argv, megatron_environment
from pipette_cp.specs import Plan
from pipette_cp.specs.layouts import make_plan

INSTANCE = load_instance("gpt3-1.3b-g5-16")  # 2 nodes x 8 V100, 24 layers
EXTRA = ["--data-path", "/data/my corpus_text_document", "--tokenizer-type", "GPT2BPETokenizer"]

FAKE_SRUN = r"""#!/usr/bin/env bash
set -eu
ntasks= dist=
while [[ $# -gt 0 && "$1" == -* ]]; do
  case "$1" in
    --ntasks=*) ntasks=${1#*=} ;;
    --distribution=*) dist=${1#*=} ;;
  esac
  shift
done
[[ "$dist" == arbitrary ]] || { echo "fake srun: needs --distribution=arbitrary" >&2; exit 9; }
mapfile -t hosts < "$SLURM_HOSTFILE"
[[ ${#hosts[@]} == "$ntasks" ]] || { echo "fake srun: hostfile has ${#hosts[@]} lines" >&2; exit 9; }
declare -A local
for ((r = 0; r < ntasks; r++)); do
  h=${hosts[r]}; l=${local[$h]:-0}; local[$h]=$((l + 1))
  SLURM_PROCID=$r SLURM_LOCALID=$l SLURM_NTASKS=$ntasks SLURMD_NODENAME=$h FAKE_HOST=$h "$@"
done
"""
FAKE_MPIRUN = r"""#!/usr/bin/env bash
set -eu
np= hostfile= map= fwd=()
while [[ $# -gt 0 && "$1" == -* ]]; do
  case "$1" in
    -np) np=$2; shift ;;
    --hostfile) hostfile=$2; shift ;;
    --map-by) map=$2; shift ;;
    --bind-to) shift ;;
    -x) fwd+=("$2=${!2}"); shift ;;
  esac
  shift
done
[[ "$map" == seq ]] || { echo "fake mpirun: needs --map-by seq" >&2; exit 9; }
mapfile -t hosts < <(grep -v '^[[:space:]]*\(#\|$\)' "$hostfile")
[[ ${#hosts[@]} == "$np" ]] || { echo "fake mpirun: ${#hosts[@]} host lines" >&2; exit 9; }
declare -A local
for ((r = 0; r < np; r++)); do
  h=${hosts[r]}; l=${local[$h]:-0}; local[$h]=$((l + 1))
  env -i PATH="$PATH" FAKE_RECORD_DIR="$FAKE_RECORD_DIR" FAKE_HOST="$h" "${fwd[@]}" \
    OMPI_COMM_WORLD_RANK=$r OMPI_COMM_WORLD_LOCAL_RANK=$l OMPI_COMM_WORLD_SIZE=$np "$@"
done
"""
FAKE_TORCHRUN = r"""#!/usr/bin/env bash
set -eu
nnodes= nproc= node= addr= port= nopython=0
while [[ $# -gt 0 && "$1" == -* ]]; do
  case "$1" in
    --nnodes=*) nnodes=${1#*=} ;;
    --nproc-per-node=*) nproc=${1#*=} ;;
    --node-rank=*) node=${1#*=} ;;
    --master-addr=*) addr=${1#*=} ;;
    --master-port=*) port=${1#*=} ;;
    --no-python) nopython=1 ;;
  esac
  shift
done
[[ $nopython == 1 ]] || { echo "fake torchrun: expected --no-python" >&2; exit 9; }
for ((j = 0; j < nproc; j++)); do
  RANK=$((node * nproc + j)) LOCAL_RANK=$j WORLD_SIZE=$((nnodes * nproc)) \
    LOCAL_WORLD_SIZE=$nproc MASTER_ADDR=$addr MASTER_PORT=$port "$@"
done
"""
FAKE_HOSTNAME = """#!/usr/bin/env bash
echo "${FAKE_HOST:-localhost}"
"""
RECORDER = r"""#!/usr/bin/env bash
out="$FAKE_RECORD_DIR/rank-$RANK"
{
  echo "HOST=$FAKE_HOST"
  for v in RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT CUDA_VISIBLE_DEVICES; do
    echo "$v=${!v-}"
  done
  echo "CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS-<unset>}"
} > "$out.env"
printf '%s\0' "$@" > "$out.argv"
"""


@pytest.fixture(scope="module")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    bin_dir = tmp_path_factory.mktemp("bin")
    for name, text in [("srun", FAKE_SRUN), ("mpirun", FAKE_MPIRUN), ("torchrun", FAKE_TORCHRUN),
                       ("hostname", FAKE_HOSTNAME), ("record", RECORDER)]:  # fmt: skip
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def _plan(split: tuple[int, ...], pp: int, vpp: int, tp: int, **knobs: object) -> Plan:
    """16 ranks; within each node the GPUs are reversed, so LOCAL_RANK != local index."""
    dp = 16 // (pp * tp)
    default = make_plan(num_layers=24, dp=dp, pp=pp, tp=tp, micro_batch_size=1)
    flip = {g: (g // 8) * 8 + 7 - g % 8 for g in range(16)}
    placement = tuple(tuple(flip[g] for g in unit) for unit in default.placement)
    return make_plan(num_layers=24, dp=dp, pp=pp, tp=tp, micro_batch_size=1, vpp=vpp,
                     layer_split=split, placement=placement, **knobs)  # type: ignore[arg-type]  # fmt: skip


SPLITS = {
    "even": ((6, 6, 6, 6), 4, 1),
    "first-last": ((5, 7, 7, 5), 4, 1),
    "layout": ((7, 5, 6, 6), 4, 1),
    "interleaved": ((6, 6, 6, 6), 2, 2),
    "interleaved-layout": ((5, 6, 7, 6), 2, 2),
}
SPLIT_FLAG = {
    "even": None,
    "first-last": "--decoder-first-pipeline-num-layers",
    "layout": "--pipeline-model-parallel-layout",
    "interleaved": "--num-virtual-stages-per-pipeline-rank",
    "interleaved-layout": "--pipeline-model-parallel-layout",
}


def _launch(launcher: str, directory: Path, plan: Plan, fakes: Path, record: Path) -> None:
    env = {
        **os.environ,
        "PATH": f"{fakes}:{os.environ['PATH']}",
        "PIPETTE_CP_PYTHON": str(fakes / "record"),
        "FAKE_RECORD_DIR": str(record),
        "CUDA_DEVICE_MAX_CONNECTIONS": "8",  # the caller's: the wrapper must set or unset it
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    commands: list[tuple[list[str], dict[str, str]]]
    if launcher == "torchrun":
        layout = torchrun_layout(rank_map(INSTANCE, plan))
        assert layout is not None
        commands = [([str(directory / "launch_torchrun.sh"), str(k), *EXTRA], {"FAKE_HOST": host})
                    for k, (host, _) in enumerate(layout)]  # fmt: skip
    else:
        commands = [([str(directory / f"launch_{launcher}.sh"), *EXTRA], {})]
    for argv, extra in commands:
        done = subprocess.run(["bash", *argv], env={**env, **extra}, capture_output=True,
                              text=True, timeout=60, cwd=directory.parent)  # fmt: skip
        assert done.returncode == 0, done.stderr


def _records(record: Path, n: int) -> list[tuple[dict[str, str], list[str]]]:
    out = []
    for r in range(n):
        lines = (record / f"rank-{r}.env").read_text().splitlines()
        env = dict(line.split("=", 1) for line in lines)
        argv = (record / f"rank-{r}.argv").read_bytes().decode().split("\0")[:-1]
        out.append((env, argv))
    return out


def _check_ranks(launcher: str, plan: Plan, record: Path) -> list[str]:
    """Every rank ran once, where the plan puts it, with the right environment (with no
    rule the caller's CUDA_DEVICE_MAX_CONNECTIONS=8 stays; mpirun forwards only -x)."""
    slots = rank_map(INSTANCE, plan)
    want_env = megatron_environment(INSTANCE, plan)
    inherited = None if launcher == "mpirun" else "8"
    connections = want_env.get("CUDA_DEVICE_MAX_CONNECTIONS", inherited)
    expected_argv = ["pretrain_gpt.py", *megatron_argv(INSTANCE, plan), *EXTRA]
    assert len(list(record.glob("rank-*.env"))) == len(slots)
    for slot, (env, argv) in zip(slots, _records(record, len(slots)), strict=True):
        assert env["HOST"] == slot.host, (slot, env)
        assert (env["RANK"], env["WORLD_SIZE"]) == (str(slot.rank), str(len(slots)))
        assert env["LOCAL_RANK"] == str(slot.local_gpu), (slot, env)
        assert env["CUDA_VISIBLE_DEVICES"] == ""  # every GPU of the node stays visible
        assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == (connections or "<unset>"), env
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == (slots[0].host, "6000")
        assert argv == expected_argv
        seen = env["CUDA_DEVICE_MAX_CONNECTIONS"]
        check_megatron_argv(
            argv[1:], {"CUDA_DEVICE_MAX_CONNECTIONS": None if seen == "<unset>" else seen}
        )
    return expected_argv


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("split", sorted(SPLITS))
@pytest.mark.parametrize("launcher", ["slurm", "mpirun", "torchrun"])
def test_launcher_starts_every_rank_where_the_plan_puts_it(
    launcher: str, split: str, tp: int, fakes: Path, tmp_path: Path
) -> None:
    layers, pp, vpp = SPLITS[split]
    plan = _plan(layers, pp, vpp, tp, sequence_parallel=tp > 1)
    write_launch_files(INSTANCE, plan, tmp_path / "launch")
    record = tmp_path / "record"
    record.mkdir()
    _launch(launcher, tmp_path / "launch", plan, fakes, record)
    argv = _check_ranks(launcher, plan, record)
    flag = SPLIT_FLAG[split]
    virtual = [a for a in argv if "virtual" in a or a == "--pipeline-model-parallel-layout"]
    assert virtual == ([flag] if flag and (vpp > 1 or "layout" in flag) else [])
    assert ("--sequence-parallel" in argv) == (tp > 1)
    assert (megatron_environment(INSTANCE, plan) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}) == (
        tp > 1
    )


@pytest.mark.parametrize("launcher", ["slurm", "mpirun"])
def test_scattered_placement_and_fsdp(launcher: str, fakes: Path, tmp_path: Path) -> None:
    """Stage 0's replicas on both nodes: torchrun cannot, srun and mpirun can; ZeRO-3
    (Megatron FSDP) must run with CUDA_DEVICE_MAX_CONNECTIONS unset."""
    units = [(g, g + 1) for g in range(0, 16, 2)]
    placement = tuple(units[i] for i in (0, 4, 1, 5, 2, 6, 3, 7))
    plan = make_plan(num_layers=24, dp=2, pp=4, tp=2, micro_batch_size=1, placement=placement,
                     dp_sharding="optim_grads_params", layer_split=(5, 7, 7, 5))  # fmt: skip
    assert torchrun_layout(rank_map(INSTANCE, plan)) is None
    write_launch_files(INSTANCE, plan, tmp_path / "launch")
    record = tmp_path / "record"
    record.mkdir()
    _launch(launcher, tmp_path / "launch", plan, fakes, record)
    _check_ranks(launcher, plan, record)
    env, _ = _records(record, 16)[0]
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "<unset>"
    done = subprocess.run(["bash", str(tmp_path / "launch" / "launch_torchrun.sh"), "0"],
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert done.returncode == 2 and "torchrun cannot realise" in done.stderr


def _wrapper(tmp_path: Path, fakes: Path, **env: str) -> subprocess.CompletedProcess[str]:
    plan = _plan((6, 6, 6, 6), 4, 1, 2)
    write_launch_files(INSTANCE, plan, tmp_path / "launch")
    base = {"PATH": f"{fakes}:{os.environ['PATH']}", "PIPETTE_CP_PYTHON": str(fakes / "record"),
            "FAKE_RECORD_DIR": str(tmp_path), "SLURM_NTASKS": "16"}  # fmt: skip
    return subprocess.run(["bash", str(tmp_path / "launch" / "rank_wrapper.sh"), "slurm"],
                          env={**base, **env}, capture_output=True, text=True, timeout=30)  # fmt: skip


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SLURM_PROCID": "0", "SLURMD_NODENAME": "node001"}, "runs on 'node001'; the plan puts"),
        ({"SLURM_PROCID": "16", "SLURMD_NODENAME": "node001"}, "rank '16' from slurm"),
        ({"SLURM_PROCID": "0", "SLURMD_NODENAME": "node000", "SLURM_NTASKS": "8"}, "'8' ranks"),
        ({"SLURM_PROCID": "0", "SLURMD_NODENAME": "node000", "CUDA_VISIBLE_DEVICES": "0"},
         "needs GPU 7 but CUDA_VISIBLE_DEVICES=0"),
    ],
)  # fmt: skip
def test_wrapper_refuses_a_wrong_start(
    env: dict[str, str], message: str, fakes: Path, tmp_path: Path
) -> None:
    done = _wrapper(tmp_path, fakes, **env)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not list(tmp_path.glob("rank-*"))


def test_wrapper_accepts_a_domain_and_the_skip_switch(fakes: Path, tmp_path: Path) -> None:
    assert (
        _wrapper(tmp_path, fakes, SLURM_PROCID="0", SLURMD_NODENAME="node000.dc1").returncode == 0
    )
    skip = _wrapper(tmp_path, fakes, SLURM_PROCID="0", SLURMD_NODENAME="gpu-17",
                    PIPETTE_CP_SKIP_HOST_CHECK="1")  # fmt: skip
    assert skip.returncode == 0, skip.stderr
