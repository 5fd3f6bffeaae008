"""Runtime lookup: shape matching, log-log token interpolation, search order, and the
"never crash the engine" promise (every bad table -> fallback + exactly one warning).

The fixture profile tests/fixtures/profiles/test.fixture.node1.json (schema 2) is built by
tests/test_select.py::fixture_profile (see the curves there); every point has
p10 = 0.98 x median and p90 = 1.03 x median; nvlink_one_sided is graph-timed, the rest
eager. Shape A (ep 2, hidden 7168, topk 8, 256 experts) over tokens [1, 4, 16, 64, 256, 1024]:

    allgather_reducescatter      30   31   35  100  400 1500
    nccl_all2allv                45   46   50   75  190  420
    nvlink_one_sided             20   21   25   50  195  null   (timeout at 1024)
    flashinfer_nvlink_one_sided   5    5    5    5    5    5   (failed: incorrect)

Shape B (ep 2, hidden 4096, topk 6, 64 experts) over [1, 64, 1024]:
    allgather_reducescatter 20 60 600, nccl_all2allv 40 70 300.

Tie preference: allgather_reducescatter, nccl_all2allv, nvlink_one_sided, ... (registry
order). tests/fixtures/profiles/schema1/ holds the same table as schema 1 wrote it
(p10 = 0.95, p90 = 1.1 x median, one timing mode).
"""

from __future__ import annotations

import builtins
import json
import logging
import math
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from bad_tables import BAD_TABLES, FIXTURE, FP, fixture_data

from a2a_tune.tuner.runtime import lookup as lk
from a2a_tune.tuner.runtime.lookup import (
    FALLBACK_BACKEND,
    Choice,
    ProfileError,
    clear_cache,
    find_profile,
    load_profile,
    lookup,
    profile_filename,
    profile_search_paths,
)

FIXTURES = FIXTURE.parent
A = dict(ep_size=2, hidden=7168, topk=8, num_experts=256, dtype="bf16", routing="uniform")
B = dict(ep_size=2, hidden=4096, topk=6, num_experts=64, dtype="bf16", routing="uniform")


@pytest.fixture(autouse=True)
def clean(monkeypatch, caplog):
    clear_cache()
    monkeypatch.delenv("A2A_TUNE_PROFILE_DIR", raising=False)
    monkeypatch.delenv("A2A_TUNE_FINGERPRINT", raising=False)
    caplog.set_level(logging.WARNING, logger="a2a_tune")
    yield
    clear_cache()


@pytest.fixture
def fixture_dir(monkeypatch):
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", str(FIXTURES))
    return FIXTURES


def warnings_of(caplog):
    return [r for r in caplog.records if r.name == "a2a_tune" and r.levelno == logging.WARNING]


def write(dirpath: Path, data, name: str = f"{FP}.json") -> Path:
    p = dirpath / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return p


# ----------------------------------------------------------------------- exact shape


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


def test_engine_literals_come_from_the_profile(tmp_path, monkeypatch):
    c = lookup(profile=FIXTURE, tokens=1, **B)
    assert (c.backend, c.vllm_name, c.sglang_name) == ("allgather_reducescatter", "allgather_reducescatter", None)
    c = lookup(profile=FIXTURE, tokens=1024, **B)
    assert (c.backend, c.vllm_name, c.sglang_name) == ("nccl_all2allv", None, None)

    data = fixture_data()
    data["backends"]["nccl_all2allv"] = {"vllm_name": "deepep_high_throughput", "sglang_name": "deepep"}
    c = lookup(profile=write(tmp_path, data), tokens=1024, **B)
    assert (c.vllm_name, c.sglang_name) == ("deepep_high_throughput", "deepep")


def test_engine_restricts_to_backends_it_can_name(tmp_path, caplog):
    # nvlink_one_sided wins shape A at 64 tokens but vLLM has no literal for it.
    assert lookup(profile=FIXTURE, tokens=64, **A).backend == "nvlink_one_sided"
    c = lookup(profile=FIXTURE, tokens=64, engine="vllm", **A)
    assert (c.backend, c.vllm_name, c.match) == ("allgather_reducescatter", "allgather_reducescatter", "exact")
    assert set(c.expected_us) == {"allgather_reducescatter"}

    data = fixture_data()
    data["backends"]["nccl_all2allv"]["vllm_name"] = "deepep_high_throughput"
    c = lookup(profile=write(tmp_path, data), tokens=64, engine="vllm", **A)
    assert (c.backend, c.vllm_name) == ("nccl_all2allv", "deepep_high_throughput")

    # A literal the engine does not accept (a typo, or one from a newer engine) never
    # competes for that engine: `--format vllm` can only print what vLLM accepts.
    for bogus in ("deepep_lowlatency", "pplx", "naive"):
        data["backends"]["nccl_all2allv"]["vllm_name"] = bogus
        clear_cache()
        c = lookup(profile=write(tmp_path, data), tokens=64, engine="vllm", **A)
        assert c.backend == "allgather_reducescatter", bogus

    # SGLang has a literal for none of the competing backends in the fixture.
    c = lookup(profile=FIXTURE, tokens=64, engine="sglang", **A)
    assert c.match == "fallback" and "no usable backend with a sglang name" in c.reason
    c = lookup(profile=FIXTURE, tokens=64, engine="tgi", **A)
    assert c.match == "fallback" and "engine='tgi'" in c.reason
    assert len(warnings_of(caplog)) == 2


def test_trtllm_gets_the_fastest_method_it_has_and_its_rule_for_uneven_experts(tmp_path):
    # Shape A at 64 tokens: nvlink_one_sided 50 us (no TensorRT-LLM method), nccl_all2allv 75,
    # allgather_reducescatter 100. As for vLLM, the fastest backend TensorRT-LLM can be told wins.
    data = fixture_data()
    data["backends"]["allgather_reducescatter"]["trtllm_name"] = "ALLGATHER"
    data["backends"]["nccl_all2allv"]["trtllm_name"] = "NVLINK_TWO_SIDED"
    path = write(tmp_path, data)
    c = lookup(profile=path, tokens=64, engine="trtllm", **A)
    assert (c.backend, c.trtllm_name, c.match) == ("nccl_all2allv", "NVLINK_TWO_SIDED", "exact")
    assert set(c.expected_us) == {"allgather_reducescatter", "nccl_all2allv"}
    assert lookup(profile=path, tokens=64, **A).backend == "nvlink_one_sided"  # without an engine: untouched
    # Experts that do not divide over the ranks: TensorRT-LLM refuses a forced NVLINK_TWO_SIDED.
    even = dict(A, num_experts=A["num_experts"] + 2)  # 258 over 2 ranks: even, answered by A's entry
    assert lookup(profile=path, tokens=64, engine="trtllm", **even).backend == "nccl_all2allv"
    c = lookup(profile=path, tokens=64, engine="trtllm", **dict(A, num_experts=A["num_experts"] + 1))
    assert (c.backend, c.trtllm_name, c.match) == ("allgather_reducescatter", "ALLGATHER", "nearest-shape")


def test_engine_options_are_part_of_what_an_engine_accepts(tmp_path):
    # SGLang runs both DeepEP kernels under one literal; the mode tells them apart.
    data = fixture_data()
    data["backends"]["nccl_all2allv"].update(
        sglang_name="deepep", engine_options={"sglang": ["--deepep-mode", "normal"]}
    )
    c = lookup(profile=write(tmp_path, data), tokens=64, engine="sglang", **A)
    assert (c.backend, c.sglang_name, c.engine_options["sglang"]) == (
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


# ---------------------------------------------------------------------- nearest shape


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
    assert (c.backend, c.match, c.vllm_name) == (FALLBACK_BACKEND, "fallback", FALLBACK_BACKEND)
    (rec,) = warnings_of(caplog)
    msg = rec.getMessage()
    assert str(FIXTURE) in msg and "no entry for ep_size=" in msg and "table has ep_size=2/dtype=bf16" in msg
    # Asking again does not warn again.
    lookup(fingerprint=FP, tokens=64, **{**A, **change})
    assert len(warnings_of(caplog)) == 1


# ---------------------------------------------------------------------- search paths


def test_profile_filename_is_the_shared_key():
    assert profile_filename("h200-sxm.nvl18x2.node1") == "h200-sxm.nvl18x2.node1.json"
    assert profile_filename("H200.NVL18x2.Node1") == "h200.nvl18x2.node1.json"
    for bad in ["", "../etc/passwd", "a b", ".hidden", "a/b", "x" * 201, None]:
        with pytest.raises(ValueError):
            profile_filename(bad)


def test_search_paths_env_dirs_first_then_user_then_packaged(monkeypatch, tmp_path):
    import importlib.resources

    packaged = Path(os.fspath(importlib.resources.files("a2a_tune.profiles")))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    user = tmp_path / "xdg" / "a2a-tune" / "profiles"
    assert profile_search_paths() == [user, packaged]
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", os.pathsep.join([str(tmp_path / "a"), "", str(tmp_path / "b")]))
    assert profile_search_paths() == [tmp_path / "a", tmp_path / "b", user, packaged]


def _variant(backend_fast: str) -> dict:
    """The fixture with one backend made fastest everywhere in shape B."""
    data = fixture_data()
    data["entries"][0]["backends"][backend_fast].update(median_us=[1.0] * 3, p10_us=[1.0] * 3, p90_us=[1.0] * 3)
    data["entries"][0]["winners"] = []
    return data


def test_env_dir_beats_packaged_and_earlier_env_dir_wins(monkeypatch, tmp_path):
    pkg, env1, env2 = (tmp_path / n for n in ("pkg", "env1", "env2"))
    for d in (pkg, env1, env2):
        d.mkdir()
    write(pkg, _variant("allgather_reducescatter"))
    write(env2, _variant("nccl_all2allv"))
    monkeypatch.setattr(lk, "_packaged_dir", lambda: str(pkg))

    assert lookup(fingerprint=FP, tokens=1024, **B).source == str(pkg / f"{FP}.json")
    assert lookup(fingerprint=FP, tokens=1024, **B).backend == "allgather_reducescatter"

    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", os.pathsep.join([str(env1), str(env2)]))
    c = lookup(fingerprint=FP, tokens=1024, **B)
    assert (c.source, c.backend) == (str(env2 / f"{FP}.json"), "nccl_all2allv")  # env1 has none

    write(env1, _variant("allgather_reducescatter"))
    assert lookup(fingerprint=FP, tokens=1024, **B).source == str(env1 / f"{FP}.json")
    assert find_profile(FP) == env1 / f"{FP}.json"


def test_missing_profile_warns_once_listing_every_path(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", os.pathsep.join([str(tmp_path / "a"), str(tmp_path / "b")]))
    for _ in range(3):
        c = lookup(fingerprint="no.such.machine", tokens=8, **A)
        assert (c.backend, c.match, c.source) == (FALLBACK_BACKEND, "fallback", None)
    assert find_profile("no.such.machine") is None
    (rec,) = warnings_of(caplog)
    msg = rec.getMessage()
    for d in profile_search_paths():
        assert str(d / "no.such.machine.json") in msg
    assert "no profile for fingerprint 'no.such.machine'" in msg and FALLBACK_BACKEND in msg
    assert "\n" not in msg


def test_fingerprint_from_env_then_probe(monkeypatch, fixture_dir, caplog):
    monkeypatch.setenv("A2A_TUNE_FINGERPRINT", FP)
    assert lookup(tokens=64, **A).match == "exact"

    monkeypatch.delenv("A2A_TUNE_FINGERPRINT")
    calls = []
    fake = types.ModuleType("a2a_tune.tuner.probe")
    fake.probe = lambda **kw: calls.append(kw) or types.SimpleNamespace(fingerprint=FP)
    monkeypatch.setitem(sys.modules, "a2a_tune.tuner.probe", fake)
    assert lookup(tokens=64, **A).match == "exact"
    assert lookup(tokens=8, **A).match == "exact"
    assert len(calls) == 1 and calls[0]["strict"]  # probed once, a failure reported as such
    assert 0 < calls[0]["timeout_s"] <= 10  # a hung NVML delays start-up by seconds, not a minute
    assert warnings_of(caplog) == []


def test_probe_failure_falls_back_with_one_warning(monkeypatch, caplog):
    fake = types.ModuleType("a2a_tune.tuner.probe")

    def probe(**kwargs):
        raise RuntimeError("NVML Shared Library Not Found")

    fake.probe = probe
    monkeypatch.setitem(sys.modules, "a2a_tune.tuner.probe", fake)
    for _ in range(2):
        c = lookup(tokens=64, **A)
        assert (c.backend, c.match) == (FALLBACK_BACKEND, "fallback")
    (rec,) = warnings_of(caplog)
    assert "hardware probe failed (RuntimeError: NVML Shared Library Not Found)" in rec.getMessage()


def test_explicit_profile_checks_fingerprint_only_when_given(caplog):
    assert lookup(profile=str(FIXTURE), tokens=64, **A).match == "exact"
    assert lookup(profile=FIXTURE, fingerprint=FP, tokens=64, **A).match == "exact"
    c = lookup(profile=FIXTURE, fingerprint="other.machine", tokens=64, **A)
    assert c.match == "fallback"
    (rec,) = warnings_of(caplog)
    assert "profile is for 'test.fixture.node1', this machine is 'other.machine'" in rec.getMessage()


# ------------------------------------------------------------------------ bad tables


@pytest.mark.parametrize("case", sorted(BAD_TABLES))
def test_bad_table_falls_back_with_exactly_one_warning(case, tmp_path, monkeypatch, caplog):
    make, problem = BAD_TABLES[case]
    content = make()
    path = tmp_path / f"{FP}.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", str(tmp_path))

    for tokens in (64, 64, 200):  # repeated and different requests: still one warning
        c = lookup(fingerprint=FP, tokens=tokens, **A)
        assert (c.backend, c.vllm_name, c.match) == (FALLBACK_BACKEND, FALLBACK_BACKEND, "fallback")
        assert c.expected_us == {} and c.entry_shape is None
    recs = warnings_of(caplog)
    assert len(recs) == 1, [r.getMessage() for r in recs]
    msg = recs[0].getMessage()
    assert str(path) in msg and problem in msg and FALLBACK_BACKEND in msg
    assert "\n" not in msg
    assert problem in c.reason


def test_load_profile_raises_one_line_error_naming_the_field(tmp_path):
    data = fixture_data()
    data["entries"][1]["backends"]["nccl_all2allv"]["median_us"][2] = -1
    p = write(tmp_path, data)
    with pytest.raises(ProfileError) as info:
        load_profile(p)
    assert info.value.field == "entries[1].backends.nccl_all2allv.median_us[2]"
    assert str(info.value) == f"{p}: entries[1].backends.nccl_all2allv.median_us[2]: not a positive finite number"


def test_unreadable_file_chmod_000(tmp_path, monkeypatch, caplog):
    p = write(tmp_path, FIXTURE.read_text())
    p.chmod(0)
    try:
        if os.access(p, os.R_OK):
            pytest.skip("running as root: chmod 000 does not make the file unreadable")
        monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", str(tmp_path))
        c = lookup(fingerprint=FP, tokens=64, **A)
        assert (c.backend, c.match) == (FALLBACK_BACKEND, "fallback")
        (rec,) = warnings_of(caplog)
        assert str(p) in rec.getMessage() and "cannot read" in rec.getMessage()
    finally:
        p.chmod(0o644)


def test_unreadable_file_open_fails(tmp_path, monkeypatch, caplog):
    """Same as chmod 000, but also runs as root: opening raises PermissionError."""
    p = write(tmp_path, FIXTURE.read_text())

    def denying(real):
        def deny(file, *a, **k):
            if os.fspath(file) == str(p):
                raise PermissionError(13, "Permission denied", str(p))
            return real(file, *a, **k)

        return deny

    monkeypatch.setattr(builtins, "open", denying(builtins.open))
    monkeypatch.setattr(os, "open", denying(os.open))
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", str(tmp_path))
    c = lookup(fingerprint=FP, tokens=64, **A)
    assert (c.backend, c.match) == (FALLBACK_BACKEND, "fallback")
    (rec,) = warnings_of(caplog)
    assert f"{p}: cannot read: Permission denied" in rec.getMessage()


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


def test_distinct_problems_each_warn_once(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", str(tmp_path))
    lookup(fingerprint="machine.one", tokens=1, **A)
    lookup(fingerprint="machine.two", tokens=1, **A)
    lookup(fingerprint="machine.one", tokens=1, **A)
    assert len(warnings_of(caplog)) == 2


# ------------------------------------------------------------------ cost at start-up


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
    # How fast: bench/startup.py measures it (BENCHMARKS.md); a unit test does not time.


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
    data = _variant("allgather_reducescatter")
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


# ------------------------------------------------------------------ schema versions

SCHEMA1 = FIXTURES / "schema1" / f"{FP}.json"


def test_schema1_table_is_converted_on_load(caplog):
    prof = load_profile(SCHEMA1)
    assert prof.schema == 1 and prof.fingerprint == FP
    assert prof.tie_preference[0] == "allgather_reducescatter"
    a = prof.by_shape[lk.Shape(**A)]
    assert set(a.timing.values()) == {"eager"}  # schema 1: the run's one timing mode
    assert a.p90_us["nccl_all2allv"][0] == pytest.approx(49.5)  # its p10/p90 are used

    c = lookup(profile=SCHEMA1, fingerprint=FP, tokens=64, **A)
    assert (c.backend, c.match, c.hardware_match) == ("nvlink_one_sided", "exact", "exact")
    assert dict(c.expected_us) == {"allgather_reducescatter": 100.0, "nccl_all2allv": 75.0, "nvlink_one_sided": 50.0}
    assert warnings_of(caplog) == []


def test_schema1_graph_timing_is_read_per_backend(tmp_path):
    data = json.loads(SCHEMA1.read_text())
    data["run"]["timing"] = "cuda_graph"
    prof = load_profile(write(tmp_path, data))
    assert set(prof.entries[0].timing.values()) == {"graph"}


def test_packaged_table_loads_and_answers():
    import importlib.resources

    packaged = Path(os.fspath(importlib.resources.files("a2a_tune.profiles")))
    for p in packaged.glob("*.json"):
        if p.name.startswith("schema-"):
            continue
        prof = load_profile(p)
        e = prof.entries[0]
        c = lookup(fingerprint=prof.fingerprint, tokens=e.tokens[0], **e.shape._asdict())
        assert c.match == "exact" and c.source == str(p), c.reason


# ------------------------------------------------------------------- phases / regret


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
        assert (c.backend, c.vllm_name) == ("allgather_reducescatter", "allgather_reducescatter")
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


# --------------------------------------------------------- hardware fallback levels


def _as_machine(tmp_path, fingerprint: str) -> Path:
    data = fixture_data()
    data["hardware"]["fingerprint"] = fingerprint
    return write(tmp_path, data, f"{fingerprint}.json")


def test_same_gpus_and_nvlink_domain_on_more_nodes_borrow_the_table(tmp_path, monkeypatch, caplog):
    _as_machine(tmp_path, "h200.nvl18x2.node1")
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", str(tmp_path))
    exact = lookup(fingerprint="h200.nvl18x2.node1", tokens=64, **A)
    assert (exact.hardware_match, exact.match, exact.backend) == ("exact", "exact", "nvlink_one_sided")

    borrowed = lookup(fingerprint="h200.nvl18x2.nodes2", tokens=64, **A)
    assert (borrowed.hardware_match, borrowed.match, borrowed.backend) == (
        "same-gpu-domain",
        "exact",
        "nvlink_one_sided",
    )
    assert borrowed.profile_fingerprint == "h200.nvl18x2.node1"
    assert "(measured on h200.nvl18x2.node1: same GPUs and NVLink domain as h200.nvl18x2.nodes2)" in borrowed.reason
    # EP across the two nodes: the one-node table has no such entry -> engine default.
    wide = lookup(fingerprint="h200.nvl18x2.nodes2", tokens=64, **{**A, "ep_size": 4})
    assert (wide.match, wide.hardware_match) == ("fallback", "same-gpu-domain")
    assert warnings_of(caplog)[0].getMessage().count("no entry for ep_size=4") == 1


@pytest.mark.parametrize(
    "machine",
    [
        "h200.nvl18x2-degraded.nodes2",  # a dead link never borrows a healthy table
        "h200.nvl18x4.node1",  # another NVLink domain size
        "h200.nvl12x2.node1",  # other links per GPU
        "h100-sxm.nvl18x2.node1",  # another GPU model
        "cpu-x86_64.nodes2",  # no NVLink domain at all
    ],
)
def test_other_hardware_falls_back_to_the_engine_default(machine, tmp_path, monkeypatch, caplog):
    _as_machine(tmp_path, "h200.nvl18x2.node1")
    _as_machine(tmp_path, "cpu-x86_64.node1")
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", str(tmp_path))
    c = lookup(fingerprint=machine, tokens=64, **A)
    assert (c.backend, c.match, c.hardware_match) == (FALLBACK_BACKEND, "fallback", "engine-default")
    (rec,) = warnings_of(caplog)
    assert f"no profile for fingerprint {machine!r}" in rec.getMessage()


def test_same_domain_prefers_closest_node_count_and_search_order(tmp_path, monkeypatch):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    _as_machine(second, "h200.nvl18x2.nodes4")
    _as_machine(first, "h200.nvl18x2.node1")
    _as_machine(first, "h200.nvl18x2.nodes8")
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", os.pathsep.join([str(first), str(second)]))
    c = lookup(fingerprint="h200.nvl18x2.nodes4", tokens=64, **A)
    assert (c.hardware_match, c.source) == ("exact", str(second / "h200.nvl18x2.nodes4.json"))
    c = lookup(fingerprint="h200.nvl18x2.nodes6", tokens=64, **A)
    # The first directory with a candidate wins; in it the closest node count (8 vs 1).
    assert (c.hardware_match, c.source) == ("same-gpu-domain", str(first / "h200.nvl18x2.nodes8.json"))
    # A new table in a searched directory is seen (directories are re-listed when they change).
    _as_machine(first, "h200.nvl18x2.nodes6")
    os.utime(first, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    assert lookup(fingerprint="h200.nvl18x2.nodes6", tokens=64, **A).hardware_match == "exact"


def test_explicit_profile_of_the_same_domain_is_accepted_and_named(tmp_path):
    p = _as_machine(tmp_path, "h200.nvl18x2.node1")
    c = lookup(profile=p, fingerprint="h200.nvl18x2.nodes2", tokens=64, **A)
    assert (c.hardware_match, c.backend) == ("same-gpu-domain", "nvlink_one_sided")
    assert lookup(profile=p, tokens=64, **A).hardware_match == "unchecked"


def test_fingerprints_with_plus_are_valid_keys():
    # The probe joins GPU models / island shapes with '+': such machines must have tables too.
    assert profile_filename("h100-sxm+l40s.nvl18x4+pciex2.node1") == "h100-sxm+l40s.nvl18x4+pciex2.node1.json"
    from a2a_tune.tuner.runtime.fingerprint import domain_key

    assert domain_key("h100-sxm+l40s.nvl18x4+pciex2.node1") == ("h100-sxm+l40s", "nvl18x4+pciex2")
    assert domain_key("l40s.pciex4.node1") is None  # no NVLink domain
    assert domain_key("cpu-x86_64.node1") is None
    assert domain_key("gb200.mnnvl18x16.nodes4") == ("gb200", "mnnvl18x16")


def test_a_file_named_for_this_machine_with_a_sibling_table_inside_is_refused(tmp_path, monkeypatch, caplog):
    # h200.nvl18x2.nodes2.json holding the node1 table: a mislabelled file, not a borrowed table.
    data = fixture_data()
    data["hardware"]["fingerprint"] = "h200.nvl18x2.node1"
    write(tmp_path, data, "h200.nvl18x2.nodes2.json")
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", str(tmp_path))
    c = lookup(fingerprint="h200.nvl18x2.nodes2", tokens=64, **A)
    assert (
        c.match == "fallback"
        and "profile is for 'h200.nvl18x2.node1', this machine is 'h200.nvl18x2.nodes2'" in c.reason
    )


def test_engine_literal_table():
    from a2a_tune.tuner.runtime import engines

    assert engines.accepts("vllm", "allgather_reducescatter") and engines.accepts("vllm", "flashinfer_nvlink_one_sided")
    for bogus in ("pplx", "naive", "flashinfer_all2allv", None, "", "deepep"):
        assert not engines.accepts("vllm", bogus)
    assert engines.accepts("vllm", "moonep") and not engines.accepts("vllm", "passthrough")  # vLLM binds that itself
    assert engines.accepts("sglang", "deepep") and not engines.accepts("sglang", "deepep_low_latency")
    assert engines.accepts("sglang", "deepep", ("--deepep-mode", "low_latency"))
    assert not engines.accepts("sglang", "deepep", ("--deepep-mode",))
    assert not engines.accepts("sglang", "deepep", ("--moe-runner-backend", "triton"))  # not an option we know
    assert engines.accepts("trtllm", "DEEPEPLOWLATENCY") and not engines.accepts("trtllm", "deepep_low_latency")
    assert engines.accepts("trtllm", "DEEPEP", num_experts=256, ep_size=8)
    assert not engines.accepts("trtllm", "DEEPEP", num_experts=257, ep_size=8)
    assert engines.accepts("trtllm", "ALLGATHER", num_experts=257, ep_size=8)
    assert engines.engine_flag("vllm", "pplx") == "--all2all-backend allgather_reducescatter"
    assert engines.engine_flag("sglang", None) == "--moe-a2a-backend none"
    assert engines.engine_flag("sglang", "deepep", ("--deepep-mode", "normal")) == (
        "--moe-a2a-backend deepep --deepep-mode normal"
    )
    assert engines.engine_flag("trtllm", "NVLINK_ONE_SIDED") == "TRTLLM_FORCE_COMM_METHOD=NVLINK_ONE_SIDED"
    assert engines.engine_flag("trtllm", None) == ""  # TensorRT-LLM keeps its own choice
    assert engines.env_lines("x y", None, "deepep", "exact")[0] == "export A2A_TUNE_BACKEND='x y'"
    assert set(engines.VERSIONS) == set(engines.ENGINES) == set(engines.DEFAULT)


def test_loading_restores_the_garbage_collector(tmp_path):
    import gc

    assert gc.isenabled()
    load_profile(FIXTURE)
    with pytest.raises(ProfileError):
        load_profile(write(tmp_path, "{not json"))
    assert gc.isenabled()
    gc.disable()
    try:
        clear_cache()
        load_profile(FIXTURE)
        assert not gc.isenabled()  # an engine that runs without the GC keeps it off
    finally:
        gc.enable()


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
