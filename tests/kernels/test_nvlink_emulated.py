"""nvlink_one_sided and nvlink_low_latency as shipped, on CPU: each rank a process, the Triton
kernels under TRITON_INTERPRET, torch symmetric memory emulated by shared files
(tests/support/emulate_nvlink.py). One launch of 8 ranks runs every world size, each on a gloo
subgroup of its own.
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from emulate_nvlink import NVLINK, RoundTrips, World, emulate  # noqa: E402
from invariant_cases import Case  # noqa: E402
from nvlink_cases import BASE, per_backend  # noqa: E402

from a2a_tune.kernels.reference import TOLERANCE  # noqa: E402
from a2a_tune.tuner.launch import run_ranks  # noqa: E402

# the shared cases, and a planted bug that only these ranks register
CASES = per_backend([*BASE, Case("w2-planted-off-by-one-slot", "planted_", (4, 4), experts=8, topk=2, hidden=8)])
# back to back, no host synchronisation between round trips; with a workspace larger than the
# step (an engine's capacity) and the step changing between rounds (set_step_tokens)
TRIPS = [
    *(RoundTrips(f"{b}-w2-repeated", b, (3, 4), steps=(None,) * 4) for b in NVLINK),
    *(RoundTrips(f"{b}-w2-zero-tokens-repeated", b, (0, 3), steps=(None,) * 3) for b in NVLINK),
    *(RoundTrips(f"{b}-w2-step-below-capacity", b, (3, 2), steps=(4, 3, 8), hidden=16, capacity=12) for b in NVLINK),
    RoundTrips(
        "nvlink_one_sided-w3-fp8-step-below-capacity",
        "nvlink_one_sided",
        (2, 0, 3),
        steps=(3, 5),
        experts=6,
        hidden=128,
        dtype="fp8_e4m3",
        capacity=9,
    ),
]
WORLDS = (2, 3, 4, 8)


@pytest.fixture(scope="module")
def emulated(tmp_path_factory) -> dict[int, list[dict]]:
    """World size -> every rank's results, by rank: one launch of 8 ranks runs every size."""
    worlds = [
        World(
            size,
            [c for c in CASES if len(c.tokens) == size],
            [t for t in TRIPS if len(t.tokens) == size],
            ["nvlink_one_sided"] if size == 2 else [],  # the step-sized backend's handle
        )
        for size in WORLDS
    ]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        ranks = run_ranks(emulate, max(WORLDS), "cpu", str(tmp_path_factory.mktemp("symm")), worlds)
    return {size: sorted((r[size] for r in ranks if size in r), key=lambda r: r["rank"]) for size in WORLDS}


@pytest.mark.parametrize(
    "case", [c for c in CASES if "planted" not in c.id and "than-the-step" not in c.id], ids=lambda c: c.id
)
def test_the_backends_satisfy_the_invariant(emulated, case):
    ok, err, reason, _ = emulated[len(case.tokens)][0]["invariant"][case.id]
    assert ok, reason
    assert err <= TOLERANCE[case.dtype]


@pytest.mark.parametrize("backend", NVLINK)
def test_a_planted_slot_bug_fails_the_invariant(emulated, backend):
    ok, err, _, crashed = emulated[2][0]["invariant"][f"{backend}-w2-planted-off-by-one-slot"]
    assert not ok and not crashed and err > 0.1


@pytest.mark.parametrize("backend", NVLINK)
def test_more_tokens_than_the_step_is_a_one_line_error(emulated, backend):
    ok, _, reason, crashed = emulated[2][0]["invariant"][f"{backend}-w2-more-tokens-than-the-step"]
    assert not ok and crashed
    assert reason == "5 tokens exceed this step's 4 (set_step_tokens)"


@pytest.mark.parametrize("trips", TRIPS, ids=lambda t: t.id)
def test_round_trips_without_host_barriers(emulated, trips):
    shape, world = trips.shape(), len(trips.tokens)
    for rank, rounds in enumerate(r["trips"][trips.id] for r in emulated[world]):
        assert len(rounds) == len(trips.steps)
        for step, (rows, local, err) in zip(trips.steps, rounds):
            assert local, f"rank {rank}: ids of other ranks' experts"
            assert err <= TOLERANCE[shape.dtype], f"rank {rank}, step {step}: relative error {err:.3g}"
            if trips.backend == "nvlink_one_sided":  # step-sized: W x step rows, not W x capacity
                assert rows == world * (step or shape.max_tokens_per_rank)
            else:  # expert-major: every local expert's W x capacity slots
                assert rows == shape.experts_per_rank(world) * world * shape.max_tokens_per_rank


def test_a_step_change_between_dispatch_and_combine_is_refused(emulated):
    for r in emulated[2]:
        assert r["mid_trip"]["nvlink_one_sided"] == "set_step_tokens changed between dispatch (2) and combine (3)"


@pytest.mark.parametrize("world", WORLDS)
def test_every_world_size_ran_all_its_cases_on_its_own_ranks(emulated, world):
    assert [r["rank"] for r in emulated[world]] == list(range(world))
    assert {c.id for c in CASES if len(c.tokens) == world} == set(emulated[world][0]["invariant"])
