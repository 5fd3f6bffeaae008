"""nvlink_one_sided and nvlink_low_latency as shipped, on CPU: each rank a process, the Triton
kernels under TRITON_INTERPRET, torch symmetric memory emulated by shared files
(tests/support/emulate_nvlink.py). One launch of 8 ranks runs every world size, each on a gloo
subgroup of its own.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("triton")

from emulate_nvlink import NVLINK, RoundTrips, World, emulate  # noqa: E402
from invariant_cases import Case  # noqa: E402

from a2a_tune.kernels import get_backend  # noqa: E402
from a2a_tune.kernels.reference import TOLERANCE  # noqa: E402
from a2a_tune.tuner.launch import run_ranks  # noqa: E402

SMALL_BLOCKS = {
    "row_block_bytes": 2048,  # rows copied in several steps (N_HB > 1)
    "recv_block_h": 512,  # combine_recv over several H blocks
    "recv_block_rows": 16,  # low latency: dispatch_recv over several row blocks
    "send_num_warps": 1,
    "recv_num_warps": 8,
}
LARGE_BLOCKS = {"row_block_bytes": 32768, "recv_block_h": 4096, "recv_block_rows": 256, "send_num_warps": 16}
# the backend is filled in per NVLink backend ("planted_": its planted bug); the world size is len(tokens)
BASE = [
    Case("w2-fp32", "", (3, 2), experts=8, topk=2, hidden=16),
    Case("w2-bf16-odd-hidden", "", (4, 5), experts=8, topk=3, hidden=33, dtype="bf16"),
    Case("w2-zero-tokens", "", (0, 4), experts=8, topk=2, hidden=8),
    Case("w2-fp8-block-scales", "", (3, 2), experts=8, topk=2, hidden=256, dtype="fp8_e4m3"),
    Case("w2-knobs-small-blocks", "", (5, 3), experts=8, topk=2, hidden=1100, repeats=2, knobs=SMALL_BLOCKS),
    Case("w2-knobs-fp8", "", (3, 2), experts=8, topk=2, hidden=2176, dtype="fp8_e4m3", knobs=SMALL_BLOCKS),
    Case("w2-more-tokens-than-the-step", "", (5, 5), experts=8, topk=2, hidden=8, capacity=8, step=4),
    Case("w3-skewed", "", (5, 1, 3), experts=12, topk=3, hidden=8, routing="skewed"),
    Case("w3-all-local", "", (2, 2, 2), experts=12, topk=2, hidden=8, routing="local"),
    Case("w3-fp8-odd-hidden", "", (2, 0, 3), experts=6, topk=2, hidden=136, dtype="fp8_e4m3"),
    Case("w3-knobs-bf16-large-blocks", "", (2, 0, 3), experts=6, topk=2, hidden=40, dtype="bf16", knobs=LARGE_BLOCKS),
    Case("w4-bf16", "", (2, 3, 0, 1), experts=16, topk=4, hidden=8, dtype="bf16"),
    # EP 8, an HGX node: every rank a peer of every other
    Case("w8-skewed", "", (3, 0, 1, 2, 4, 1, 0, 2), experts=16, topk=4, hidden=8, routing="skewed"),
    Case("w8-fp8", "", (1, 2, 0, 1, 1, 2, 1, 1), experts=32, topk=8, hidden=128, dtype="fp8_e4m3"),
    Case("w2-planted-off-by-one-slot", "planted_", (4, 4), experts=8, topk=2, hidden=8),
]
CASES = [
    replace(
        c,
        id=f"{b}-{c.id}",
        backend=c.backend + b,
        knobs={k: v for k, v in c.knobs.items() if k in get_backend(b).knob_space},
    )
    for b in NVLINK
    for c in BASE
]
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
