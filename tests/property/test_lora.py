"""LoRA never costs more than full training of the same plan: the iteration time and
every stage's predicted peak, on a Llama-3-8B-like model over random layouts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pipette_cp.clusters.generators.registry import generate
from pipette_cp.cost.evaluator.evaluate import Evaluator
from pipette_cp.specs import Instance, TrainingSpec
from pipette_cp.specs.layouts import make_plan
from pipette_cp.specs.lora import LORA_TARGETS, LoraSpec
from tests.models import llama3_8b

CLUSTER = generate("h100-multileaf", nodes=2, seed=0)
FULL = Instance(
    name="llama",
    model=llama3_8b(),
    cluster=CLUSTER,
    training=TrainingSpec(global_batch_size=64, seq_length=4096, framework="megatron-bridge"),
)
EVALUATORS: dict[LoraSpec | None, Evaluator] = {}


def evaluator(lora: LoraSpec | None) -> Evaluator:
    if lora not in EVALUATORS:
        training = FULL.training.model_copy(update={"lora": lora})
        EVALUATORS[lora] = Evaluator(FULL.model_copy(update={"training": training}))
    return EVALUATORS[lora]


@given(
    tp=st.sampled_from([1, 2, 4]),
    pp=st.sampled_from([1, 2, 4]),
    mb=st.sampled_from([1, 2]),
    recompute=st.sampled_from(["none", "selective", "full"]),
    dist_opt=st.booleans(),
    sp=st.booleans(),
    rank=st.sampled_from([8, 16, 64]),
    targets=st.sets(st.sampled_from(LORA_TARGETS), min_size=1),
)
def test_lora_never_raises_time_or_memory(
    tp: int, pp: int, mb: int, recompute: str, dist_opt: bool, sp: bool, rank: int,
    targets: set[str],
) -> None:  # fmt: skip
    dp = 16 // (tp * pp)
    plan = make_plan(num_layers=32, dp=dp, pp=pp, tp=tp, micro_batch_size=mb,
                     recompute=recompute, distributed_optimizer=dist_opt and dp > 1,
                     sequence_parallel=sp and tp > 1)  # fmt: skip
    lora = LoraSpec(rank=rank, target_modules=tuple(targets))
    full, tuned = evaluator(None).evaluate(plan), evaluator(lora).evaluate(plan)
    assert tuned.iteration_time_s <= full.iteration_time_s
    for a, b in zip(tuned.memory_bytes_by_stage, full.memory_bytes_by_stage, strict=True):
        assert a <= b
