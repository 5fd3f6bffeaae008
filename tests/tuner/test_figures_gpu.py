"""The figures beside the round trip, checked on one GPU against what was planted
(tests/support/known_backends.py): dispatch and combine of known durations, in eager and graph
mode, through the sweep's own `measure` at world 1; and known bytes held through torch's caching
allocator, a raw cudaMalloc and torch symmetric memory, through `measure_case` to the table's
`workspace_mib`. One rank measures everything once (a module fixture); each test reads its part.

With A2A_TUNE_FIGURES_OUT=path the measured numbers are written there as JSON
(scripts/device_run.sh does, for BENCHMARKS.md)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from a2a_tune.kernels import MoEShape
from a2a_tune.tuner.launch import run_ranks

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SHAPE = MoEShape(64, 8, 4096, 256, "bf16")
TOKENS = 256
# µs planted at the end of dispatch and of combine: 50, 200 and 1600 µs each in both halves, the
# larger spin on one side then on the other; each half must come out within 5% of its spin
PLANTED = {"base": (0.0, 0.0), "1600/200": (1600.0, 200.0), "200/1600": (200.0, 1600.0)}
PLANTED |= {"200/50": (200.0, 50.0), "50/200": (50.0, 200.0)}
TAIL, TAIL_COMBINE = 3200.0, 1600.0  # µs of dispatch left on a side stream; combine's own spin meanwhile
MIB = 2**20
GRANULE = 2 * MIB  # torch's caching allocator rounds large blocks to 2 MiB; the driver maps 2 MiB pages


def _medians(r) -> dict:
    from a2a_tune.tuner.timing import summarize

    assert r.kind == "measured", (r.kind, r.reason)
    return {
        "mode": r.timing,
        "round_trip": r.median_us,
        "host": summarize(r.host_us).median_us,
        "dispatch": r.dispatch_median_us,
        "combine": r.combine_median_us,
    }


def _measure_all(ctx) -> dict:
    import known_backends as kb

    from a2a_tune.tuner.measure import Backends, input_sets, measure, measure_case
    from a2a_tune.tuner.select import _table_figures
    from a2a_tune.tuner.timing import unsplit_reason

    out: dict = {"spin_ratio": kb.calibrate(), "held_bytes": kb.HELD_BYTES, "planted": PLANTED}
    out |= {"timing": {}, "memory": {}, "absent": {}}
    with Backends(ctx, SHAPE) as built:
        inputs = input_sets(ctx, SHAPE, TOKENS, sets=3)
        for name, modes in (
            ("planted_sleeps_host_read", ("eager",)),
            ("planted_sleeps_capturable", ("eager", "graph")),
        ):
            backend = built.get(name, TOKENS)
            for mode in modes:
                if why := unsplit_reason(backend, graph=mode == "graph"):
                    out["absent"][f"{name} ({mode})"] = why
                for label, (d, c) in PLANTED.items():
                    backend.dispatch_sleep_us, backend.combine_sleep_us = d, c
                    r = measure(ctx, backend, inputs, warmup=5, iters=25, timing=mode)
                    out["timing"][f"{name}/{mode}/{label}"] = _medians(r)
        backend = built.get("planted_tail_overlap", TOKENS)
        for mode in ("eager", "graph"):
            for label, (tail, c) in {"base": (0.0, 0.0), "tail": (TAIL, TAIL_COMBINE)}.items():
                backend.tail_us, backend.combine_sleep_us = tail, c
                r = measure(ctx, backend, inputs, warmup=5, iters=25, timing=mode)
                out["timing"][f"planted_tail_overlap/{mode}/{label}"] = _medians(r)
        for name in ("allgather_reducescatter_padded", "planted_holds_torch", "planted_holds_cudamalloc"):
            out["memory"][name] = _held(ctx, built, name, inputs, measure_case, _table_figures)
        out["memory"]["planted_holds_symmetric"] = _held(
            ctx, built, "planted_holds_symmetric", inputs, measure_case, _table_figures
        )
    return out


def _held(ctx, built, name, inputs, measure_case, table_figures) -> dict:
    """The bytes `measure_case` stores for `name` and the table's MiB, or why there are none."""
    try:
        r = measure_case(ctx, built, name, TOKENS, inputs, warmup=2, iters=3)
    except Exception as exc:  # e.g. CuPy missing: reported, the test says so
        return {"error": f"{type(exc).__name__}: {exc}"}
    if not r.ok:
        return {"error": f"{r.kind}: {r.reason}"}
    from a2a_tune.tuner.runtime.measurement import MeasurementKey
    from a2a_tune.tuner.runtime.point import Point

    point = Point(ctx.world_size, SHAPE.hidden, SHAPE.topk, SHAPE.num_experts, SHAPE.dtype, "uniform", TOKENS)
    m = r.measurement(MeasurementKey.of(name, point))  # as the sweep stores it, and select writes it
    return {"bytes": r.workspace_bytes, "mib": table_figures(m).get("workspace_mib")}


@pytest.fixture(scope="module")
def measured() -> dict:
    (got,) = run_ranks(_measure_all, 1, "cuda")
    if path := os.environ.get("A2A_TUNE_FIGURES_OUT"):
        with open(path, "w") as f:
            json.dump(got, f, indent=1)
    return got


def _added(measured, name, mode) -> dict:
    """Per planting: (dispatch, combine) above the base's, what the planted spins added."""
    t = measured["timing"]
    base = t[f"{name}/{mode}/base"]
    return {
        label: tuple(t[f"{name}/{mode}/{label}"][half] - base[half] for half in ("dispatch", "combine"))
        for label in PLANTED
        if label != "base"
    }


CASES = [("planted_sleeps_capturable", "eager"), ("planted_sleeps_capturable", "graph")]


def test_an_eager_dispatch_that_reads_the_host_is_not_split(measured):
    """timing.unsplit_reason: the host-read backend's eager round trips are measured, its halves
    absent at every planting, with the reason the figures JSON carries (device_summary.py)."""
    from a2a_tune.tuner.timing import HOST_READ_UNSPLIT

    assert measured["absent"] == {"planted_sleeps_host_read (eager)": HOST_READ_UNSPLIT}
    for label, (d, c) in PLANTED.items():
        m = measured["timing"][f"planted_sleeps_host_read/eager/{label}"]
        assert m["dispatch"] is None and m["combine"] is None, m
        assert m["round_trip"] > d + c, m


@pytest.mark.parametrize("name, mode", CASES)
def test_each_half_gains_the_spin_planted_in_it_within_5_percent(measured, name, mode):
    """50, 200 and 1600 µs in each half, the larger on either side: within 5% of what was
    planted, eagerly as under graph replay, with no allowance added (a swap, 4x or 8x, and a
    host gap of tens of µs at 50 µs both fail it)."""
    for label, got in _added(measured, name, mode).items():
        for half, added, planted in zip(("dispatch", "combine"), got, PLANTED[label]):
            assert added == pytest.approx(planted, rel=0.05), (label, half, got)


@pytest.mark.parametrize("name, mode", CASES)
def test_dispatch_plus_combine_is_the_round_trip_plus_what_the_cut_adds(measured, name, mode):
    """timing.py: graph, the two event nodes a round trip (a few µs); eager, each half alone on
    a head start, its device work: at most the round trip, at least its device part."""
    for label in PLANTED:
        m = measured["timing"][f"{name}/{mode}/{label}"]
        total, rt = m["dispatch"] + m["combine"], m["round_trip"]
        if mode == "graph":
            assert rt * 0.97 <= total <= rt * 1.03 + 10.0, m
        else:
            assert rt * 0.97 - m["host"] <= total <= rt * 1.03 + 10.0, m


def test_a_dispatch_tail_overlapping_combine_is_split_as_timing_says(measured):
    """timing.py: a dispatch's tail left running on a side stream is charged to combine under graph
    replay (the event orders only its stream; the sum stays the round trip) and to neither half
    eagerly (it runs out during the drain between the halves; the round trip carries it)."""
    t = measured["timing"]
    for mode in ("eager", "graph"):
        base, m = t[f"planted_tail_overlap/{mode}/base"], t[f"planted_tail_overlap/{mode}/tail"]
        dispatch, combine = m["dispatch"] - base["dispatch"], m["combine"] - base["combine"]
        assert abs(dispatch) < 0.05 * TAIL, (mode, m, base)
        assert m["round_trip"] >= TAIL, (mode, m)
        if mode == "eager":  # the tail in neither half: dispatch as without it, combine its own spin
            assert combine == pytest.approx(TAIL_COMBINE, rel=0.05), (m, base)
        else:
            assert m["round_trip"] - base["round_trip"] == pytest.approx(TAIL, rel=0.05), (m, base)
            assert combine == pytest.approx(TAIL, rel=0.05), (m, base)
            assert m["dispatch"] + m["combine"] <= m["round_trip"] * 1.03 + 10.0, m


@pytest.mark.parametrize("name", ["planted_holds_torch", "planted_holds_cudamalloc", "planted_holds_symmetric"])
def test_the_memory_figure_is_the_bytes_held(measured, name):
    """Within one 2 MiB granule above what was planted (the block torch rounds to, the page the
    driver maps; symmetric memory: a granule for its signal pad besides), over the base backend."""
    got, base = measured["memory"][name], measured["memory"]["allgather_reducescatter_padded"]
    if "error" in got and "cupy" in got["error"].lower() and name == "planted_holds_cudamalloc":
        pytest.skip(f"no raw cudaMalloc here: {got['error']}")
    assert "error" not in got and "error" not in base, (got, base)
    assert base["bytes"] < GRANULE, base  # the base backend allocates per call: nothing held
    slack = 2 * GRANULE if name == "planted_holds_symmetric" else GRANULE
    assert 0 <= got["bytes"] - measured["held_bytes"] < slack, got
    assert got["mib"] == round(got["bytes"] / MIB, 3)  # what the table stores
