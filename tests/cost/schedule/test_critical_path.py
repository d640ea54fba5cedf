"""Analytic pipeline model: textbook formulas, Pipette's flaw 2, the hidden critical path,
and the iteration tail (DP sync, embedding sync, optimizer)."""

from __future__ import annotations

import numpy as np
import pytest

from pipette_cp.cost.schedule.critical_path import PipelineInputs, finish_iteration, pipeline_times
from pipette_cp.cost.schedule.simulator import simulate_pipeline


def uniform(p: int, m: int, f: float = 1.0, b: float = 2.0, c: float = 0.0, v: int = 1, **kw: object) -> PipelineInputs:  # fmt: skip
    return PipelineInputs.uniform(pp=p, num_micro_batches=m, forward_s=f, backward_s=b, hop_s=c, vpp=v, **kw)  # fmt: skip


# ------------------------------------------------------------------ textbook cases
@pytest.mark.parametrize(("p", "m"), [(1, 5), (2, 8), (4, 8), (4, 3), (4, 6), (8, 32), (5, 1)])
def test_1f1b_equal_stages_no_comm(p: int, m: int) -> None:
    """(m + p - 1)(f + b) (Narayanan et al. 2021, sec. 2.2), any m, also m < p."""
    assert pipeline_times(uniform(p, m)).pipeline_s == pytest.approx((m + p - 1) * 3.0)


@pytest.mark.parametrize(("p", "m"), [(4, 6), (4, 7), (8, 12), (3, 10)])
def test_m_not_divisible_by_p_keeps_all_compute(p: int, m: int) -> None:
    """Pipette's formula (p-1)(f+g) + floor(m/p) p (f+g) drops (m mod p)(f+g) (flaw 2)."""
    f, b = 1.0, 2.0
    ours = pipeline_times(uniform(p, m, f, b)).pipeline_s
    pipette = (p - 1) * (f + b) + (m // p) * p * (f + b)
    assert ours == pytest.approx(pipette + (m % p) * (f + b))
    assert ours >= m * (f + b)  # every micro-batch's forward and backward is counted


@pytest.mark.parametrize(("p", "m", "v"), [(4, 8, 2), (4, 16, 4), (2, 4, 2), (8, 16, 2), (4, 4, 3)])
def test_interleaved_bubble_shrinks_by_v(p: int, m: int, v: int) -> None:
    """Stage times f, b split into v chunks: m (f + b) + (p - 1)(f + b) / v."""
    f, b = 1.0, 2.0
    x = uniform(p, m, f / v, b / v, v=v)
    assert pipeline_times(x).pipeline_s == pytest.approx(m * (f + b) + (p - 1) * (f + b) / v)


@pytest.mark.parametrize(("p", "m"), [(4, 8), (3, 5), (1, 4)])
def test_gpipe_equal_stages(p: int, m: int) -> None:
    assert pipeline_times(uniform(p, m, schedule="gpipe")).pipeline_s == pytest.approx(
        (m + p - 1) * 3.0
    )


def test_gpipe_is_a_flow_shop_with_lags() -> None:
    f, b, c = np.array([1.0, 3.0, 2.0]), np.array([2.0, 1.0, 5.0]), np.array([0.5, 0.25, 0.0])
    x = PipelineInputs(pp=3, num_micro_batches=4, forward_s=f, backward_s=b, fwd_hop_s=c,
                       bwd_hop_s=c, schedule="gpipe")  # fmt: skip
    # forward: sum f + lags + (m-1) max f; backward from the last stage: the same with b
    expected = (f.sum() + 0.75 + 3 * 3.0) + (b.sum() + 0.75 + 3 * 5.0)
    assert pipeline_times(x).pipeline_s == pytest.approx(expected)


def test_uneven_stages_bottleneck_sets_the_steady_state() -> None:
    f = np.array([1.0, 1.0, 2.0, 1.0])
    x = PipelineInputs(pp=4, num_micro_batches=16, forward_s=f, backward_s=2 * f,
                       fwd_hop_s=np.zeros(4), bwd_hop_s=np.zeros(4))  # fmt: skip
    # critical path through stage 2 (f = 2, b = 4): micro-batch 0 reaches it (f0 + f1 = 2),
    # it runs its own 16 (f + b) = 96; its first backward waits for the round trip
    # f2 + f3 + b3 = 5 after only its 2 warm-up forwards (4): +1; the last gradient
    # goes back through b1 + b0 = 4.  (The naive sum f + b + (m - 1)(f + b)_max = 105
    # ignores that the warm-up forwards hide most of the round trip.)
    assert pipeline_times(x).pipeline_s == pytest.approx(2 + 96 + 1 + 4)
    assert pipeline_times(x).pipeline_s == pytest.approx(simulate_pipeline(x).pipeline_time_s)


# ------------------------------------------------------------------ hidden critical path
@pytest.mark.parametrize(("p", "per_micro_batch"), [(2, 1), (3, 2), (6, 2)])
def test_blocking_p2p_costs_every_micro_batch(p: int, per_micro_batch: int) -> None:
    """docs/design.md, section 2: with blocking p2p the hops sit on the critical path in the
    steady state.  A middle stage makes two blocking exchanges per micro-batch (with
    s + 1 after its forward, with s - 1 after its backward): each extra micro-batch
    costs f + b + 2c (p >= 3), or f + b + c with two stages (one exchange each)."""
    f, b, c = 1.0, 2.0, 0.1
    for model in (lambda x: pipeline_times(x).pipeline_s, lambda x: simulate_pipeline(x)[0]):
        slope = model(uniform(p, 41, f, b, c)) - model(uniform(p, 40, f, b, c))
        assert slope == pytest.approx(f + b + per_micro_batch * c)


def test_free_hops_time_is_the_same_schedule_without_transfers() -> None:
    x = uniform(4, 8, c=0.2)
    times = pipeline_times(x)
    assert times.free_hops_s == pytest.approx(pipeline_times(uniform(4, 8)).pipeline_s)
    assert times.pipeline_s > times.free_hops_s


def test_stage_end_times_follow_the_last_gradient() -> None:
    x = uniform(4, 8, c=0.1)
    ends = pipeline_times(x).stage_end_s
    sim = simulate_pipeline(x)
    assert ends == pytest.approx(sim.stage_end_s)
    assert ends[0] == pytest.approx(pipeline_times(x).pipeline_s)
    assert (np.diff(ends) < 0).all()  # the last stage finishes first


# ------------------------------------------------------------------ iteration tail
def tail_inputs(overlap: bool = False, emb: float = 0.0) -> PipelineInputs:
    return PipelineInputs(
        pp=3, num_micro_batches=4, forward_s=np.ones(3), backward_s=2 * np.ones(3),
        fwd_hop_s=np.zeros(3), bwd_hop_s=np.zeros(3), dp_sync_s=np.array([5.0, 1.0, 3.0]),
        overlap_grad_reduce=overlap, embedding_sync_s=emb, optimizer_s=np.array([0.2, 0.3, 0.1]),
        param_gather_s=np.array([0.0, 0.4, 0.0]),
    )  # fmt: skip


def test_each_stage_syncs_after_its_last_backward_then_optimizer() -> None:
    x = tail_inputs()
    ends = np.array([18.0, 16.0, 14.0])
    tail = finish_iteration(x, ends, x.backward_s[:3])
    assert tail.dp_sync_end_s == pytest.approx(ends + x.dp_sync_s)
    # the slowest stage's sync gates the step; then the largest optimizer step and gather
    assert tail.total_s == pytest.approx(23.0 + 0.3 + 0.4)


def test_overlap_grad_reduce_hides_up_to_the_last_backward() -> None:
    x = tail_inputs(overlap=True)
    ends = np.array([18.0, 16.0, 14.0])
    tail = finish_iteration(x, ends, x.backward_s[:3])
    # exposed = max(dp - b_last, 0): 5 - 2, 0, 3 - 2
    assert tail.dp_sync_end_s == pytest.approx(ends + np.array([3.0, 0.0, 1.0]))


def test_embedding_sync_waits_for_first_and_last_stage() -> None:
    x = tail_inputs(emb=10.0)
    tail = finish_iteration(x, np.array([18.0, 16.0, 14.0]), x.backward_s[:3])
    assert tail.embedding_start_s == pytest.approx(max(18.0 + 5.0, 14.0 + 3.0))
    assert tail.optimizer_start_s == pytest.approx(33.0)


def test_no_embedding_sync_with_one_stage() -> None:
    x = PipelineInputs.uniform(pp=1, num_micro_batches=2, forward_s=1.0, backward_s=1.0)
    assert PipelineInputs(**{**x.__dict__, "embedding_sync_s": 4.0}).embedding_sync_s == 0.0


def test_schedule_must_match_vpp() -> None:
    with pytest.raises(ValueError, match="vpp"):
        uniform(4, 8, v=2, schedule="1f1b")


# ------------------------------------------------------------------ pinned numbers
def pinned_inputs() -> dict[str, PipelineInputs]:
    """Uneven stages (backward 1.8-2.4 x forward) and uneven hops, seeded."""
    rng = np.random.default_rng(3)
    out = {}
    for name, p, v, m, schedule in [
        ("1f1b-p5-m12", 5, 1, 12, "1f1b"), ("1f1b-p6-m4", 6, 1, 4, "1f1b"),
        ("interleaved-p4-v2-m8", 4, 2, 8, "interleaved"),
        ("interleaved-p3-v3-m6", 3, 3, 6, "interleaved"), ("gpipe-p4-m6", 4, 1, 6, "gpipe"),
    ]:  # fmt: skip
        f = rng.uniform(0.5, 1.5, p * v)
        out[name] = PipelineInputs(
            pp=p, vpp=v, num_micro_batches=m, schedule=schedule, forward_s=f,  # type: ignore[arg-type]
            backward_s=f * rng.uniform(1.8, 2.4, p * v), fwd_hop_s=rng.uniform(0, 0.2, p),
            bwd_hop_s=rng.uniform(0, 0.2, p),
        )  # fmt: skip
    return out


#: (pipeline_s, free_hops_s, stage_end_s) before the speed work: caches must not change them.
#: The interleaved rows changed once, deliberately: receives that never happen (stage 0's
#: warm-up input, the last stage's cool-down gradient) are no longer charged (fuzzing found
#: the analytic time above the simulator's; tests/property/test_search.py).
PINNED = {
    "1f1b-p5-m12": (55.514295118984364, 52.17192398235687, (55.514295118984364, 54.307930359035666, 52.57863597839427, 50.05478320584278, 47.50022319602174)),
    "1f1b-p6-m4": (31.816450623474, 30.052912236566712, (31.816450623474, 30.771954199147764, 27.291656969875177, 25.7962547097522, 23.81982671616121, 20.870712775526584)),
    "interleaved-p4-v2-m8": (71.87197198801248, 68.20315539423817, (71.87197198801248, 69.8114168925356, 67.14102207990953, 63.898093904217994)),
    "interleaved-p3-v3-m6": (69.9314897219668, 67.29160694552655, (69.9314897219668, 67.12560965948208, 64.94839377401206)),
    "gpipe-p4-m6": (32.00539825624682, 31.496662338642547, (32.00539825624682, 29.68123921649763, 27.433113615900478, 22.209161146450246)),
}  # fmt: skip


@pytest.mark.parametrize("name", list(PINNED))
def test_pinned_pipeline_times(name: str) -> None:
    x = pinned_inputs()[name]
    for _ in range(2):  # a second call may come from a cache: the same numbers
        times = pipeline_times(x)
        pipeline_s, free_s, ends = PINNED[name]
        assert times.pipeline_s == pytest.approx(pipeline_s, rel=1e-12)
        assert times.free_hops_s == pytest.approx(free_s, rel=1e-12)
        assert tuple(times.stage_end_s) == pytest.approx(ends, rel=1e-12)
