"""The examples of the reference pages (:mod:`pipette_cp.report.reference`): a minimal
and a full one per file kind, each read by the real reader in the tests."""

from __future__ import annotations

import json

from pipette_cp.cost.evaluator.evaluate import evaluate
from pipette_cp.io.instance_file import load_instance
from pipette_cp.io.paths import MODELS_DIR
from pipette_cp.report.plan_file import plan_document
from pipette_cp.specs.layouts import make_plan

CLUSTER_MINIMAL = """\
format: pipette-cp-cluster/1
gpu: H100-SXM5-80GB
gpus_per_node: 8
num_nodes: 4
nominal: true                       # every node pair alike (a cluster on paper)
inter_node_bandwidth_gb_per_s: 45
"""

CLUSTER_MEASURED = """\
format: pipette-cp-cluster/1
name: lab-h100
source: nccl-tests sendrecv_perf between every node pair, 2026-11-30
gpu: H100-SXM5-80GB
gpus_per_node: 8
nics_per_node: 8
nic_bandwidth_gb_per_s: 46.2
intra_node_bandwidth_gb_per_s: 360.5   # measured on one node; or a G x G matrix
intra_node_latency_us: 5
inter_node_latency_us: 10
node_names: [gpu-a01, gpu-a02, gpu-b01, gpu-b02]
node_groups: [0, 0, 1, 1]              # leaf switch of each node
node_bandwidth_gb_per_s:               # row = sender; null or 0 = failed pair
- [null, 46.1, 40.3, 40.2]
- [46.0, null, 40.1, 0]
- [40.2, 40.4, null, 45.9]
- [40.3, 0, 46.1, null]
"""

CLUSTER_FABRIC = """\
format: pipette-cp-cluster/1
name: fat-tree-2048
gpu: H100-SXM5-80GB
gpus_per_node: 8
num_nodes: 2048
fabric:
  levels:                              # innermost first; the last holds every node
  - {name: leaf, nodes: 32, bandwidth_gb_per_s: 46, latency_us: 5}
  - {name: pod, nodes: 512, bandwidth_gb_per_s: 42.8, latency_us: 7}
  - {name: spine, nodes: 2048, bandwidth_gb_per_s: 38.5, latency_us: 9}
  slow_nics: {node: [3, 17], nic_factor: [0.5, 0.5]}
  node_pairs: {src: [0, 5], dst: [5, 0], bandwidth_gb_per_s: [0, 20.1]}   # 0 = failed
"""

INSTANCE_MINIMAL = """\
model: llama-2-7b
cluster: {generator: {kind: degraded, nodes: 4, seed: 1}}
training: {global_batch_size: 512, seq_length: 4096}
"""

INSTANCE_FULL = """\
name: llama-2-7b-lab
description: Llama-2-7B on the lab's four H100 nodes, measured 2026-11-30.
family: lab
model: llama-2-7b                      # or a file, a config.json, or the fields inline
cluster:
  format: pipette-cp-cluster/1         # or {file: lab.yaml}, or {generator: {...}}
  gpu: H100-SXM5-80GB
  gpus_per_node: 8
  num_nodes: 4
  nominal: true
  inter_node_bandwidth_gb_per_s: 45
training:
  global_batch_size: 512
  seq_length: 4096
  precision: bf16
  optimizer: adam
  attention_kernel: flash3
  dropout: false
  memory_headroom_fraction: 0.05
search_space:
  tp: [1, 2, 4, 8]
  pp: [1, 2, 4]
  micro_batch_size: [1, 2]
  recompute: [none, selective]
  exclude_nodes: []
"""

MODEL_MINIMAL = """\
name: toy-gpt
num_layers: 12
hidden_size: 768
num_attention_heads: 12
ffn_hidden_size: 3072
vocab_size: 50257
max_seq_length: 2048
"""

PROFILE_MINIMAL = """\
{
 "gpu": "NVIDIA H100 80GB HBM3",
 "model": "llama-2-7b",
 "seq_length": 4096,
 "entries": [
  {"tp": 1, "micro_batch_size": 1, "forward_s": 0.0094, "backward_s": 0.0201},
  {"tp": 2, "micro_batch_size": 1, "forward_s": 0.0051, "backward_s": 0.0108,
   "recompute": "selective", "peak_memory_bytes": 3221225472, "repetitions": 20}
 ]
}
"""

#: The layout of the plan example (predicted on a bundled instance when the page is made).
PLAN_INSTANCE = "gpt3-1.3b-nominal-8"


def plan_example() -> str:
    """A plan file as ``predict --json`` prints it for a small layout."""
    instance = load_instance(PLAN_INSTANCE)
    plan = make_plan(num_layers=instance.model.num_layers, dp=2, pp=2, tp=2, micro_batch_size=1,
                     sequence_parallel=True)  # fmt: skip
    plan = plan.model_copy(update={"instance": PLAN_INSTANCE})
    document = plan_document(plan, evaluate(instance, plan))
    return json.dumps(_rounded(document), indent=1) + "\n"


def _rounded(value: object) -> object:
    """Floats to 6 significant digits (the page stays readable and stable)."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def examples(kind: str) -> list[tuple[str, str, str]]:
    """(title, language, text) of each example of ``kind``'s page."""
    return {
        "cluster": [("Minimal: a cluster on paper", "yaml", CLUSTER_MINIMAL),
                    ("Measured: a node matrix (nccl-tests, `cluster import`)", "yaml",
                     CLUSTER_MEASURED),
                    ("Any size: switch levels and exceptions", "yaml", CLUSTER_FABRIC)],
        "instance": [("Minimal", "yaml", INSTANCE_MINIMAL), ("Full", "yaml", INSTANCE_FULL)],
        "model": [("Minimal", "yaml", MODEL_MINIMAL),
                  ("Full: the bundled llama-2-7b", "yaml",
                   (MODELS_DIR / "llama-2-7b.yaml").read_text(encoding="utf-8"))],
        "plan": [("A plan (`predict gpt3-1.3b-nominal-8 --dp 2 --pp 2 --tp 2 --mb 1 "
                  "--sequence-parallel --json`)", "json", plan_example())],
        "profile": [("Minimal", "json", PROFILE_MINIMAL)],
    }[kind]  # fmt: skip
