"""Choosing the backend (runtime/lookup.py): shape matching, log-log token interpolation,
engines' literals, phases and workloads, the request's rules, what a lookup prints, and the
"never crash the engine" promise. Which table is found: test_profiles.py; the table model:
test_table.py. The fixture table's curves: tests/support/lookups.py."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lookups import FIXTURE, FIXTURES, FP, A, B, fixture_data, variant, warnings_of, write

from a2a_tune.tuner.cli.lookup import request_words
from a2a_tune.tuner.runtime import lookup as lk
from a2a_tune.tuner.runtime.lookup import (
    FALLBACK_BACKEND,
    Choice,
    LookupRequest,
    RequestError,
    clear_cache,
    lookup,
    request,
)
from a2a_tune.tuner.runtime.point import Shape

# -------------------------------------------------- exact shape, interpolation, clamping


def test_exact_shape_on_a_measured_token_count(fixture_dir, caplog):
    c = lookup(fingerprint=FP, tokens=64, **A)
    assert (c.backend, c.match) == ("nvlink_one_sided", "exact")
    assert c.reason.startswith(
        f"profile {FP}.json, exact shape, at 64 tokens/rank (measured): nvlink_one_sided 50.000 us"
    )
    assert c.source == str(FIXTURES / f"{FP}.json")
    assert dict(c.expected_us) == {"allgather_reducescatter": 100.0, "nccl_all2allv": 75.0, "nvlink_one_sided": 50.0}
    assert c.entry_shape._asdict() == A
    assert warnings_of(caplog) == []


def test_interpolation_beats_nearest_bucket(fixture_dir):
    """At 200 tokens the nearest bucket (256) says nccl_all2allv (190 < 195 us), but the
    curves only cross at ~234 tokens: log-log interpolation correctly keeps nvlink_one_sided."""
    winners_256 = [w for w in fixture_data()["entries"][1]["winners"] if w["tokens"] == 256]
    assert winners_256[0]["backend"] == "nccl_all2allv"  # what a nearest-bucket rule would pick
    assert winners_256[0]["tie"]  # 195 is inside 190's [186.2, 195.7]

    c = lookup(fingerprint=FP, tokens=200, **A)
    assert (c.backend, c.tie) == ("nvlink_one_sided", False)
    assert "interpolated at 200 tokens/rank between 64 and 256" in c.reason
    f = math.log(200 / 64) / math.log(256 / 64)
    assert c.expected_us["nvlink_one_sided"] == pytest.approx(50 * (195 / 50) ** f, abs=1e-3)
    assert c.expected_us["nccl_all2allv"] == pytest.approx(75 * (190 / 75) ** f, abs=1e-3)
    assert dict(c.timing) == {"allgather_reducescatter": "eager", "nccl_all2allv": "eager", "nvlink_one_sided": "graph"}
    assert "[timing: allgather_reducescatter eager, nccl_all2allv eager, nvlink_one_sided graph]" in c.reason

    # Past the crossover (~234 tokens) nccl_all2allv is faster.
    assert lookup(fingerprint=FP, tokens=240, **A).backend == "nccl_all2allv"
    # Right at it the two are within nvlink_one_sided's p10..p90 spread: a tie, settled by
    # the tie preference (nccl_all2allv is registered before nvlink_one_sided).
    c = lookup(fingerprint=FP, tokens=230, **A)
    assert c.expected_us["nvlink_one_sided"] < c.expected_us["nccl_all2allv"]
    assert (c.backend, c.tie) == ("nccl_all2allv", True)
    assert c.regret == pytest.approx(c.expected_us["nccl_all2allv"] / c.expected_us["nvlink_one_sided"] - 1, abs=1e-4)
    assert "preferring nccl_all2allv (tie preference)" in c.reason


def test_clamps_above_the_measured_range_and_refuses_outside_the_token_bound(fixture_dir):
    for tokens in (0, 2**20 + 1):  # the point's one bound (1..2^20), as the CLI, store and table hold it
        c = lookup(fingerprint=FP, tokens=tokens, quiet=True, **A)
        assert c.match == "fallback" and f"tokens per rank must be in 1..1048576, got {tokens}" in c.reason

    hi = lookup(fingerprint=FP, tokens=100_000, **A)
    assert hi.backend == "nccl_all2allv"
    assert "clamped to 1024 tokens/rank (requested 100000)" in hi.reason
    # nvlink_one_sided was not measured at 1024 (timeout): it does not compete beyond 256.
    assert dict(hi.expected_us) == {"allgather_reducescatter": 1500.0, "nccl_all2allv": 420.0}


@pytest.mark.parametrize(
    "shape, problem",
    [
        (dict(A, topk=9, num_experts=8), "topk 9 is more than the 8 experts"),
        (dict(A, hidden=10**9), "hidden must be in 1..65536, got 1000000000"),
        (dict(A, num_experts=10**9), "num_experts must be in 1..4096, got 1000000000"),
    ],
)
def test_an_impossible_shape_is_refused_not_answered_by_the_nearest(shape, problem, fixture_dir, caplog):
    c = lookup(fingerprint=FP, tokens=64, **shape)
    assert (c.backend, c.match) == (FALLBACK_BACKEND, "fallback")
    assert c.reason.startswith(f"invalid lookup shape: {problem}")
    (rec,) = warnings_of(caplog)
    assert problem in rec.getMessage()


def test_uneven_experts_are_a_valid_request(fixture_dir):
    # engines run experts that do not divide over the ranks (TensorRT-LLM): answered, not refused
    assert lookup(fingerprint=FP, tokens=64, **dict(A, num_experts=A["num_experts"] + 1)).match == "nearest-shape"


def test_backend_missing_a_neighbour_does_not_compete(fixture_dir):
    c = lookup(fingerprint=FP, tokens=512, **A)
    assert "nvlink_one_sided" not in c.expected_us
    assert c.backend == "nccl_all2allv"


@pytest.mark.parametrize("tokens", [0, 1, 3, 64, 200, 1024, 5000])
def test_failed_backend_never_competes(fixture_dir, tokens):
    c = lookup(fingerprint=FP, tokens=tokens, **A)
    assert "flashinfer_nvlink_one_sided" not in c.expected_us
    assert c.backend != "flashinfer_nvlink_one_sided"


# ------------------------------------------------------------------------------- engines


def test_engine_literals_come_from_the_profile(tmp_path, monkeypatch):
    c = lookup(profile=FIXTURE, tokens=1, **B)
    assert (c.backend, c.engines["vllm"], c.engines["sglang"]) == (
        "allgather_reducescatter",
        "allgather_reducescatter",
        None,
    )
    c = lookup(profile=FIXTURE, tokens=1024, **B)
    assert (c.backend, c.engines["vllm"], c.engines["sglang"]) == ("nccl_all2allv", None, None)

    data = fixture_data()
    data["backends"]["nccl_all2allv"] = {"engines": {"vllm": "deepep_high_throughput", "sglang": "deepep"}}
    c = lookup(profile=write(tmp_path, data), tokens=1024, **B)
    assert (c.engines["vllm"], c.engines["sglang"]) == ("deepep_high_throughput", "deepep")


def test_engine_restricts_to_backends_it_can_name(tmp_path, caplog):
    # nvlink_one_sided wins shape A at 64 tokens but vLLM has no literal for it.
    assert lookup(profile=FIXTURE, tokens=64, **A).backend == "nvlink_one_sided"
    c = lookup(profile=FIXTURE, tokens=64, engine="vllm", **A)
    assert (c.backend, c.engines["vllm"], c.match) == ("allgather_reducescatter", "allgather_reducescatter", "exact")
    assert set(c.expected_us) == {"allgather_reducescatter"}

    data = fixture_data()
    data["backends"]["nccl_all2allv"]["engines"]["vllm"] = "deepep_high_throughput"
    c = lookup(profile=write(tmp_path, data), tokens=64, engine="vllm", **A)
    assert (c.backend, c.engines["vllm"]) == ("nccl_all2allv", "deepep_high_throughput")

    # A literal the engine does not accept (a typo, or one from a newer engine) never
    # competes for that engine: `--format vllm` can only print what vLLM accepts.
    for bogus in ("deepep_lowlatency", "pplx", "naive"):
        data["backends"]["nccl_all2allv"]["engines"]["vllm"] = bogus
        clear_cache()
        c = lookup(profile=write(tmp_path, data), tokens=64, engine="vllm", **A)
        assert c.backend == "allgather_reducescatter", bogus

    # SGLang has a literal for none of the competing backends in the fixture.
    c = lookup(profile=FIXTURE, tokens=64, engine="sglang", **A)
    assert (
        c.match == "fallback" and "no usable backend that SGLang accepts (unavailable: deepep_low_latency)" in c.reason
    )
    c = lookup(profile=FIXTURE, tokens=64, engine="tgi", **A)
    assert c.match == "fallback" and "engine='tgi'" in c.reason
    assert len(warnings_of(caplog)) == 2


def test_trtllm_gets_the_fastest_method_it_has_and_its_rule_for_uneven_experts(tmp_path):
    # Shape A at 64 tokens: nvlink_one_sided 50 us (no TensorRT-LLM method), nccl_all2allv 75,
    # allgather_reducescatter 100. As for vLLM, the fastest backend TensorRT-LLM can be told wins.
    data = fixture_data()
    data["backends"]["allgather_reducescatter"]["engines"]["trtllm"] = "ALLGATHER"
    data["backends"]["nccl_all2allv"]["engines"]["trtllm"] = "NVLINK_TWO_SIDED"
    path = write(tmp_path, data)
    c = lookup(profile=path, tokens=64, engine="trtllm", **A)
    assert (c.backend, c.engines["trtllm"], c.match) == ("nccl_all2allv", "NVLINK_TWO_SIDED", "exact")
    assert set(c.expected_us) == {"allgather_reducescatter", "nccl_all2allv"}
    assert lookup(profile=path, tokens=64, **A).backend == "nvlink_one_sided"  # without an engine: untouched
    # Experts that do not divide over the ranks: TensorRT-LLM refuses a forced NVLINK_TWO_SIDED.
    even = dict(A, num_experts=A["num_experts"] + 2)  # 258 over 2 ranks: even, answered by A's entry
    assert lookup(profile=path, tokens=64, engine="trtllm", **even).backend == "nccl_all2allv"
    c = lookup(profile=path, tokens=64, engine="trtllm", **dict(A, num_experts=A["num_experts"] + 1))
    assert (c.backend, c.engines["trtllm"], c.match) == ("allgather_reducescatter", "ALLGATHER", "nearest-shape")


def test_engine_options_are_part_of_what_an_engine_accepts(tmp_path):
    # SGLang runs both DeepEP kernels under one literal; the mode tells them apart.
    data = fixture_data()
    data["backends"]["nccl_all2allv"]["engines"]["sglang"] = "deepep"
    data["backends"]["nccl_all2allv"]["engine_options"] = {"sglang": ["--deepep-mode", "normal"]}
    c = lookup(profile=write(tmp_path, data), tokens=64, engine="sglang", **A)
    assert (c.backend, c.engines["sglang"], c.engine_options["sglang"]) == (
        "nccl_all2allv",
        "deepep",
        ("--deepep-mode", "normal"),
    )
    assert c.to_dict()["engine_options"] == {"sglang": ["--deepep-mode", "normal"]}
    # A mode SGLang does not know: the backend cannot be told to SGLang.
    data["backends"]["nccl_all2allv"]["engine_options"] = {"sglang": ["--deepep-mode", "lowlatency"]}
    clear_cache()
    c = lookup(profile=write(tmp_path, data), tokens=64, engine="sglang", **A)
    assert c.match == "fallback"
    # A malformed options object is a broken table, named by its field.
    data["backends"]["nccl_all2allv"]["engine_options"] = {"sglang": "--deepep-mode normal"}
    clear_cache()
    c = lookup(profile=write(tmp_path, data), tokens=64, **A)
    assert c.match == "fallback" and "backends.nccl_all2allv.engine_options.sglang" in c.reason


def test_choice_is_frozen_and_serialisable(fixture_dir):
    c = lookup(fingerprint=FP, tokens=200, **A)
    d = json.loads(json.dumps(c.to_dict()))
    assert d["backend"] == "nvlink_one_sided" and d["match"] == "exact"
    assert d["entry_shape"] == A and set(d["expected_us"]) == {
        "allgather_reducescatter",
        "nccl_all2allv",
        "nvlink_one_sided",
    }
    with pytest.raises(AttributeError):
        c.backend = "x"
    with pytest.raises(TypeError):
        c.expected_us["x"] = 1.0  # cached and shared between callers: read-only
    assert isinstance(hash(c), int)


# ------------------------------------------------------------------------- nearest shape


def test_nearest_shape_is_named_in_the_reason(fixture_dir):
    c = lookup(fingerprint=FP, tokens=1, ep_size=2, hidden=5120, topk=6, num_experts=64)
    assert c.match == "nearest-shape"
    assert c.entry_shape._asdict() == B
    assert c.backend == "allgather_reducescatter"
    # |log2(5120/4096)| = 0.32
    assert (
        "nearest shape ep_size=2 hidden=4096 topk=6 num_experts=64 dtype=bf16 routing=uniform (distance 0.32)"
        in c.reason
    )
    assert "requested ep_size=2 hidden=5120" in c.reason


def test_routing_difference_costs_half(fixture_dir):
    c = lookup(fingerprint=FP, tokens=64, **{**A, "routing": "zipf1.2"})
    assert c.match == "nearest-shape" and c.entry_shape._asdict() == A
    assert "(distance 0.50)" in c.reason


def test_nearest_shape_tie_goes_to_larger_hidden(tmp_path):
    data = fixture_data()
    small = json.loads(json.dumps(data["entries"][0]))  # shape B
    large = json.loads(json.dumps(data["entries"][0]))
    small["hidden"], large["hidden"] = 2048, 8192
    large["backends"]["nccl_all2allv"].update(median_us=[1.0] * 3, p10_us=[1.0] * 3, p90_us=[1.0] * 3)  # clear winner
    large["winners"] = []
    data["entries"] = [small, large]
    p = write(tmp_path, data)
    c = lookup(profile=p, tokens=64, ep_size=2, hidden=4096, topk=6, num_experts=64)
    assert c.match == "nearest-shape" and c.entry_shape.hidden == 8192 and c.backend == "nccl_all2allv"
    assert "(distance 1.00)" in c.reason


@pytest.mark.parametrize("change", [{"ep_size": 8}, {"dtype": "fp8"}])
def test_other_ep_size_or_dtype_is_not_matched(fixture_dir, caplog, change):
    c = lookup(fingerprint=FP, tokens=64, **{**A, **change})
    assert (c.backend, c.match, c.engines["vllm"]) == (FALLBACK_BACKEND, "fallback", FALLBACK_BACKEND)
    (rec,) = warnings_of(caplog)
    msg = rec.getMessage()
    assert str(FIXTURE) in msg and "no entry for ep_size=" in msg and "table has ep_size=2/dtype=bf16" in msg
    # Asking again does not warn again.
    lookup(fingerprint=FP, tokens=64, **{**A, **change})
    assert len(warnings_of(caplog)) == 1


# ----------------------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    "kwargs",
    [
        {**A, "tokens": -1},
        {**A, "tokens": 8, "hidden": "7168"},
        {**A, "tokens": 8, "topk": 0},
        {**A, "tokens": 8.5},
        {**A, "tokens": 8, "fingerprint": "Not A/Fingerprint"},
        {**A, "tokens": 8, "profile": "/nonexistent/dir/x.json"},
    ],
)
def test_bad_arguments_never_raise(kwargs, caplog):
    c = lookup(**kwargs)
    assert (c.backend, c.match) == (FALLBACK_BACKEND, "fallback")
    assert len(warnings_of(caplog)) == 1


def test_integer_like_arguments_are_accepted(fixture_dir):
    class Index:  # e.g. numpy.int64
        def __init__(self, v):
            self.v = v

        def __index__(self):
            return self.v

    c = lookup(fingerprint=FP, tokens=Index(200), **{**A, "hidden": Index(7168)})
    assert (c.backend, c.match) == ("nvlink_one_sided", "exact")


def test_a_lookup_argument_out_of_range_is_named_not_an_internal_error(caplog):
    for kwargs in ({"tokens": -5}, {"tokens": True}, {"phase": "decode", "max_tokens": -1}):
        c = lookup(profile=FIXTURES / f"{FP}.json", **A, **kwargs)
        assert c.match == "fallback"
        assert "invalid lookup argument" in c.reason and "internal error" not in c.reason, c.reason


# ---------------------------------------------------------------------- cost at start-up


def test_import_is_stdlib_only():
    code = f"""
import json, sys, time
t0 = time.perf_counter()
import a2a_tune.tuner.runtime.lookup as lk
t1 = time.perf_counter()
c = lk.lookup(profile={str(FIXTURE)!r}, fingerprint={FP!r}, tokens=64, **{A!r})
heavy = ["torch", "sqlalchemy", "pynvml", "jsonschema", "rich", "numpy", "a2a_tune.kernels", "a2a_tune.db"]
print(json.dumps({{"import_s": t1 - t0, "backend": c.backend,
                   "loaded": [m for m in heavy if m in sys.modules]}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["loaded"] == []
    assert res["backend"] == "nvlink_one_sided"


def test_warm_lookup_is_cached(tmp_path, monkeypatch):
    p = write(tmp_path, FIXTURE.read_text())
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", str(tmp_path))
    opened = []
    real_open = os.open

    def counting_open(file, *a, **k):
        if os.fspath(file) == str(p):
            opened.append(file)
        return real_open(file, *a, **k)

    monkeypatch.setattr(os, "open", counting_open)  # how the start-up path opens files (runtime.files)
    assert lookup(fingerprint=FP, tokens=64, **A).backend == "nvlink_one_sided"
    assert len(opened) == 1
    assert lookup(fingerprint=FP, tokens=64, **A).backend == "nvlink_one_sided"
    assert lookup(fingerprint=FP, tokens=1024, **B).backend == "nccl_all2allv"  # other request, same file
    assert len(opened) == 1

    for _ in range(100):
        lookup(fingerprint=FP, tokens=64, **A)
    assert len(opened) == 1  # warm answers never touch the file

    # A rewritten profile (select writes a new file and os.replace's it) is re-read.
    data = variant("allgather_reducescatter")
    tmp = tmp_path / "new.json"
    tmp.write_text(json.dumps(data))
    os.replace(tmp, p)
    assert lookup(fingerprint=FP, tokens=1024, **B).backend == "allgather_reducescatter"
    assert len(opened) == 2


def test_choice_type_is_exported_and_read_only(fixture_dir):
    c = lookup(fingerprint=FP, tokens=64, **A)
    assert isinstance(c, Choice)
    for name in ("backend", "regret", "tie", "new_attribute"):
        with pytest.raises(AttributeError):
            setattr(c, name, 1)
    assert c == lookup(fingerprint=FP, tokens=64, **A) and hash(c) == hash(lookup(fingerprint=FP, tokens=64, **A))
    assert "backend='nvlink_one_sided'" in repr(c)


# ----------------------------------------------------------------------- phases / regret


def test_disaggregated_prefill_and_decode_engines_get_different_backends(fixture_dir, caplog):
    """Shape A's curves cross at ~234 tokens per rank: a decode engine (batches of 1..64
    tokens per rank) should run nvlink_one_sided, a prefill engine (chunks of 1024 tokens
    per rank) nccl_all2allv -- the answer of one `tokens=` value would be wrong for one of them."""
    decode = lookup(fingerprint=FP, phase="decode", max_tokens=64, **A)
    prefill = lookup(fingerprint=FP, phase="prefill", max_tokens=1024, **A)
    assert (decode.backend, decode.phase) == ("nvlink_one_sided", "decode")
    assert (prefill.backend, prefill.phase) == ("nccl_all2allv", "prefill")
    assert "decode: tokens/rank 1..64 log-uniform" in decode.reason
    assert "prefill: at 1024 tokens/rank (measured)" in prefill.reason
    # vLLM cannot express either; for vLLM both engines get the fastest backend it accepts.
    for phase, n in (("decode", 64), ("prefill", 1024)):
        c = lookup(fingerprint=FP, phase=phase, max_tokens=n, engine="vllm", **A)
        assert (c.backend, c.engines["vllm"]) == ("allgather_reducescatter", "allgather_reducescatter")
    assert warnings_of(caplog) == []


def test_decode_expectation_is_the_log_uniform_mean_of_the_curve(fixture_dir):
    c = lookup(fingerprint=FP, phase="decode", max_tokens=200, **A)

    def curve(t, grid, med):  # the documented log-log interpolant, clamped
        if t <= grid[0]:
            return med[0]
        for (t0, v0), (t1, v1) in zip(zip(grid, med), zip(grid[1:], med[1:])):
            if t0 <= t <= t1:
                return v0 * (v1 / v0) ** (math.log(t / t0) / math.log(t1 / t0))
        return med[-1]

    grid = [1, 4, 16, 64, 256, 1024]
    n = 20000  # midpoint rule over u = ln t, uniform on [0, ln 200]
    for b, med in {
        "nvlink_one_sided": [20, 21, 25, 50, 195],
        "allgather_reducescatter": [30, 31, 35, 100, 400, 1500],
    }.items():
        us = [(i + 0.5) / n * math.log(200) for i in range(n)]
        mean = sum(curve(math.exp(u), grid[: len(med)], med) for u in us) / n
        assert c.expected_us[b] == pytest.approx(mean, rel=1e-5)
    best = min(c.expected_us.values())
    assert dict(c.alternatives) == {
        b: pytest.approx(v / best - 1, abs=1e-4) for b, v in c.expected_us.items() if b != c.backend
    }
    assert c.regret == 0.0 and not c.tie


def test_decode_of_one_token_is_the_point(fixture_dir):
    one = lookup(fingerprint=FP, phase="decode", max_tokens=1, **A)
    assert dict(one.expected_us) == dict(lookup(fingerprint=FP, tokens=1, **A).expected_us)


def test_decode_needs_every_point_in_range(fixture_dir):
    # nvlink_one_sided timed out at 1024: over 1..1024 it cannot be averaged, so it does not compete.
    c = lookup(fingerprint=FP, phase="decode", max_tokens=1024, **A)
    assert "nvlink_one_sided" not in c.expected_us and c.backend == "nccl_all2allv"
    c = lookup(fingerprint=FP, phase="decode", max_tokens=4096, **A)
    assert "(measured 1..1024; clamped outside)" in c.reason


# ----------------------------------------------------------------------------- workloads


def test_workload_mapping_json_and_csv_agree(fixture_dir, tmp_path):
    hist = {1: 50, 8: 30, 64: 15, 1024: 5}
    as_json = tmp_path / "w.json"
    as_json.write_text(json.dumps({str(k): v for k, v in hist.items()}))
    as_pairs = tmp_path / "pairs.json"
    as_pairs.write_text(json.dumps([[k, v] for k, v in hist.items()]))
    as_csv = tmp_path / "w.csv"
    as_csv.write_text(
        "# tokens per rank per step, steps seen\ntokens,steps\n" + "".join(f"{k},{v}\n" for k, v in hist.items())
    )
    answers = [lookup(fingerprint=FP, workload=w, **B) for w in (hist, as_json, str(as_pairs), as_csv)]
    assert {c.backend for c in answers} == {answers[0].backend}
    assert all(dict(c.expected_us) == dict(answers[0].expected_us) for c in answers)
    c = answers[0]
    assert c.phase == "workload" and "workload of 4 token counts 1..1024 tokens/rank" in c.reason
    # Expected time = weighted mean of the point estimates.
    points = {t: lookup(fingerprint=FP, tokens=t, **B).expected_us for t in hist}
    for b in c.expected_us:
        assert c.expected_us[b] == pytest.approx(
            sum(hist[t] * points[t][b] for t in hist) / sum(hist.values()), abs=1e-3
        )


def test_workload_file_is_reread_when_it_changes(fixture_dir, tmp_path):
    w = tmp_path / "w.json"
    w.write_text('{"1": 1}')
    assert lookup(fingerprint=FP, workload=w, **B).backend == "allgather_reducescatter"
    w.write_text('{"1024": 1}')
    os.utime(w, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    assert lookup(fingerprint=FP, workload=w, **B).backend == "nccl_all2allv"


BAD_WORKLOADS = {
    "missing_file": (None, "cannot read"),
    "truncated_json": ('{"1": 10, "8":', "invalid JSON at line 1"),
    "garbled_bytes": (b"\xff\xfe\x00\x89PNG", "not UTF-8"),
    "negative_weight": ('{"1": 10, "8": -2}', "weight must be a finite number >= 0, got -2"),
    "nan_weight": ("1,10\n8,nan\n", "line 2: weight must be a finite number >= 0"),
    "fractional_tokens": ("1.5,10\n", "line 1: tokens must be an integer >= 0, got 1.5"),
    "three_columns": ("tokens,weight\n1,2,3\n", "line 2: expected 2 columns"),
    "all_zero": ('{"1": 0, "8": 0}', "every weight is 0"),
    "empty": ("", "empty workload"),
    "not_pairs": ("[1, 2, 3]", "[0]: expected a [tokens, weight] pair"),
}


@pytest.mark.parametrize("case", sorted(BAD_WORKLOADS))
def test_bad_workload_falls_back_with_exactly_one_warning(case, fixture_dir, tmp_path, caplog):
    content, problem = BAD_WORKLOADS[case]
    w = tmp_path / "workload.csv"
    if isinstance(content, bytes):
        w.write_bytes(content)
    elif content is not None:
        w.write_text(content)
    for _ in range(3):
        c = lookup(fingerprint=FP, workload=w, **A)
        assert (c.backend, c.match, c.phase) == (FALLBACK_BACKEND, "fallback", "workload")
    (rec,) = warnings_of(caplog)
    msg = rec.getMessage()
    assert str(w) in msg and problem in msg and FALLBACK_BACKEND in msg and "\n" not in msg


@pytest.mark.parametrize(
    "kwargs, problem",
    [
        ({}, "give exactly one of tokens=, phase= (with max_tokens=) or workload= (got none)"),
        ({"tokens": 8, "phase": "decode", "max_tokens": 8}, "(got tokens, phase)"),
        ({"phase": "decode"}, "phase='decode' needs max_tokens= (max batch per rank)"),
        ({"phase": "prefill", "max_tokens": 0}, "invalid lookup argument max_tokens=0"),
        ({"phase": "mixed", "max_tokens": 8}, "invalid lookup argument phase='mixed'"),
        ({"tokens": 8, "max_tokens": 8}, "max_tokens= goes with phase="),
        ({"workload": {1: 1}, "max_tokens": 8}, "max_tokens= goes with phase="),
        ({"workload": 12}, "invalid lookup argument workload=12"),
        ({"workload": {"x": 1}}, "tokens must be an integer >= 0, got 'x'"),
    ],
)
def test_bad_request_never_raises(kwargs, problem, fixture_dir, caplog):
    c = lookup(fingerprint=FP, **A, **kwargs)
    assert (c.backend, c.match) == (FALLBACK_BACKEND, "fallback")
    (rec,) = warnings_of(caplog)
    assert problem in rec.getMessage()


def test_quiet_lookup_returns_the_reason_without_logging(caplog):
    c = lookup(fingerprint="no.such.machine", tokens=8, quiet=True, **A)
    assert c.match == "fallback" and "no profile for fingerprint 'no.such.machine'" in c.reason
    assert warnings_of(caplog) == []


def test_warm_phase_and_workload_lookups_give_the_same_answer_from_cache(fixture_dir, tmp_path):
    w = tmp_path / "w.csv"
    w.write_text("1,5\n16,3\n256,1\n")
    for kwargs in ({"phase": "decode", "max_tokens": 256}, {"workload": w}):
        first = lookup(fingerprint=FP, **A, **kwargs)
        for _ in range(50):
            again = lookup(fingerprint=FP, **A, **kwargs)
        assert (again.backend, again.alternatives) == (first.backend, first.alternatives)


def test_a_table_at_the_edges_of_its_ranges_is_computed_without_error(tmp_path):
    """Every value validation lets through is one the lookup computes with: the smallest and
    largest times and token counts a table may hold, for every kind of request."""
    from a2a_tune.tuner.runtime.point import MAX_TOKENS_PER_RANK as MAX_COUNT
    from a2a_tune.tuner.runtime.table import MAX_US, MIN_US

    data = fixture_data()
    e = data["entries"][0]  # shape B: allgather_reducescatter, nccl_all2allv
    e["tokens"] = [1, MAX_COUNT - 1, MAX_COUNT]
    curves = {"allgather_reducescatter": [MIN_US, MAX_US, MIN_US], "nccl_all2allv": [MAX_US, MIN_US, MAX_US]}
    for b, v in curves.items():
        e["backends"][b].update(median_us=v, p10_us=v, p90_us=v)
    e["winners"] = []
    path = write(tmp_path, data)
    requests = [
        {"tokens": 1},
        {"tokens": MAX_COUNT - 1},
        {"tokens": MAX_COUNT},
        {"tokens": 1 << 10},  # interpolated over a 2^20-fold step
        {"phase": "decode", "max_tokens": MAX_COUNT},
        {"phase": "prefill", "max_tokens": MAX_COUNT - 1},
        {"workload": {1: 1, MAX_COUNT - 1: 1, MAX_COUNT: 2, 2**40: 1}},  # a histogram's tail clamped to the last count
    ]
    for req in requests:
        c = lookup(profile=path, quiet=True, **B, **req)
        assert c.match == "exact", (req, c.reason)
        assert all(MIN_US <= v <= MAX_US for v in c.expected_us.values()), (req, c.expected_us)


# ------------------------------------------------------------------------------ the request


def test_request_is_the_checked_request_and_answer_gives_lookups_choice(fixture_dir):
    req = request(fingerprint=FP, phase="decode", max_tokens=64, **A)
    assert req == LookupRequest(Shape(**A), "decode", ("log-uniform", 1, 64), None, FP, None)
    assert hash(req) == hash(request(fingerprint=FP, phase="decode", max_tokens=64, **A))
    with pytest.raises(AttributeError):
        req.phase = "prefill"  # frozen
    assert lk.answer(req) == lookup(fingerprint=FP, phase="decode", max_tokens=64, **A)
    assert request(workload={8: 1, 1: 3}, **A).load == ("discrete", ((1, 0.75), (8, 0.25)))
    assert request(workload=Path("w.csv"), profile=Path("t.json"), **A)[2:7] == (
        ("workload-file", "w.csv"),
        None,
        None,
        "t.json",
        None,  # no memory budget
    )


# (arguments, lookup's words, the command line's words): one set of rules, two spellings.
BAD_REQUESTS = [
    (
        {},
        "give exactly one of tokens=, phase= (with max_tokens=) or workload= (got none)",
        "give exactly one of --tokens, --phase or --workload (got none)",
    ),
    ({"tokens": 1, "phase": "decode"}, "(got tokens, phase)", "(got --tokens, --phase)"),
    (
        {"phase": "decode"},
        "phase='decode' needs max_tokens= (max batch per rank)",
        "--phase decode needs --max-batch N",
    ),
    (
        {"phase": "prefill"},
        "phase='prefill' needs max_tokens= (tokens per rank per prefill step)",
        "--phase prefill needs --max-tokens N",
    ),
    (
        {"phase": "mixed", "max_tokens": 8},
        "invalid lookup argument phase='mixed' (expected 'decode' or 'prefill')",
        "--phase must be decode or prefill, got 'mixed'",
    ),
    (  # token counts: the point's one bound, 1..2^20, as the CLI, the store and the table hold it
        {"phase": "prefill", "max_tokens": 0},
        "invalid lookup argument max_tokens=0 (tokens per rank must be in 1..1048576, got 0)",
        "--max-tokens: tokens per rank must be in 1..1048576, got 0",
    ),
    (
        {"tokens": -1},
        "invalid lookup argument tokens=-1 (tokens per rank must be in 1..1048576, got -1)",
        "--tokens: tokens per rank must be in 1..1048576, got -1",
    ),
    (
        {"tokens": 0},
        "invalid lookup argument tokens=0 (tokens per rank must be in 1..1048576, got 0)",
        "--tokens: tokens per rank must be in 1..1048576, got 0",
    ),
    (
        {"tokens": 2**20 + 1},
        "invalid lookup argument tokens=1048577 (tokens per rank must be in 1..1048576, got 1048577)",
        "--tokens: tokens per rank must be in 1..1048576, got 1048577",
    ),
    (
        {"tokens": 8.0},
        "invalid lookup argument tokens=8.0 (tokens per rank must be a whole number, got 8.0)",
        "--tokens: tokens per rank must be a whole number, got 8.0",
    ),
    (
        {"tokens": 8, "max_tokens": 8},
        "max_tokens= goes with phase=, not with tokens=",
        "--max-tokens goes with --phase prefill",
    ),
    (
        {"tokens": 8, "engine": "tgi"},
        "invalid lookup argument engine='tgi' (expected None or one of 'vllm', 'sglang', 'trtllm')",
        "--engine must be vllm or sglang or trtllm, got 'tgi'",
    ),
    (
        {"tokens": 8, "hidden": 0},
        "invalid lookup argument hidden=0 (expected an integer >= 1)",
        "--hidden must be >= 1, got 0",
    ),
    (
        {"tokens": 8, "num_experts": -2},
        "invalid lookup argument num_experts=-2 (expected an integer >= 1)",
        "--experts must be >= 1, got -2",
    ),
    (  # a shape no engine runs is refused, not answered by the nearest shape
        {"tokens": 8, "topk": 9, "num_experts": 8},
        "invalid lookup shape: topk 9 is more than the 8 experts",
        "invalid lookup shape: topk 9 is more than the 8 experts",
    ),
    (
        {"tokens": 8, "hidden": 10**9},
        "invalid lookup shape: hidden must be in 1..65536, got 1000000000",
        "invalid lookup shape: hidden must be in 1..65536, got 1000000000",
    ),
]


@pytest.mark.parametrize("kwargs, words, options", BAD_REQUESTS)
def test_one_set_of_request_rules_in_lookups_words_and_the_command_lines(kwargs, words, options, caplog):
    args = {**A, **kwargs}
    with pytest.raises(RequestError) as keywords:
        request(**args)
    assert words in str(keywords.value)
    cli = request_words(keywords.value)  # the same structured error, in the command line's option names
    assert cli == options or options.startswith("(") and options in cli
    c = lookup(**args)  # what lookup() refuses, it answers with the fallback and the same words
    assert c.match == "fallback" and c.reason.startswith(str(keywords.value))
    (rec,) = warnings_of(caplog)
    assert words in rec.getMessage()


def test_lookup_takes_requests_keywords_and_a_wrong_call_is_a_type_error():
    """A bad value is a request refused (the fallback); a keyword lookup does not take is a
    programming error, raised as Python would."""
    with pytest.raises(TypeError, match="toknes"):
        lookup(toknes=8, **A)
    with pytest.raises(TypeError, match=r"\(missing\) hidden"):
        lookup(tokens=8, **{k: v for k, v in A.items() if k != "hidden"})


def test_a_request_error_carries_the_rule_the_argument_and_the_bound():
    """Structured, so that a caller words it in its own names (the CLI in its options)."""
    with pytest.raises(RequestError) as info:
        request(tokens=8, **{**A, "num_experts": -2})
    e = info.value
    assert (e.rule, e.field, e.value, e.bound, e.phase) == ("integer", "num_experts", -2, 1, "tokens")
    assert request_words(e) == "--experts must be >= 1, got -2"
    with pytest.raises(RequestError) as info:
        request(phase="decode", max_tokens=0, **A)
    e = info.value
    assert (e.rule, e.field, e.value, e.phase) == ("tokens", "max_tokens", 0, "decode")
    assert request_words(e) == f"--max-batch: {e.bound}"
    assert request_words(e, "--max-tokens").startswith("--max-tokens: tokens per rank must be in 1..")
    with pytest.raises(RequestError) as info:
        request(tokens=8, max_tokens=8, **A)
    assert request_words(info.value, "--max-batch") == "--max-batch goes with --phase decode"


# ------------------------------------------------------------------- what a lookup says


def test_unusable_backends_are_named_by_what_happened_to_them(tmp_path, caplog):
    """A CPU table asked for SGLang: the backends SGLang could run were unavailable where the
    table was measured, not failed; the sentence says which, and parses."""
    data = fixture_data()
    e = data["entries"][1]  # shape A
    data["backends"]["deepep_high_throughput"] = {
        "engines": {"vllm": None, "sglang": "deepep"},
        "engine_options": {"sglang": ["--deepep-mode", "normal"]},
    }
    data["backends"]["deepep_low_latency"]["engine_options"] = {"sglang": ["--deepep-mode", "low_latency"]}
    e["failed"] = {
        "deepep_high_throughput": {"kind": "unavailable", "tokens": None, "reason": "deep_ep is not installed"},
        "deepep_low_latency": {"kind": "unavailable", "tokens": None, "reason": "deep_ep is not installed"},
        "flashinfer_nvlink_one_sided": {"kind": "incorrect", "tokens": 4, "reason": "wrong sums"},
    }
    data["tie_preference"].append("deepep_high_throughput")
    c = lookup(profile=write(tmp_path, data), tokens=64, engine="sglang", **A)
    assert c.match == "fallback"
    assert (
        ": exact shape, at 64 tokens/rank (measured): no usable backend that SGLang accepts "
        "(unavailable: deepep_high_throughput, deepep_low_latency); " in c.reason
    )
    assert "failed" not in c.reason and "flashinfer_nvlink_one_sided" not in c.reason  # SGLang cannot run it
    (rec,) = warnings_of(caplog)
    assert rec.getMessage().endswith(
        "(unavailable: deepep_high_throughput, deepep_low_latency); SGLang keeps its default --moe-a2a-backend none"
    )
    assert lookup(profile=write(tmp_path, data), tokens=64, **A).match == "exact"  # any engine: they compete


def test_a_decode_range_compares_backends_missing_a_refinement_count_but_never_chooses_them(tmp_path):
    """A table refined between two counts for the contenders only: a decode range over that
    count still shows every other backend's regret, and only a backend measured at every count
    in the range may be chosen (one that failed at a count inside it is never chosen)."""
    data = fixture_data()
    e = data["entries"][1]  # shape A, tokens [1, 4, 16, 64, 256, 1024]
    e["tokens"].insert(4, 128)  # a refinement count: only the contenders timed
    for b, curve in e["backends"].items():
        for key in ("median_us", "p10_us", "p90_us"):
            mid = {"nvlink_one_sided": 150.0, "nccl_all2allv": 120.0}.get(b)
            curve[key].insert(4, None if mid is None else mid * {"median_us": 1, "p10_us": 0.98, "p90_us": 1.03}[key])
        for key in (k for k, v in curve.items() if isinstance(v, list) and len(v) == 6):  # its figures
            curve[key].insert(4, None)
    e["winners"] = []
    path = write(tmp_path, data)
    c = lookup(profile=path, phase="decode", max_tokens=200, engine="vllm", **A)
    # vLLM can run only allgather_reducescatter here, and it lacks 128: nothing competes.
    assert c.match == "fallback"
    c = lookup(profile=path, phase="decode", max_tokens=200, **A)
    assert c.backend == "nvlink_one_sided"
    assert set(c.alternatives) == {"nccl_all2allv", "allgather_reducescatter"}
    assert c.alternatives["allgather_reducescatter"] > 0
    assert "so compared but not chosen: allgather_reducescatter +" in c.reason
    # Made the fastest on average, a backend with a gap is still not chosen.
    for key in ("median_us", "p10_us", "p90_us"):
        e["backends"]["allgather_reducescatter"][key] = [1.0, 1.0, 1.0, 1.0, None, 1.0, 1.0]
    c = lookup(profile=write(tmp_path, data), phase="decode", max_tokens=200, **A)
    assert c.backend == "nvlink_one_sided" and c.alternatives["allgather_reducescatter"] < 0
    # At a point the rule is unchanged: at 128 only what was measured at 128 competes.
    assert set(lookup(profile=path, tokens=128, **A).expected_us) == {"nvlink_one_sided", "nccl_all2allv"}


def test_the_shipped_tables_decode_answer_for_vllm_lists_its_alternatives():
    c = lookup(fingerprint="h200.nvl18x2.node1", phase="decode", max_tokens=256, engine="vllm", **dict(A, dtype="bf16"))
    assert c.backend == "flashinfer_nvlink_one_sided"
    assert "allgather_reducescatter" in c.alternatives and c.alternatives["allgather_reducescatter"] > 1
    assert "no other backend competes" in c.reason and "compared but not chosen" in c.reason


EVIL = "evil\n\x1b]0;pwned\x07\x1b[2J"


def _with_backend_named(name: str) -> dict:
    """The fixture with nvlink_one_sided (shape A's fastest at 64) renamed ``name``."""
    data = fixture_data()
    data["backends"][name] = data["backends"].pop("nvlink_one_sided")
    for e in data["entries"]:
        if "nvlink_one_sided" in e["backends"]:
            e["backends"][name] = e["backends"].pop("nvlink_one_sided")
        e["failed"] = {(name if b == "nvlink_one_sided" else b): r for b, r in e.get("failed", {}).items()}
        e["winners"] = []
    data["tie_preference"] = [name if b == "nvlink_one_sided" else b for b in data["tie_preference"]]
    return data


def _one_safe_line(text: str, limit: int = 2000) -> None:
    assert "\n" not in text and "\x1b" not in text and "\x07" not in text and len(text) <= limit, text[:300]


def test_names_from_a_table_are_escaped_in_what_lookup_says(tmp_path, caplog):
    path = write(tmp_path, _with_backend_named(EVIL))
    c = lookup(profile=path, tokens=64, **A)
    assert c.backend == EVIL  # the table's name, as data (JSON escapes it)
    _one_safe_line(c.reason)
    assert "evil \\x1b]0;pwned\\x07\\x1b[2J 50.000 us" in c.reason
    c = lookup(profile=path, tokens=64, engine="vllm", **dict(A, hidden=7000))  # a fallback naming it
    _one_safe_line(c.reason)
    long_name = "n" * 10_000
    c = lookup(profile=write(tmp_path, _with_backend_named(long_name)), tokens=64, **A)
    _one_safe_line(c.reason)
    for rec in warnings_of(caplog):
        _one_safe_line(rec.getMessage())


@pytest.mark.parametrize(
    "kwargs",
    [
        {"fingerprint": "h" * 10_000},
        {"fingerprint": "bad\n\x1b[2Jfp"},
        {"workload": {10**4000: 1}},
        {"tokens": 10**4000},
        {"phase": "decode", "max_tokens": 10**4000},
        {"tokens": 10**5000},  # beyond Python's int -> str limit
        {"phase": "x" * 10_000 + "\x1b", "max_tokens": 1},
    ],
    ids=[
        "10k-fingerprint",
        "control-fingerprint",
        "4000-digit-workload",
        "4000-digit-tokens",
        "4000-digit-batch",
        "5000-digit-tokens",
        "long-phase",
    ],
)
def test_what_a_lookup_echoes_is_one_bounded_line(kwargs, fixture_dir, caplog):
    c = lookup(**{"fingerprint": FP, **A, **kwargs})
    _one_safe_line(c.reason)
    for rec in warnings_of(caplog):
        _one_safe_line(rec.getMessage())


def test_paths_from_the_environment_are_escaped(tmp_path, monkeypatch, caplog):
    odd = tmp_path / "dir\nwith\x1b[31mcontrol"
    odd.mkdir()
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", str(odd))
    c = lookup(fingerprint="no.such.machine", tokens=8, **A)
    _one_safe_line(c.reason)
    (rec,) = warnings_of(caplog)
    _one_safe_line(rec.getMessage())
    assert "dir with\\x1b[31mcontrol" in rec.getMessage()


# --------------------------------------------------------------------- workspace budget
# The fixture's shape A holds each backend's device memory per rank (test_select.WORKSPACE_MIB):
# allgather_reducescatter 16, nccl_all2allv 64, nvlink_one_sided 3072 MiB; shape B holds none.


def test_workspace_budget_skips_backends_above_it_and_says_so(fixture_dir):
    free = lookup(fingerprint=FP, tokens=16, **A)
    assert (free.backend, dict(free.over_budget)) == ("nvlink_one_sided", {})
    c = lookup(fingerprint=FP, tokens=16, max_workspace_mib=1024, **A)
    assert (c.backend, c.match, dict(c.over_budget)) == (
        "allgather_reducescatter",
        "exact",
        {"nvlink_one_sided": 3072.0},
    )
    assert c.reason.endswith("; workspace budget 1024 MiB: skipped nvlink_one_sided (3072 MiB)")
    assert "nvlink_one_sided" not in c.expected_us and c.to_dict()["over_budget"] == {"nvlink_one_sided": 3072.0}
    at_the_budget = lookup(fingerprint=FP, tokens=16, max_workspace_mib=3072, **A)
    assert at_the_budget.backend == "nvlink_one_sided"
    assert at_the_budget.reason.endswith("; workspace budget 3072 MiB: nothing skipped")


def test_workspace_budget_from_the_environment_and_the_argument_wins(fixture_dir, monkeypatch):
    monkeypatch.setenv("A2A_TUNE_MAX_WORKSPACE_MIB", "1024")
    assert lookup(fingerprint=FP, tokens=16, **A).backend == "allgather_reducescatter"
    assert lookup(fingerprint=FP, tokens=16, max_workspace_mib=4096, **A).backend == "nvlink_one_sided"


@pytest.mark.parametrize(
    "env, arg, problem",
    [
        ("lots", None, "invalid A2A_TUNE_MAX_WORKSPACE_MIB='lots' (expected a number of MiB)"),
        ("-1", None, "invalid A2A_TUNE_MAX_WORKSPACE_MIB=-1.0 (expected a number of MiB >= 0)"),
        (None, float("nan"), "invalid max_workspace_mib=nan (expected a number of MiB >= 0)"),
        (None, "512", "invalid max_workspace_mib='512' (expected a number of MiB >= 0)"),
    ],
)
def test_a_bad_workspace_budget_falls_back_with_one_warning(env, arg, problem, fixture_dir, monkeypatch, caplog):
    if env is not None:
        monkeypatch.setenv("A2A_TUNE_MAX_WORKSPACE_MIB", env)
    c = lookup(fingerprint=FP, tokens=16, max_workspace_mib=arg, **A)
    assert c.match == "fallback" and c.reason.startswith(problem)
    assert [r.getMessage() for r in warnings_of(caplog)] == [f"a2a-tune: {c.reason}"]


def test_memory_the_table_does_not_hold_is_kept_under_a_budget(fixture_dir):
    c = lookup(fingerprint=FP, tokens=1024, max_workspace_mib=1, **B)  # shape B: measured without it
    assert (c.backend, dict(c.over_budget)) == ("nccl_all2allv", {})
    assert c.reason.endswith(
        "workspace budget 1 MiB: nothing skipped (memory not in the table: allgather_reducescatter, nccl_all2allv, kept)"
    )


def test_no_backend_within_the_budget_falls_back_naming_what_was_skipped(fixture_dir, caplog):
    c = lookup(fingerprint=FP, tokens=16, max_workspace_mib=8, **A)
    assert c.match == "fallback" and c.backend == FALLBACK_BACKEND
    assert dict(c.over_budget) == {"allgather_reducescatter": 16.0, "nccl_all2allv": 64.0, "nvlink_one_sided": 3072.0}
    assert "skipped allgather_reducescatter (16 MiB), nccl_all2allv (64 MiB), nvlink_one_sided (3072 MiB)" in c.reason
    assert len(warnings_of(caplog)) == 1


def test_a_request_needs_the_memory_of_its_largest_step(tmp_path):
    """A backend built per load holds more at larger counts: the request's largest step decides
    (the first measured count covering it), not the smallest or the entry's largest."""
    data = fixture_data()
    (a,) = [e for e in data["entries"] if e["hidden"] == 7168]
    a["backends"]["nvlink_one_sided"]["workspace_mib"] = [100, 200, 400, 800, 1600, None]
    path = write(tmp_path, data)

    def pick(**request):
        return lookup(profile=path, max_workspace_mib=500, **request, **A).backend

    assert pick(tokens=16) == "nvlink_one_sided"  # 400 MiB at 16
    assert pick(tokens=10) == "nvlink_one_sided"  # covered by 16
    assert pick(tokens=17) == "allgather_reducescatter"  # covered by 64: 800 MiB
    assert pick(phase="decode", max_tokens=16) == "nvlink_one_sided"
    assert pick(phase="decode", max_tokens=64) == "allgather_reducescatter"
    assert pick(workload={4: 0.9, 64: 0.1}) == "allgather_reducescatter"  # its largest step: 64


def test_the_budget_is_part_of_the_checked_request():
    assert request(tokens=8, max_workspace_mib=512, **A).max_workspace_mib == 512.0
    assert request(tokens=8, **A).max_workspace_mib is None
    with pytest.raises(RequestError) as info:
        request(tokens=8, max_workspace_mib=-1, **A)
    assert str(info.value) == "invalid max_workspace_mib=-1 (expected a number of MiB >= 0)"
    assert request_words(info.value) == "--max-workspace-mib must be a number of MiB >= 0, got -1"


def test_lookup_takes_the_deployment_as_keywords():
    """The Python API takes the CLI's deployment facts; a refused backend never competes and
    Choice.excluded names its rule; a bad fact is the fallback with one line, never a raise."""
    dsv3 = dict(ep_size=2, hidden=7168, topk=8, num_experts=256, phase="decode", max_tokens=64)
    shipped = dict(fingerprint="h200.nvl18x2.node1", engine="vllm", **dsv3)
    assert lookup(**shipped).engines["vllm"] == "flashinfer_nvlink_one_sided"
    choice = lookup(lora=True, platform="cuda:9.0", **shipped)
    assert choice.engines["vllm"] == "allgather_reducescatter" and choice.match != "fallback"
    assert choice.excluded["flashinfer_nvlink_one_sided"].startswith("lora_ep: LoRA with EP")
    assert "excluded by start-up rules" in choice.reason
    choice = lookup(quantization="fp8_per_tensor", **{**shipped, "dtype": "fp8_e4m3"})
    assert "flashinfer_nvlink_one_sided" not in (choice.engines["vllm"],)
    bad = lookup(lora="yes", quiet=True, **shipped)
    assert bad.match == "fallback" and "invalid lookup argument lora='yes'" in bad.reason
    assert (
        lookup(missing_packages=["flashinfer"], **shipped)
        .excluded["flashinfer_nvlink_one_sided"]
        .startswith("package: flashinfer not importable")
    )
