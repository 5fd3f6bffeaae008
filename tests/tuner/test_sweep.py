"""The sweep end to end on 2 CPU ranks over gloo: gate, time, store, resume, select, lookup."""

from __future__ import annotations

import pytest

from a2a_tune.db import open_store
from a2a_tune.kernels import get_backend
from a2a_tune.tuner.runtime.lookup import load_profile, lookup
from a2a_tune.tuner.runtime.table import to_dict
from a2a_tune.tuner.select import profile_from_store, write_profile
from a2a_tune.tuner.shapes import ModelShape
from a2a_tune.tuner.sweep import SweepPlan, sweep

BACKENDS = ("allgather_reducescatter", "nccl_all2allv", "planted_off_by_one", "planted_crash", "planted_unavailable")
PLAN = SweepPlan(
    shapes=(ModelShape("tiny", 16, 4, 32), ModelShape("odd", 6, 2, 24)),
    tokens=(4, 16),
    ep_sizes=(2,),
    backends=BACKENDS,
    warmup=1,
    iters=4,
    input_sets=2,
)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """One sweep, marked interrupted (as a killed sweep leaves it), then resumed."""
    url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'sweep.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("A2A_TUNE_BACKEND_MODULES", "planted_backends")
        first = sweep(PLAN, device_type="cpu", world_size=2, db_url=url, progress=False)
        with open_store(url) as store:
            store.finish_run(first.run_id, "interrupted")
        resumed = sweep(PLAN, device_type="cpu", world_size=2, db_url=url, resume=True, progress=False)
    return url, first, resumed


def test_good_backends_are_measured_for_every_case(swept):
    url, first, _ = swept
    assert first.status == "completed"
    assert first.fingerprint.startswith("cpu-")
    assert first.measured == 2 * 2 * 2  # shapes x tokens x good backends
    with open_store(url) as store:
        rows = store.measurements(first.run_id)
        assert {(m.backend, m.hidden, m.tokens_per_rank) for m in rows} == {
            (b, h, t) for b in BACKENDS[:2] for h in (32, 24) for t in (4, 16)
        }
        for m in rows:
            assert m.n == 4 and len(m.samples) == 4
            assert 0 < m.p10_us <= m.median_us <= m.p90_us
            assert m.host_median_us > 0 and m.ep_size == 2 and m.dtype == "bf16" and m.timing == "eager"
            # beside the round trip: the halves timed apart, the bytes the inputs moved; no device memory on CPU
            f = m.figure
            assert len(f("dispatch_samples")) == len(f("combine_samples")) == 4
            assert f("dispatch_us") > 0 and f("combine_us") > 0
            row = m.hidden * 2  # bf16
            assert m.tokens_per_rank * row <= f("dispatch_logical_bytes") <= 2 * m.tokens_per_rank * row
            assert 0 < f("dispatch_link_bytes") <= m.tokens_per_rank * row
            assert (f("combine_logical_bytes"), f("combine_link_bytes")) == (
                f("dispatch_logical_bytes"),
                f("dispatch_link_bytes"),
            )
            assert f("workspace_bytes") is None


def test_broken_backends_are_recorded_with_their_reason_and_never_timed(swept):
    url, first, _ = swept
    with open_store(url) as store:
        failures = store.failures(first.run_id)
    by = {(f.backend, f.kind) for f in failures}
    assert ("planted_off_by_one", "incorrect") in by
    assert ("planted_crash", "error") in by
    assert ("planted_unavailable", "unavailable") in by
    crash = next(f for f in failures if f.backend == "planted_crash")
    assert "planted failure: kernel image not found" in crash.reason
    unavailable = next(f for f in failures if f.backend == "planted_unavailable")
    assert unavailable.reason == "package planted_ext not installed" and unavailable.tokens_per_rank is None
    assert first.unavailable == {"planted_unavailable": "package planted_ext not installed"}


def test_resume_continues_the_same_run_and_repeats_nothing(swept):
    url, first, resumed = swept
    assert resumed.run_id == first.run_id
    assert resumed.status == "completed"
    assert resumed.measured == 0
    # every measured case and every case-level failure is skipped
    assert resumed.skipped == first.measured + 2 * 2 * 2
    with open_store(url) as store:
        assert len(store.measurements(first.run_id)) == first.measured
        assert store.get_run(first.run_id).status == "completed"


def test_a_resumed_run_keeps_its_first_start_and_records_its_resume(swept):
    """Issue 37: a run is dated from its sweep's start, before its ranks started (not when they
    opened it); --resume keeps that start and records when the resuming sweep began."""
    url, first, _ = swept
    with open_store(url) as store:
        run = store.get_run(first.run_id)
    assert run.launched_at < run.started_at < run.resumed_at < run.finished_at


def test_a_completed_run_is_not_resumed_but_measured_anew(swept):
    url, first, _ = swept
    again = sweep(
        SweepPlan(shapes=PLAN.shapes[:1], tokens=(4,), ep_sizes=(2,), backends=BACKENDS[:1], warmup=1, iters=2),
        device_type="cpu",
        world_size=2,
        db_url=url,
        resume=True,
        progress=False,
    )
    assert again.run_id != first.run_id and again.measured == 1


def test_profile_from_the_sweep_selects_only_correct_backends(swept, tmp_path):
    url, first, _ = swept
    names = {n: {"engines": get_backend(n).engine_names} for n in BACKENDS[:2]}
    with open_store(url) as store:
        profile = profile_from_store(store, first.run_id, backend_names=names)
    path = write_profile(profile, tmp_path)
    loaded = load_profile(path)
    assert loaded is not None
    profile = to_dict(profile)
    assert len(profile["entries"]) == 2
    for entry in profile["entries"]:
        assert "planted_off_by_one" in entry["failed"]
        assert {w["backend"] for w in entry["winners"]} <= set(BACKENDS[:2])
        for curve in (entry["backends"][b] for b in BACKENDS[:2]):
            assert None not in curve["dispatch_us"] + curve["combine_us"] + curve["dispatch_logical_bytes"]
            assert "workspace_mib" not in curve  # not measured on CPU ranks: no array
    choice = lookup(ep_size=2, hidden=32, topk=4, num_experts=16, tokens=8, profile=path)
    assert choice.match == "exact"
    assert choice.backend in BACKENDS[:2]
    assert set(choice.expected_us) == set(BACKENDS[:2])


def test_adaptive_sweep_measures_fewer_points_and_still_covers_both_ends(tmp_path):
    url = f"sqlite:///{tmp_path / 'adaptive.db'}"
    plan = SweepPlan(
        shapes=(ModelShape("tiny", 16, 4, 32),),
        tokens=(1, 2, 4, 8, 16, 32, 64, 128, 256),
        ep_sizes=(2,),
        backends=BACKENDS[:2],
        warmup=1,
        iters=3,
        input_sets=1,
        adaptive=True,
    )
    outcome = sweep(plan, device_type="cpu", world_size=2, db_url=url, progress=False)
    assert outcome.status == "completed"
    grid = len(plan.tokens) * 2
    assert outcome.measured + outcome.adaptive_saved == grid
    assert outcome.measured < grid
    with open_store(url) as store:
        points = {(m.backend, m.tokens_per_rank) for m in store.measurements(outcome.run_id)}
    for b in BACKENDS[:2]:
        assert {(b, 1), (b, 256)} <= points  # the ends decide the drops: always measured


def test_a_sweep_on_four_ranks_writes_an_ep4_table(tmp_path):
    url = f"sqlite:///{tmp_path / 'w4.db'}"
    plan = SweepPlan(
        shapes=(ModelShape("tiny", 16, 4, 32),),
        tokens=(2, 8),
        ep_sizes=(4,),
        backends=BACKENDS[:2],
        warmup=1,
        iters=3,
        input_sets=1,
    )
    outcome = sweep(plan, device_type="cpu", world_size=4, db_url=url, progress=False)
    assert (outcome.status, outcome.measured) == ("completed", 4)
    names = {n: {"engines": get_backend(n).engine_names} for n in BACKENDS[:2]}
    with open_store(url) as store:
        assert {m.ep_size for m in store.measurements(outcome.run_id)} == {4}
        profile = profile_from_store(store, outcome.run_id, backend_names=names)
    path = write_profile(profile, tmp_path)
    assert lookup(ep_size=4, hidden=32, topk=4, num_experts=16, tokens=4, profile=path).match == "exact"
    assert lookup(ep_size=2, hidden=32, topk=4, num_experts=16, tokens=4, profile=path, quiet=True).match != "exact"


def test_capacity_builds_fixed_capacity_backends_for_that_many_tokens(tmp_path):
    import knob_backends  # noqa: F401  (tests/support: registers capacity_reporter here; the ranks load it by env)

    url = f"sqlite:///{tmp_path / 'capacity.db'}"
    common = dict(
        shapes=(ModelShape("tiny", 16, 4, 32),),
        tokens=(1, 4),
        ep_sizes=(2,),
        backends=("capacity_reporter",),
        warmup=0,
        iters=2,
        input_sets=1,
    )
    built = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("A2A_TUNE_BACKEND_MODULES", "knob_backends")
        for capacity in (None, 64):
            outcome = sweep(
                SweepPlan(**common, capacity=capacity), device_type="cpu", world_size=2, db_url=url, progress=False
            )
            with open_store(url) as store:
                built[capacity] = {
                    m.tokens_per_rank: (m.knobs["built_for_tokens"], m.knobs["step_tokens"])
                    for m in store.measurements(outcome.run_id)
                }
    assert built[None] == {1: (1, 1), 4: (4, 4)}  # default: each token count's own capacity
    # an engine's capacity at every load; each step told its size, as engines tell them
    assert built[64] == {1: (64, 1), 4: (64, 4)}


def test_refinement_measures_between_grid_points_where_the_winner_changes(tmp_path):
    # stepped wins up to 20 tokens, flat above (tests/support/stepped_backends.py); the grid
    # 16, 64 only says the change is somewhere between them
    url = f"sqlite:///{tmp_path / 'refine.db'}"
    names = ("sleeps_stepped", "sleeps_flat", "sleeps_long")
    plan = SweepPlan(
        shapes=(ModelShape("tiny", 16, 4, 32),),
        tokens=(16, 64),
        ep_sizes=(2,),
        backends=names,
        warmup=0,
        iters=2,
        input_sets=1,
        refine_ratio=1.2,
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("A2A_TUNE_BACKEND_MODULES", "stepped_backends")
        outcome = sweep(plan, device_type="cpu", world_size=2, db_url=url, progress=False)
        with open_store(url) as store:
            store.finish_run(outcome.run_id, "interrupted")  # as a killed sweep leaves it
        resumed = sweep(plan, device_type="cpu", world_size=2, db_url=url, resume=True, progress=False)
    assert outcome.status == "completed"
    with open_store(url) as store:
        points = {(m.backend, m.tokens_per_rank) for m in store.measurements(outcome.run_id)}
        profile = profile_from_store(store, outcome.run_id, backend_names={n: {} for n in names})
    refined = {t for _, t in points} - set(plan.tokens)
    assert refined and all(16 < t < 64 for t in refined)
    # every backend at every refinement count, the never-competitive one too: no gaps in the table
    assert {(b, t) for b in names for t in refined} <= points
    (entry,) = to_dict(profile)["entries"]
    assert all(v is not None for b in names for v in entry["backends"][b]["median_us"])
    winners = {w["tokens"]: w["backend"] for w in entry["winners"]}
    last_stepped = max(t for t, b in winners.items() if b == "sleeps_stepped")
    first_flat = min(t for t, b in winners.items() if b == "sleeps_flat")
    assert last_stepped <= 20 < first_flat and first_flat / last_stepped <= 1.2  # the step, pinned
    assert outcome.measured == len(points)  # nothing measured twice
    # resumed: the stored refinement points are the search's answers; nothing is measured again
    assert (resumed.run_id, resumed.measured, resumed.skipped) == (outcome.run_id, 0, len(points))
