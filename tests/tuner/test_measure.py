"""The one measurement path (tuner.measure) on 2 CPU ranks over gloo: build, gate, time, agree."""

from __future__ import annotations

import dataclasses

import pytest

from a2a_tune.kernels import MoEShape
from a2a_tune.tuner.launch import run_ranks
from a2a_tune.tuner.measure import Backends, Result, capacity_for, input_sets, measure, measure_case
from a2a_tune.tuner.runtime.measurement import FIGURE, MeasurementKey
from a2a_tune.tuner.runtime.point import Point

SHAPE = MoEShape(8, 2, 32, 16, "bf16")  # built for 16 tokens per rank: the largest count measured
POINT = Point(2, 32, 2, 8, "bf16", "uniform", 8)


def _outcomes(ctx) -> dict:
    got = {}
    with Backends(ctx, SHAPE) as built:
        first = built.get("planted_build_fails", 4)
        again = built.get("planted_build_fails", 8)
        got["build"] = (first.kind, first.reason)
        got["build again"] = (again.kind, again.reason)
        nvfp4 = Backends(ctx, dataclasses.replace(SHAPE, dtype="nvfp4")).get("planted_bf16_only", 4)
        got["nvfp4"] = (nvfp4.kind, nvfp4.reason)
        # a fixed-capacity backend: built for the load (no engine capacity given), told the step
        small, large = built.get("capacity_reporter", 4), built.get("capacity_reporter", 8)
        got["capacity"] = [b.knobs() for b in (small, large)]
        # the others: built once for the largest count, each step told
        a, b = built.get("nccl_all2allv", 4), built.get("nccl_all2allv", 8)
        got["shared"] = (a is b, b.shape.max_tokens_per_rank, b.step_capacity)
        inputs = input_sets(ctx, SHAPE, 8, sets=2)
        good = measure(ctx, b, inputs, warmup=0, iters=3)
        got["measured"] = (good.kind, good.timing, len(good.device_us), good.median_us is not None)
        bad = measure(ctx, built.get("planted_off_by_one", 8), inputs, warmup=0, iters=3)
        got["incorrect"] = (bad.kind, bad.device_us, bad.median_us)
        got["halves"] = (len(good.dispatch_us), len(good.combine_us), good.dispatch_median_us, good.combine_median_us)
        got["traffic"] = good.traffic
        got["figures"] = good.figures()
        got["measurement"] = good.measurement(MeasurementKey.of("nccl_all2allv", POINT))
        got["stats"] = good.stats
        case = measure_case(ctx, built, "nccl_all2allv", 8, inputs, warmup=0, iters=2)
        got["workspace"] = (case.kind, case.workspace_bytes, built.workspace_bytes("nccl_all2allv", 8))
        got["without split"] = measure(ctx, b, inputs, warmup=0, iters=2, split=False)
    with Backends(ctx, SHAPE, capacity=64) as engine:  # an engine's capacity: paid at every step
        got["engine capacity"] = engine.get("capacity_reporter", 4).knobs()
    return got


@pytest.fixture(scope="module")
def outcomes():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("A2A_TUNE_BACKEND_MODULES", "planted_backends,knob_backends")
        return run_ranks(_outcomes, 2, "cpu")


def test_a_construction_failing_on_one_rank_fails_on_every_rank_once_in_full(outcomes):
    rank0, rank1 = outcomes
    assert rank1["build"] == (
        "error",
        "construction failed: RuntimeError: planted failure: out of memory for the workspace",
    )
    assert rank0["build"] == ("error", "construction failed: on another rank")
    for rank in outcomes:  # remembered: not built again at the next token count
        assert rank["build again"] == ("error", "construction failed (see the first failure of this shape)")


def test_an_infeasible_shape_is_skipped_with_the_backends_reason(outcomes):
    for rank in outcomes:
        assert rank["nvfp4"] == ("infeasible", "does not carry nvfp4")


def test_backends_are_built_at_the_capacity_of_the_point_and_told_the_step(outcomes):
    for rank in outcomes:
        assert rank["capacity"] == [
            {"built_for_tokens": 4, "step_tokens": 4},
            {"built_for_tokens": 8, "step_tokens": 8},
        ]
        assert rank["engine capacity"] == {"built_for_tokens": 64, "step_tokens": 4}
        assert rank["shared"] == (True, 16, 8)


def test_a_backend_is_timed_only_after_it_passed_the_gate(outcomes):
    for rank in outcomes:
        assert rank["measured"] == ("measured", "eager", 3, True)
        assert rank["incorrect"] == ("incorrect", [], None)


def test_capacity_for_is_the_load_or_the_engines_capacity():
    assert (capacity_for(None, 0), capacity_for(None, 8), capacity_for(64, 8), capacity_for(4, 8)) == (1, 8, 64, 8)
    assert not Result("infeasible", "why").ok and Result("passed").ok


def test_a_measurement_carries_dispatch_and_combine_apart_and_the_bytes_it_moved(outcomes):
    rank0, rank1 = outcomes
    for rank in outcomes:
        n_dispatch, n_combine, dispatch, combine = rank["halves"]
        assert (n_dispatch, n_combine) == (3, 3) and dispatch > 0 and combine > 0  # one a sample, like the round trip
    assert rank0["halves"] == rank1["halves"]  # max over ranks: one number per sample
    t = rank0["traffic"]
    assert t == rank1["traffic"]
    # 8 tokens a rank, top-2 of 8 experts on 2 ranks, bf16 rows of 32 x 2 B: each token goes to
    # 1 or 2 ranks (logical), to the other rank at most once (link); combine rows are the same size
    row = 32 * 2
    assert 8 * row <= t.dispatch_logical <= 16 * row and 0 < t.dispatch_link <= 8 * row
    assert t.dispatch_logical - t.dispatch_link <= 8 * row  # the own rank at most once a token
    assert (t.combine_logical, t.combine_link) == (t.dispatch_logical, t.dispatch_link)
    assert set(rank0["figures"]) == set(FIGURE)
    assert rank0["figures"]["dispatch_logical_bytes"] == t.dispatch_logical


def test_a_measured_result_is_its_cases_measurement(outcomes):
    """What the store keeps of a measured case: the key, the mode, the statistics, the samples to
    the nanosecond, the knobs, and every figure measured (workspace: not on CPU ranks)."""
    rank0 = outcomes[0]
    m, stats = rank0["measurement"], rank0["stats"]
    assert (m.key, m.point, m.timing) == (("nccl_all2allv", *POINT), POINT, "eager")
    assert (m.median_us, m.p10_us, m.p90_us, m.ci_low_us, m.ci_high_us, m.n) == (
        stats.median_us,
        stats.p10_us,
        stats.p90_us,
        stats.ci_low_us,
        stats.ci_high_us,
        3,
    )
    assert len(m.samples) == 3 and m.host_median_us is not None
    # not one case's: workspace is not measured on CPU ranks; group_us is the sweep's, one median per group
    assert set(m.figures) == set(FIGURE) - {"workspace_bytes", "group_us"}
    assert m.figure("dispatch_us") == rank0["halves"][2] and len(m.figure("combine_samples")) == 3
    assert m.figure("combine_link_bytes") == rank0["traffic"].combine_link


def test_device_memory_is_not_measured_on_cpu_ranks(outcomes):
    for rank in outcomes:
        assert rank["workspace"] == ("measured", None, None)
        assert rank["figures"]["workspace_bytes"] is None


def test_the_knob_search_times_round_trips_only(outcomes):
    for rank in outcomes:
        r = rank["without split"]
        assert r.kind == "measured" and (r.dispatch_us, r.combine_us, r.traffic) == ([], [], None)
